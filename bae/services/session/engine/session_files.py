"""A session as NDJSON (bae.common.session_export): written out for an export or an archive, read
back for an import, and a session deleted with everything it owns.

The export reads the log a page at a time and hands its text on in pieces of about PIECE_CHARS,
so neither a long session nor a large event is ever held whole. An import is read whole (it is
bounded), checked line by line, and written in one transaction: all of it, or nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from bae.common import telemetry
from bae.common.errors import InvalidInput
from bae.common.jsontext import dump, load
from bae.common.session_export import FORMAT, MAX_IMPORT_BYTES, PIECE_CHARS
from bae.common.timefmt import format_time, now
from bae.services.session.store import events, retention
from bae.services.session.store.events import ImportedEvent, UnreadableEvent
from bae.services.session.store.store import Store

# Events read per store call while exporting (and at most PAGE_CHARS of payload).
PAGE_EVENTS = 500
PAGE_CHARS = 4 * 1024 * 1024
# Events deleted per transaction: a long session never holds the store's writer for long.
DELETE_STEP = 500

SESSIONS_DELETED = "bae.retention.sessions.deleted"
BYTES_DELETED = "bae.retention.bytes.deleted"


async def export_text(store: Store, session_id: str) -> AsyncIterator[str] | None:
    """The session's NDJSON in pieces, or None when there is no such session."""
    head = await store.read(retention.export_head, session_id)
    if head is None:
        return None
    return _pieces(store, session_id, dump({"bae_export": FORMAT, **head}) + "\n")


async def _pieces(store: Store, session_id: str, first_line: str) -> AsyncIterator[str]:
    buffer = [first_line]
    size = len(first_line)
    after = 0
    while True:
        rows = await store.read(events.page, session_id, after, PAGE_EVENTS, PAGE_CHARS)
        for row in rows:
            line = events.event_json(row) + "\n"
            if size + len(line) > PIECE_CHARS and buffer:
                yield "".join(buffer)
                buffer, size = [], 0
            for start in range(0, len(line), PIECE_CHARS):  # a large event in pieces of its own
                buffer.append(line[start:start + PIECE_CHARS])
                size += len(buffer[-1])
                if size >= PIECE_CHARS:
                    yield "".join(buffer)
                    buffer, size = [], 0
        if not rows:
            break
        after = rows[-1].seq
    if buffer:
        yield "".join(buffer)


@dataclass(frozen=True)
class Import:
    session: dict[str, Any]
    usage: list[dict[str, Any]]
    events: list[ImportedEvent]


class ImportReader:
    """Reads an import's lines as they come (numbered from 1; blank lines are skipped)."""

    def __init__(self) -> None:
        self.number = 0
        self.size = 0
        self.head: tuple[dict[str, Any], list[dict[str, Any]]] | None = None
        self.events: list[ImportedEvent] = []
        self._ids: set[str] = set()

    def _refuse(self, why: str) -> InvalidInput:
        return InvalidInput(f"line {self.number}: {why}")

    def add(self, line: str) -> None:
        self.number += 1
        self.size += len(line) + 1
        if self.size > MAX_IMPORT_BYTES:
            raise InvalidInput(f"line {self.number}: the import exceeds {MAX_IMPORT_BYTES} bytes")
        if not line.strip():
            return
        if self.head is None:
            self.head = self._head(line)
            return
        try:
            event = events.imported_event(line, self.head[0]["id"])
        except UnreadableEvent as exc:
            raise self._refuse(f"not an event as exported: {exc}") from None
        if event.id in self._ids:
            raise self._refuse(f"event id {event.id} appears twice")
        self._ids.add(event.id)
        self.events.append(event)

    def finish(self) -> Import:
        if self.head is None:
            raise InvalidInput("the import is empty: expected the session line, then its events")
        session, usage = self.head
        if session["state"] == "open":  # an import is a record: it comes back closed
            session = {**session, "state": "closed", "closed_at": session["closed_at"] or now()}
        return Import(session, usage, self.events)

    def _head(self, line: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        try:
            head = load(line)
        except ValueError as exc:
            raise self._refuse(f"not JSON ({exc})") from None
        if not isinstance(head, dict) or head.get("bae_export") != FORMAT:
            raise self._refuse(f'expected the session line, {{"bae_export":{FORMAT},"session":{{…}},"usage":[…]}}')
        session, usage = head.get("session"), head.get("usage", [])
        if not isinstance(session, dict):
            raise self._refuse("`session` must be an object")
        return self._session(session), self._usage(usage)

    def _session(self, session: dict[str, Any]) -> dict[str, Any]:
        for key in ("id", "client_key_id", "profile_id", "created_at"):
            bound = events.STAMP_CHARS if key == "created_at" else events.ID_CHARS
            if not isinstance(session.get(key), str) or not session[key] or len(session[key]) > bound:
                raise self._refuse(f"session.{key} must be a string of 1 to {bound} characters")
        if session.get("state") not in ("open", "closed", "error"):
            raise self._refuse("session.state must be open, closed or error")
        for key in ("client_version", "closed_at"):
            if session.get(key) is not None and not isinstance(session[key], str):
                raise self._refuse(f"session.{key} must be a string or null")
        for key in ("client_tools", "sandbox_tools", "subagent_tools"):
            if not isinstance(session.get(key), dict):
                raise self._refuse(f"session.{key} must be an object (tools by client key id)")
        if session.get("compaction") is not None and not isinstance(session["compaction"], dict):
            raise self._refuse("session.compaction must be an object or null")
        return {key: session.get(key) for key in retention.SESSION_FIELDS}

    def _usage(self, usage: Any) -> list[dict[str, Any]]:
        if not isinstance(usage, list):
            raise self._refuse("`usage` must be an array")
        rows = []
        for index, row in enumerate(usage):
            if not isinstance(row, dict):
                raise self._refuse(f"usage[{index}] must be an object")
            for key in retention.USAGE_FIELDS:
                value = row.get(key)
                if key in ("day", "client_key_id", "profile_id"):
                    ok = isinstance(value, str) and 0 < len(value) <= events.ID_CHARS
                else:
                    ok = (value is None and key == "cost_nanousd") or (
                        isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63)
                if not ok:
                    raise self._refuse(f"usage[{index}].{key} is missing or not a valid value")
            rows.append({key: row[key] for key in retention.USAGE_FIELDS})
        return rows


@dataclass(frozen=True)
class Deleted:
    events: int
    bytes: int


async def delete_session(store: Store, session_id: str, trigger: str) -> Deleted | None:
    """Delete an ended session in steps of DELETE_STEP events; None: no such session. Raises
    Conflict (session_open) for an open one. `trigger` ("admin") labels the metrics."""
    total_events = total_bytes = 0
    while True:
        step = await store.write(retention.delete_some, session_id, DELETE_STEP)
        if step is None:
            return None if not total_events else Deleted(total_events, total_bytes)
        total_events += step.events
        total_bytes += step.bytes
        if step.done:
            count_deleted(total_bytes, trigger)
            return Deleted(total_events, total_bytes)


def count_deleted(size: int, trigger: str) -> None:
    attributes = {"trigger": trigger}
    telemetry.add(SESSIONS_DELETED, 1, attributes)
    telemetry.add(BYTES_DELETED, size, attributes)


def cutoff(days: float, at: float) -> str:
    """The time `days` before the epoch time `at`, in the store's form (timefmt)."""
    return format_time(datetime.fromtimestamp(at - days * 86400, timezone.utc))
