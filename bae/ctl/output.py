"""baectl's stdout: `--json` documents, the fixed record layouts and the tables (BAECTL.md §4)."""

from __future__ import annotations

import json
from typing import Any

MISSING = "-"
NONE = "(none)"


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def text(value: Any) -> str:
    """A field that is missing or not a string prints as `-`."""
    return value if isinstance(value, str) else MISSING


def joined(value: Any) -> str:
    """List fields are joined with ", "; an empty or missing list prints `(none)`."""
    if not isinstance(value, list) or not value:
        return NONE
    return ", ".join(item if isinstance(item, str) else json.dumps(item) for item in value)


def labelled(item: dict[str, Any], labels: list[str], width: int, indent: str = "") -> list[str]:
    # A label as long as the column still gets one space before its value.
    return [f"{indent}{(label + ':').ljust(max(width, len(label) + 2))}{text(item.get(label))}" for label in labels]


def created(kind: str, item: dict[str, Any], labels: list[str]) -> str:
    """`create profile` / `create key`: values start at column 15."""
    return "\n".join([f"created {kind}", *labelled(item, labels, 12, "  ")])


def profile(item: dict[str, Any]) -> str:
    """`get`/`update profile`: padded labels put values at column 19; list lines are plain."""
    lines = labelled(item, ["id", "name", "primary_provider"], 18)
    lines += [f"{label}: {joined(item.get(label))}"
              for label in ("fallback_providers", "mcp_servers", "allowed_tools")]
    limits = item.get("limits")
    if isinstance(limits, dict) and limits:  # shown only when the profile overrides a [limits] default
        lines.append("limits: " + ", ".join(f"{key}={value}" for key, value in limits.items()))
    lines += labelled(item, ["created_at", "updated_at"], 18)
    return "\n".join(lines)


def cell(value: Any, width: int | None) -> str:
    if isinstance(value, list):
        shown = ", ".join(str(item) for item in value) or NONE
    elif isinstance(value, dict):
        shown = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    elif value is None:
        shown = MISSING
    else:
        shown = str(value)
    return shown if width is None or len(shown) <= width else shown[: width - 1] + "…"


def table(items: list[dict[str, Any]], columns: list[tuple[str, str]], widths: dict[str, int] | None = None) -> str:
    """A header row, then one row per item; columns as wide as their widest cell, two spaces apart."""
    rows = [[title for title, _ in columns]]
    rows += [[cell(item.get(field) if isinstance(item, dict) else None, (widths or {}).get(field))
              for _, field in columns] for item in items]
    sizes = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(size) for c, size in zip(row, sizes)).rstrip() for row in rows)
