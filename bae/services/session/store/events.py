"""The append-only session event log and its one wire shape (EventView, SERVER-SPEC §13.1)."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection, Result, Row, Select, and_, bindparam, delete, func, insert, or_, select,
    update,
)
from sqlalchemy.exc import IntegrityError

from bae.common.errors import Unavailable
from bae.common.ids import new_id
from bae.common.timefmt import now
from bae.common.jsontext import RawJson, dump, load
from bae.common.webhooks import matches
from bae.services.session.store import requests
from bae.services.session.store.locks import hold_session
from bae.services.session.store.requests import Last, PreviousRequests, Texts
from bae.services.session.store.schema import session_events, sessions, utf8_bytes, webhook_outbox, webhooks

MESSAGE_EVENT_TYPES = ("client.message.send", "server.message.send", "session.compaction.completed")

_EVENT_COLUMNS = (
    session_events.c.seq,
    session_events.c.id,
    session_events.c.session_id,
    session_events.c.client_key_id,
    session_events.c.event_type,
    session_events.c.payload,
    session_events.c.created_at,
)


class StoredEvent(NamedTuple):
    """A provider request stored by reference, as it was appended (its messages spliced back in);
    the attributes of a row of _EVENT_COLUMNS."""

    seq: int
    id: str
    session_id: str
    client_key_id: str | None
    event_type: str
    payload: str
    created_at: str


# A stored event as read: the row itself, or a StoredEvent for a request whose messages were spliced back.
EventRow = Row[Any] | StoredEvent


_PAGE = (
    select(*_EVENT_COLUMNS, session_events.c.messages_at, session_events.c.messages_runs)
    .where(
        and_(
            session_events.c.session_id == bindparam("session_id"),
            session_events.c.seq > bindparam("after"),
        )
    )
    .order_by(session_events.c.seq)
    .limit(bindparam("limit"))
)
_RUNS = len(_EVENT_COLUMNS) + 1  # messages_runs in a row of _PAGE
_MESSAGES = (
    select(*_EVENT_COLUMNS)
    .where(
        and_(
            session_events.c.session_id == bindparam("session_id"),
            session_events.c.event_type.in_(MESSAGE_EVENT_TYPES),
        )
    )
    .order_by(session_events.c.seq)
)
_SEQ_OF = select(session_events.c.seq).where(
    and_(
        session_events.c.session_id == bindparam("session_id"),
        session_events.c.id == bindparam("event_id"),
    )
)
_INSERT = insert(session_events)
_NEWEST_EVENT = (
    select(session_events.c.session_seq, session_events.c.id)
    .where(session_events.c.session_id == bindparam("session_id"))
    .order_by(session_events.c.session_seq.desc())
    .limit(1)
)
_FINISH = (
    update(sessions)
    .where(and_(sessions.c.id == bindparam("session_id"), sessions.c.state == "open"))
    .values(state=bindparam("new_state"), closed_at=bindparam("closed_at"))
)


# What the database names when another process numbered an event or a request message first.
_ORDER_CONSTRAINTS = ("session_seq", "session_events_session_order", "request_messages")


class OrderConflict(Unavailable):
    """Another writer appended to this session between our read of its last number and our insert.

    The database's UNIQUE(session_id, session_seq) refused our events: they were not
    written, so the session's order stays one writer's. Retrying appends after the
    other writer's events, which the caller may not have seen: it is told to retry.
    """

    def __init__(self, session_id: str) -> None:
        super().__init__("the session was written concurrently; retry shortly", retry_after=1)
        self.session_id = session_id


class EventView(dict[str, Any]):
    """An event as the API shows it, plus `json`: its wire text, made once.

    Every frame and result that carries the event splices `json` in, so a
    large payload (a provider request holds the whole history) is never
    serialized again after it was written. `payload` is a dict, or the
    `RawJson` the event was appended with (runner events, which nothing in
    this service reads).
    """

    __slots__ = ("json",)

    def __init__(self, fields: dict[str, Any], payload_text: str) -> None:
        super().__init__(fields)
        self.json = _wire_text(fields, payload_text)


def _wire_text(fields: dict[str, Any], payload_text: str) -> str:
    return (
        '{"id":' + dump(fields["id"])
        + ',"session_id":' + dump(fields["session_id"])
        + ',"client_key_id":' + dump(fields["client_key_id"])
        + ',"event_type":' + dump(fields["event_type"])
        + ',"payload":' + payload_text
        + ',"created_at":' + dump(fields["created_at"])
        + "}"
    )


def _row_fields(row: EventRow, payload: object) -> dict[str, Any]:
    return {
        "id": row.id,
        "session_id": row.session_id,
        "client_key_id": row.client_key_id,
        "event_type": row.event_type,
        "payload": payload,
        "created_at": row.created_at,
    }


def event_view(row: EventRow) -> EventView:
    """The EventView of a stored event row, payload parsed."""
    return EventView(_row_fields(row, load(row.payload)), row.payload)


def unparsed_view(row: EventRow) -> EventView:
    """The EventView of a stored event row, for sending only: its payload stays text."""
    return EventView(_row_fields(row, RawJson(row.payload)), row.payload)


def event_json(row: EventRow) -> str:
    """The wire text of a stored event row, without parsing its payload."""
    return _wire_text(_row_fields(row, None), row.payload)


def append(
    conn: Connection,
    session_id: str,
    events: list[tuple[str | None, str, dict[str, Any] | RawJson]],
    new_state: str | None = None,
    previous: PreviousRequests | None = None,
) -> list[EventView]:
    """Insert events in order; `new_state` (closed/error) applies only to an open session.

    Each event gets the session's next `session_seq`, read in this transaction. A
    concurrent writer that took a number first makes this raise OrderConflict (and the
    caller's transaction roll back) instead of interleaving. The Store serializes a
    process's own appends to a session (see store.py), so only another process conflicts.
    A `provider.request` is stored by reference (requests.py), with `previous` remembering
    the session's last one. The webhook deliveries the events owe are queued in the same
    transaction (queue_deliveries): committed with them, or not at all.
    """
    hold_session(conn, session_id)
    views = []
    rows = []
    newest = conn.execute(_NEWEST_EVENT, {"session_id": session_id}).first()
    next_seq = newest.session_seq + 1 if newest is not None else 1
    if previous is not None:
        previous.check(session_id, Last(newest.session_seq, newest.id) if newest is not None else None)
    for offset, (client_key_id, event_type, payload) in enumerate(events):
        fields = {
            "id": new_id("evt_"),
            "session_id": session_id,
            "client_key_id": client_key_id,
            "event_type": event_type,
            "payload": payload,
            "created_at": now(),
        }
        payload_text = dump(payload)
        views.append(EventView(fields, payload_text))
        stored = requests.stored(conn, session_id, event_type, payload, payload_text, previous)
        rows.append({**fields, **stored._asdict(), "session_seq": next_seq + offset})
    if rows and previous is not None:
        previous.appended(session_id, Last(next_seq + len(rows) - 1, views[-1]["id"]))
    if rows:
        try:
            conn.execute(_INSERT, rows)
        except IntegrityError as exc:
            if not any(name in str(exc.orig) for name in _ORDER_CONSTRAINTS):
                raise
            raise OrderConflict(session_id) from None
        queue_deliveries(conn, session_id, [(view["id"], view["event_type"]) for view in views], time.time())
    if new_state is not None:
        conn.execute(
            _FINISH, {"session_id": session_id, "new_state": new_state, "closed_at": now()}
        )
    return views


# The enabled webhooks a session's events may go to: every profile's, and its own profile's.
_LISTENING = select(webhooks.c.id, webhooks.c.event_types).where(
    and_(
        webhooks.c.enabled.is_(True),
        or_(
            webhooks.c.profile_id.is_(None),
            webhooks.c.profile_id == select(sessions.c.profile_id)
            .where(sessions.c.id == bindparam("session_id"))
            .scalar_subquery(),
        ),
    )
)


def queue_deliveries(conn: Connection, session_id: str, appended: list[tuple[str, str]], at: float) -> int:
    """Queue each appended event (id, event type) for the enabled webhooks whose filters it matches, due
    at once: one webhook_outbox row per event that matched any, naming them; returns how many rows.
    The deliverer makes each row its deliveries (store/webhooks.py), and a delivery's body is made
    from the stored event when it is sent, so an event is written once however many webhooks take it."""
    listening = conn.execute(_LISTENING, {"session_id": session_id}).all()
    if not listening:
        return 0
    rows = []
    for event_id, event_type in appended:
        matched = [webhook_id for webhook_id, event_types in listening if matches(event_types, event_type)]
        if matched:
            rows.append({"event_id": event_id, "event_type": event_type, "webhook_ids": ",".join(matched),
                         "queued_at": at})
    if rows:
        conn.execute(insert(webhook_outbox), rows)
    return len(rows)


def append_compaction(
    conn: Connection,
    session_id: str,
    client_key_id: str | None,
    leading: list[tuple[str | None, str, dict[str, Any] | RawJson]],
    preamble: dict[str, Any],
    summary: dict[str, Any],
    completed: dict[str, Any],
    previous: PreviousRequests | None = None,
) -> list[EventView]:
    """`leading` events, then a compaction's preamble, summary and `completed` marker (§12.4 step 8).

    One transaction (the caller's): the marker names the ids of the two messages it
    makes the new start of the history, so all three land together or not at all.
    """
    messages = append(
        conn,
        session_id,
        [*leading, (client_key_id, "server.message.send", preamble), (client_key_id, "server.message.send", summary)],
        previous=previous,
    )
    marker = {"preamble_event_id": messages[-2]["id"], "summary_event_id": messages[-1]["id"], **completed}
    return messages + append(conn, session_id, [(client_key_id, "session.compaction.completed", marker)])


def _newest_first(event_type: str) -> Select[Any]:
    """The payloads of one event type of a session, newest first (at most `:limit`)."""
    return (
        select(session_events.c.payload)
        .where(
            and_(
                session_events.c.session_id == bindparam("session_id"),
                session_events.c.event_type == event_type,
            )
        )
        .order_by(session_events.c.seq.desc())
        .limit(bindparam("limit"))
    )


_PROVIDER_RESPONSES_NEWEST_FIRST = _newest_first("provider.response")
_TOOL_RESULTS_NEWEST_FIRST = _newest_first("tool.result")


def latest_turn_usage(conn: Connection, session_id: str) -> dict[str, Any] | None:
    """The usage of the session's newest successful turn (not compaction) provider response (§12.3 step 9)."""
    # A compaction writes one response per provider tried; a turn's newest is rarely further back.
    rows = conn.execute(_PROVIDER_RESPONSES_NEWEST_FIRST, {"session_id": session_id, "limit": 1000})
    for (payload_text,) in rows:
        payload = load(payload_text)
        if payload.get("ok") and not payload.get("purpose"):
            usage = payload.get("usage")
            return usage if isinstance(usage, dict) else None
    return None


def server_tool_results(conn: Connection, session_id: str, tool_use_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The newest server-side (non-client) result of each id, as `tool_result` blocks."""
    wanted = set(tool_use_ids)
    found: dict[str, dict[str, Any]] = {}
    rows = conn.execute(_TOOL_RESULTS_NEWEST_FIRST, {"session_id": session_id, "limit": 4 * len(wanted) + 16})
    for (payload_text,) in rows:
        payload = load(payload_text)
        tool_use_id = payload.get("tool_use_id")
        if payload.get("dispatch") != "client" and tool_use_id in wanted and tool_use_id not in found:
            found[tool_use_id] = {
                "type": "tool_result",
                "tool_use_id": tool_use_id,
                "content": payload.get("content"),
                "is_error": bool(payload.get("is_error", False)),
            }
    return found


_SUBAGENT_EVENTS = (
    select(*_EVENT_COLUMNS)
    .where(
        and_(
            session_events.c.session_id == bindparam("session_id"),
            session_events.c.event_type.like("session.subagent.%"),
        )
    )
    .order_by(session_events.c.seq)
)


def subagent_rows(conn: Connection, session_id: str) -> list[EventRow]:
    """The session's `session.subagent.*` events (never a request stored by reference)."""
    return list(conn.execute(_SUBAGENT_EVENTS, {"session_id": session_id}))


def page(
    conn: Connection, session_id: str, after_seq: int, limit: int, budget: int | None = None
) -> list[EventRow]:
    """Up to `limit` events after `after_seq`, in order, as they were appended. With a `budget`, the
    reading stops at the second event by which their payload text is over `budget` characters: a
    page of that budget is among them, and one event more says whether more exist
    (pagination.fitting). SQLite hands rows over one at a time, so the events after it are never read."""
    result: Result[Any] = conn.execute(_PAGE, {"session_id": session_id, "after": after_seq, "limit": limit})
    texts: Texts | None = None
    rows: list[EventRow] = []
    total = 0
    with result:
        for row in result:
            event: EventRow = row
            if row[_RUNS] is not None:  # by position: a row's attributes cost more, on every event read
                texts = texts or Texts(conn, session_id)
                event = _as_appended(row, texts)
            rows.append(event)
            if budget is not None:
                total += len(event.payload)
                if total > budget and len(rows) > 1:
                    break
    return rows


def _as_appended(row: Row[Any], texts: Texts) -> StoredEvent:
    """A request stored by reference, its messages spliced back in."""
    payload = texts.payload(row.payload, row.messages_at, row.messages_runs)
    return StoredEvent(row.seq, row.id, row.session_id, row.client_key_id, row.event_type, payload, row.created_at)


def wire_texts(conn: Connection, event_ids: list[str]) -> dict[str, tuple[str, str, str]]:
    """The events of `event_ids` that exist, by id: (event type, created_at, wire text as the REST API
    returns it)."""
    found: dict[str, tuple[str, str, str]] = {}
    texts: dict[str, Texts] = {}
    query = select(*_EVENT_COLUMNS, session_events.c.messages_at, session_events.c.messages_runs).where(
        session_events.c.id.in_(event_ids)
    )
    result: Result[Any] = conn.execute(query)
    for row in result:
        event: EventRow = row
        if row.messages_runs is not None:
            session_texts = texts.setdefault(row.session_id, Texts(conn, row.session_id))
            event = _as_appended(row, session_texts)
        found[row.id] = (row.event_type, row.created_at, event_json(event))
    return found


def page_items(conn: Connection, session_id: str, after_seq: int, limit: int) -> list[tuple[int, str]]:
    """A page of a session's events as (seq, wire text), for the list endpoints."""
    return [(row.seq, event_json(row)) for row in page(conn, session_id, after_seq, limit)]


def page_items_of_existing(
    conn: Connection, session_id: str, after_seq: int, limit: int
) -> list[tuple[int, str]] | None:
    """`page_items`, or None when there is no such session."""
    if conn.execute(select(sessions.c.seq).where(sessions.c.id == session_id)).first() is None:
        return None
    return page_items(conn, session_id, after_seq, limit)


def seq_of(conn: Connection, session_id: str, event_id: str) -> int | None:
    return conn.execute(_SEQ_OF, {"session_id": session_id, "event_id": event_id}).scalar()


def message_rows(conn: Connection, session_id: str) -> list[EventRow]:
    """The session's messages (never a request stored by reference)."""
    return list(conn.execute(_MESSAGES, {"session_id": session_id}))


# Export, import and deletion (store/retention.py): the only other code that reads or writes the
# event rows' stored form besides the functions above.


class ImportedEvent(NamedTuple):
    """One event of an import, as its wire text gave it; `payload_text` is stored as it is."""

    id: str
    client_key_id: str | None
    event_type: str
    payload_text: str
    created_at: str


class UnreadableEvent(ValueError):
    """An import line that is not an event's wire text; the message says why."""


def imported_event(line: str, session_id: str) -> ImportedEvent:
    """The event a line of an export holds (its wire text, as `event_json` writes it).

    The payload keeps the line's own bytes when the line is exactly as exported (its keys in
    the wire order, no spacing), so the event reads back byte for byte; a line written any
    other way still reads, its payload then stored in this store's own JSON form."""
    try:
        fields = load(line)
    except ValueError as exc:
        raise UnreadableEvent(f"not JSON ({exc})") from None
    if not isinstance(fields, dict):
        raise UnreadableEvent("not a JSON object")
    for key, bound in (("id", ID_CHARS), ("event_type", ID_CHARS), ("created_at", STAMP_CHARS)):
        value = fields.get(key)
        if not isinstance(value, str) or not value or len(value) > bound:
            raise UnreadableEvent(f"`{key}` must be a string of 1 to {bound} characters")
    client_key_id = fields.get("client_key_id")
    if client_key_id is not None and (not isinstance(client_key_id, str) or len(client_key_id) > ID_CHARS):
        raise UnreadableEvent(f"`client_key_id` must be null or a string of at most {ID_CHARS} characters")
    if fields.get("session_id") != session_id:
        raise UnreadableEvent(f"`session_id` must be the session line's id, {session_id}")
    if "payload" not in fields:
        raise UnreadableEvent("`payload` is missing")
    head, tail = _wire_text({**fields, "payload": None}, "\0").split("\0")
    exact = len(line) > len(head) + len(tail) and line.startswith(head) and line.endswith(tail)
    payload_text = line[len(head):len(line) - len(tail)] if exact else ""
    if not exact or not _reads_as(payload_text, fields["payload"]):
        payload_text = dump(fields["payload"])
    return ImportedEvent(fields["id"], client_key_id, fields["event_type"], payload_text, fields["created_at"])


def _reads_as(text: str, value: Any) -> bool:
    """Whether `text` is JSON for `value` (a line with a key given twice is not as exported)."""
    try:
        return bool(load(text) == value)
    except ValueError:
        return False


# Column bounds (schema.py) an imported value must fit.
ID_CHARS = 64
STAMP_CHARS = 32


def existing_ids(conn: Connection, event_ids: list[str]) -> list[str]:
    """Those of `event_ids` some stored event already has."""
    found: list[str] = []
    for start in range(0, len(event_ids), 500):
        chunk = event_ids[start:start + 500]
        found += conn.execute(select(session_events.c.id).where(session_events.c.id.in_(chunk))).scalars()
    return found


def insert_imported(conn: Connection, session_id: str, imported: list[ImportedEvent]) -> None:
    """Store an imported session's events as they were: their ids, authors, times and payload
    text, numbered 1, 2, … in the order given, provider requests by reference as `append`
    stores them. The session has no events yet."""
    previous = PreviousRequests()
    rows = [
        {
            "id": event.id,
            "session_id": session_id,
            "session_seq": number,
            "client_key_id": event.client_key_id,
            "event_type": event.event_type,
            "created_at": event.created_at,
            **requests.stored(
                conn, session_id, event.event_type, RawJson(event.payload_text), event.payload_text, previous
            )._asdict(),
        }
        for number, event in enumerate(imported, start=1)
    ]
    for start in range(0, len(rows), 500):
        conn.execute(_INSERT, rows[start:start + 500])


def delete_some(conn: Connection, session_id: str, limit: int) -> tuple[int, int]:
    """Delete up to `limit` of a session's oldest events; returns how many, and their stored bytes."""
    chosen = (
        select(session_events.c.seq)
        .where(session_events.c.session_id == session_id)
        .order_by(session_events.c.seq)
        .limit(limit)
    )
    seqs = list(conn.execute(chosen).scalars())
    if not seqs:
        return 0, 0
    which = session_events.c.seq.in_(seqs)
    size = conn.execute(
        select(func.coalesce(func.sum(utf8_bytes(conn, session_events.c.payload)), 0)).where(which)
    ).scalar_one()
    conn.execute(delete(session_events).where(which))
    return len(seqs), int(size)

