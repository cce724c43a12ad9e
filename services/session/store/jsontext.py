"""The one JSON text form used for stored documents and wire bodies.

Stored payloads are written in exactly this form, so an event's stored
payload text can be spliced into a response unchanged (see events.event_json).
"""

from __future__ import annotations

import json
from typing import Any

_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def dump(value: Any) -> str:
    return _encoder.encode(value)


def load(text: str | None) -> Any:
    return None if text is None else json.loads(text)
