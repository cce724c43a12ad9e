"""The one JSON text form of the project: compact, UTF-8, with pre-serialized parts spliced in.

Stored payloads are written in exactly this form, so an event's stored
payload text can be spliced into a response unchanged. `RawJson` carries
text that is already JSON (a runner event's payload, a history message) so
that large documents are serialized once on their way from the runner to
the store and the wire, not once per hop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class RawJson:
    """Text that is already one JSON value, in this module's form."""

    text: str


def dump(value: Any) -> str:
    """Compact JSON; a `RawJson` value, or one directly inside a dict or list, goes in verbatim."""
    if isinstance(value, RawJson):
        return value.text
    if isinstance(value, dict) and any(isinstance(item, RawJson) for item in value.values()):
        return "{" + ",".join(f"{_encoder.encode(key)}:{dump(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list) and any(isinstance(item, RawJson) for item in value):
        return "[" + ",".join(dump(item) for item in value) + "]"
    return _encoder.encode(value)


def load(text: str | None) -> Any:
    return None if text is None else json.loads(text)
