"""serde's wording for values that did not fit (SERVER-SPEC §17 O-2).

The reference server deserializes with serde; error texts that embed its
messages (`invalid type: string "x", expected u64`) are built from here.
"""

from __future__ import annotations

import json
from typing import Any

from bae.common.errors import echo


def describe(value: Any) -> str:
    """How serde names a found value: integer `5`, string "x", sequence, map, …"""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{echo(str(value))}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f"string {json.dumps(echo(value), ensure_ascii=False)}"
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__  # TOML dates and times


def invalid_type(value: Any, expected: str) -> str:
    return f"invalid type: {describe(value)}, expected {expected}"
