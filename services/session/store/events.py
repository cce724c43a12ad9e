"""The append-only session event log and its one wire shape (EventView, SERVER-SPEC §13.1)."""

from __future__ import annotations

from sqlalchemy import Connection, Row, and_, bindparam, insert, select, update

from bae.ids import new_id
from bae.timefmt import now
from services.session.store.jsontext import dump, load
from services.session.store.schema import session_events, sessions

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

_PAGE = (
    select(*_EVENT_COLUMNS)
    .where(
        and_(
            session_events.c.session_id == bindparam("session_id"),
            session_events.c.seq > bindparam("after"),
        )
    )
    .order_by(session_events.c.seq)
    .limit(bindparam("limit"))
)
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
_FINISH = (
    update(sessions)
    .where(and_(sessions.c.id == bindparam("session_id"), sessions.c.state == "open"))
    .values(state=bindparam("new_state"), closed_at=bindparam("closed_at"))
)


def event_view(row: Row) -> dict:
    """The EventView dict of a stored event row."""
    return {
        "id": row.id,
        "session_id": row.session_id,
        "client_key_id": row.client_key_id,
        "event_type": row.event_type,
        "payload": load(row.payload),
        "created_at": row.created_at,
    }


def event_json(row: Row) -> str:
    """`dump(event_view(row))`, without re-parsing the stored payload text."""
    return (
        '{"id":' + dump(row.id)
        + ',"session_id":' + dump(row.session_id)
        + ',"client_key_id":' + dump(row.client_key_id)
        + ',"event_type":' + dump(row.event_type)
        + ',"payload":' + row.payload
        + ',"created_at":' + dump(row.created_at)
        + "}"
    )


def append(
    conn: Connection,
    session_id: str,
    events: list[tuple[str | None, str, dict]],
    new_state: str | None = None,
) -> list[dict]:
    """Insert events in order; `new_state` (closed/error) applies only to an open session."""
    views = []
    rows = []
    for client_key_id, event_type, payload in events:
        view = {
            "id": new_id("evt_"),
            "session_id": session_id,
            "client_key_id": client_key_id,
            "event_type": event_type,
            "payload": payload,
            "created_at": now(),
        }
        views.append(view)
        rows.append({**view, "payload": dump(payload)})
    if rows:
        conn.execute(_INSERT, rows)
    if new_state is not None:
        conn.execute(
            _FINISH, {"session_id": session_id, "new_state": new_state, "closed_at": now()}
        )
    return views


def page(conn: Connection, session_id: str, after_seq: int, limit: int) -> list[Row]:
    return list(conn.execute(_PAGE, {"session_id": session_id, "after": after_seq, "limit": limit}))


def seq_of(conn: Connection, session_id: str, event_id: str) -> int | None:
    return conn.execute(_SEQ_OF, {"session_id": session_id, "event_id": event_id}).scalar()


def message_rows(conn: Connection, session_id: str) -> list[Row]:
    return list(conn.execute(_MESSAGES, {"session_id": session_id}))
