"""Session rows (SERVER-SPEC §0.1, §5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, insert, select, update

from bae.common.ids import new_id
from bae.common.timefmt import now
from bae.services.session.store.locks import hold_session
from bae.services.session.store.records import SessionRecord
from bae.services.session.store.schema import sessions

STATES = ("open", "closed", "error")

_BY_ID = select(sessions).where(sessions.c.id == bindparam("id"))
_OPEN_IDS = select(sessions.c.id).where(sessions.c.state == "open").order_by(sessions.c.seq)
_SUMMARY_COLUMNS = (
    sessions.c.seq,
    sessions.c.id,
    sessions.c.profile_id,
    sessions.c.client_key_id,
    sessions.c.state,
    sessions.c.client_version,
    sessions.c.created_at,
    sessions.c.closed_at,
)


def record(row: Row[Any]) -> SessionRecord:
    return SessionRecord(
        id=row.id,
        client_key_id=row.client_key_id,
        profile_id=row.profile_id,
        state=row.state,
        client_version=row.client_version,
        client_tools=row.client_tools,
        sandbox_tools=row.sandbox_tools,
        subagent_tools=row.subagent_tools,
        compaction=row.compaction,
        created_at=row.created_at,
        closed_at=row.closed_at,
    )


def get(conn: Connection, session_id: str) -> SessionRecord | None:
    row = conn.execute(_BY_ID, {"id": session_id}).first()
    return None if row is None else record(row)


def create(
    conn: Connection,
    *,
    client_key_id: str,
    profile_id: str,
    state: str,
    client_version: str | None,
    client_tools: list[dict[str, Any]],
    sandbox_tools: list[dict[str, Any]],
    subagent_tools: list[dict[str, Any]],
    compaction: dict[str, Any] | None,
) -> str:
    """Insert a session whose declarations all belong to its creator; returns its id."""
    stamp = now()
    session_id = new_id("ses_")
    conn.execute(
        insert(sessions),
        {
            "id": session_id,
            "client_key_id": client_key_id,
            "profile_id": profile_id,
            "state": state,
            "client_version": client_version,
            "client_tools": {client_key_id: client_tools},
            "sandbox_tools": {client_key_id: sandbox_tools},
            "subagent_tools": {client_key_id: subagent_tools},
            "compaction": compaction,
            "created_at": stamp,
            "closed_at": None if state == "open" else stamp,
        },
    )
    return session_id


def set_declarations(
    conn: Connection,
    session: SessionRecord,
    client_key_id: str,
    *,
    client_tools: list[dict[str, Any]] | None = None,
    sandbox_tools: list[dict[str, Any]] | None = None,
    subagent_tools: list[dict[str, Any]] | None = None,
) -> None:
    """Replace one client's declaration lists (those given); other clients' stay untouched."""
    # Before the row lock this update takes: a session's writers queue on its lock first (locks.py).
    hold_session(conn, session.id)
    values = {}
    for column, current, new in (
        ("client_tools", session.client_tools, client_tools),
        ("sandbox_tools", session.sandbox_tools, sandbox_tools),
        ("subagent_tools", session.subagent_tools, subagent_tools),
    ):
        if new is not None:
            values[column] = {**current, client_key_id: new}
    if values:
        conn.execute(update(sessions).where(sessions.c.id == session.id).values(**values))


def open_ids(conn: Connection) -> list[str]:
    return list(conn.execute(_OPEN_IDS).scalars())


def states(conn: Connection, session_ids: list[str]) -> dict[str, str]:
    """session id -> state, for those of `session_ids` the store knows."""
    rows = conn.execute(select(sessions.c.id, sessions.c.state).where(sessions.c.id.in_(session_ids)))
    return {row[0]: row[1] for row in rows}


@dataclass(frozen=True)
class SessionFilter:
    """What the admin's session list keeps: every condition set must hold (None: no condition).
    The times are in the store's form (bae.common.timefmt), so they compare as the stored text."""

    state: str | None = None
    profile_id: str | None = None
    client_key_id: str | None = None
    created_after: str | None = None  # inclusive
    created_before: str | None = None  # exclusive
    id_prefix: str | None = None


def page(conn: Connection, kept: SessionFilter, after_seq: int, limit: int) -> list[Row[Any]]:
    """The first `limit` sessions after `after_seq` that `kept` keeps, in seq order: a cursor from
    one page continues the same filtered list."""
    query = select(*_SUMMARY_COLUMNS).where(sessions.c.seq > after_seq)
    if kept.state is not None:
        query = query.where(sessions.c.state == kept.state)
    if kept.profile_id is not None:
        query = query.where(sessions.c.profile_id == kept.profile_id)
    if kept.client_key_id is not None:
        query = query.where(sessions.c.client_key_id == kept.client_key_id)
    if kept.created_after is not None:
        query = query.where(sessions.c.created_at >= kept.created_after)
    if kept.created_before is not None:
        query = query.where(sessions.c.created_at < kept.created_before)
    if kept.id_prefix is not None:
        # Not LIKE: SQLite's is case-insensitive and `_` is its wildcard; this compares exactly.
        query = query.where(func.substr(sessions.c.id, 1, len(kept.id_prefix)) == kept.id_prefix)
    return list(conn.execute(query.order_by(sessions.c.seq).limit(limit)))


def summary_view(row: Row[Any] | SessionRecord) -> dict[str, Any]:
    """The admin API's session summary, a list item or one session (no tool lists)."""
    return {
        "id": row.id,
        "profile_id": row.profile_id,
        "client_key_id": row.client_key_id,
        "state": row.state,
        "client_version": row.client_version,
        "created_at": row.created_at,
        "closed_at": row.closed_at,
    }
