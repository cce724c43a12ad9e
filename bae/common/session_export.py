"""The NDJSON form of an exported session (GET /admin/v1/sessions/{id}/export, POST /admin/v1/sessions/import).

Line 1 is the session line: `{"bae_export": FORMAT, "session": {...}, "usage": [...]}` (the session
row, everything needed to recreate it, and its usage totals). Each line after it is one event,
exactly its wire text as `GET .../events` shows it, in the session's order.
"""

from __future__ import annotations

# The version of the session line's shape; an import refuses any other.
FORMAT = 1
# An import's body and each of its lines, bounded: the session service holds an import in memory
# until it is written in one transaction, and a line crosses the internal plane in one message.
MAX_IMPORT_BYTES = 256 * 1024 * 1024
MAX_LINE_BYTES = 32 * 1024 * 1024
# Export and import send their text in messages of about this size.
PIECE_CHARS = 1024 * 1024
