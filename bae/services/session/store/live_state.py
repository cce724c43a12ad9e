"""What a replica rebuilds from the log when it starts serving an open session (taken over from a
replica that died, or after a restart): the state it would otherwise have held in memory.

The session row holds the rest already: each client's declared client, sandbox and subagent tools
(updateClientTools writes the row) and the compaction settings.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import Connection, Select, and_, bindparam, func, select

from bae.common.jsontext import load
from bae.services.session.store import sessions
from bae.services.session.store.records import SessionRecord
from bae.services.session.store.schema import keys, session_events


class FailedCompaction(NamedTuple):
    """An automatic compaction that failed and has not been followed by a completed one: its token
    count, and the turns begun since (engine/compaction.py's backoff)."""

    token_count: int
    turns_since: int


class LiveState(NamedTuple):
    session: SessionRecord | None
    drivers: list[str]
    failed_compaction: FailedCompaction | None


_DRIVERS = (
    select(session_events.c.client_key_id)
    .join(keys, keys.c.id == session_events.c.client_key_id)
    .where(
        and_(
            session_events.c.session_id == bindparam("session_id"),
            session_events.c.event_type == "session.driver.register",
            keys.c.deleted_at.is_(None),  # a revoked key is no longer a driver (engine/revocation.py)
        )
    )
    .distinct()
)


def _newest(event_type: str) -> Select[Any]:
    """The session's newest event of one type: (seq, payload)."""
    return (
        select(session_events.c.seq, session_events.c.payload)
        .where(and_(session_events.c.session_id == bindparam("session_id"), session_events.c.event_type == event_type))
        .order_by(session_events.c.seq.desc())
        .limit(1)
    )


_NEWEST_STARTED = _newest("session.compaction.started")
_NEWEST_COMPLETED = _newest("session.compaction.completed")
_MESSAGES_AFTER = select(func.count()).where(
    and_(
        session_events.c.session_id == bindparam("session_id"),
        session_events.c.event_type == "client.message.send",
        session_events.c.seq > bindparam("after"),
    )
)


def read(conn: Connection, session_id: str) -> LiveState:
    """The session, and the live state its log implies (nothing when it is not open)."""
    session = sessions.get(conn, session_id)
    if session is None or session.state != "open":
        return LiveState(session, [], None)
    drivers = sorted(conn.execute(_DRIVERS, {"session_id": session_id}).scalars())
    return LiveState(session, drivers, _failed_compaction(conn, session_id))


def _failed_compaction(conn: Connection, session_id: str) -> FailedCompaction | None:
    started = conn.execute(_NEWEST_STARTED, {"session_id": session_id}).first()
    if started is None:
        return None
    completed = conn.execute(_NEWEST_COMPLETED, {"session_id": session_id}).first()
    payload = load(started.payload)
    if (completed is not None and completed.seq > started.seq) or payload.get("trigger") != "auto":
        return None
    turns = conn.execute(_MESSAGES_AFTER, {"session_id": session_id, "after": started.seq}).scalar_one()
    return FailedCompaction(int(payload.get("token_count") or 0), turns)
