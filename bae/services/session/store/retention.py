"""Ended sessions: finding those past their retention, deleting one with every row it owns, and the
rows an export carries and an import recreates.

`delete_some` is the one place that knows every per-session table: a table that gains rows per
session is added there. It deletes in bounded steps so a long session never holds the store's
writer for long; a session is gone once its row is, which is deleted last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, and_, delete, insert, or_, select
from sqlalchemy.exc import IntegrityError

from bae.common.errors import Conflict, echo
from bae.services.session.store import events, leases, requests, sessions
from bae.services.session.store.events import ImportedEvent
from bae.services.session.store.locks import hold_session
from bae.services.session.store.schema import (
    keys,
    profiles,
    sandbox_slots,
    session_leases,
    usage_totals,
)
from bae.services.session.store.schema import sessions as sessions_table

ENDED = ("closed", "error")
# The sessions table's columns an export carries (all but `seq`, which an import numbers anew).
SESSION_FIELDS = (
    "id", "client_key_id", "profile_id", "state", "client_version", "client_tools", "sandbox_tools",
    "subagent_tools", "compaction", "created_at", "closed_at",
)
USAGE_FIELDS = tuple(column.name for column in usage_totals.columns if column.name != "session_id")


def session_open(session_id: str) -> Conflict:
    return Conflict(f"session {echo(session_id)} is open; close it before deleting it", reason="session_open")


@dataclass(frozen=True)
class Step:
    """What one `delete_some` call removed; `done` once the session row itself is gone."""

    events: int
    bytes: int
    done: bool


def delete_some(conn: Connection, session_id: str, limit: int) -> Step | None:
    """Delete up to `limit` more events of an ended session, or, once none are left, the rest of
    its rows and the session itself. None: no such session. Raises Conflict (session_open) for
    an open one."""
    hold_session(conn, session_id)
    state = conn.execute(
        select(sessions_table.c.state).where(sessions_table.c.id == session_id).with_for_update()
    ).scalar()
    if state is None:
        return None
    if state not in ENDED:
        raise session_open(session_id)
    removed, size = events.delete_some(conn, session_id, limit)
    if removed:
        return Step(removed, size, done=False)
    # The message texts of its provider requests go last of its stored text: until its last
    # event is gone, a page of what is left still reads them.
    size = requests.delete_session(conn, session_id)
    for table in (usage_totals, sandbox_slots, session_leases):
        conn.execute(delete(table).where(table.c.session_id == session_id))
    # Its session keys: `name` is the session id (keys.py).
    conn.execute(delete(keys).where(and_(keys.c.role == "session", keys.c.name == session_id)))
    conn.execute(delete(sessions_table).where(sessions_table.c.id == session_id))
    return Step(0, size, done=True)


def retention_overrides(conn: Connection) -> dict[str, float]:
    """Days of retention by profile id, for the profiles (deleted ones too) that set their own."""
    rows = conn.execute(select(profiles.c.id, profiles.c.retention).where(profiles.c.retention.is_not(None)))
    return {
        profile_id: float(retention["closed_session_days"])
        for profile_id, retention in rows
        if isinstance(retention, dict) and retention.get("closed_session_days") is not None
    }


def expired(
    conn: Connection, default_before: str | None, profile_before: dict[str, str], limit: int
) -> list[str]:
    """Up to `limit` ended sessions past their retention, oldest first: those of a profile in
    `profile_before` closed before its time, the others closed before `default_before` (None:
    the others are kept)."""
    closed_at = sessions_table.c.closed_at
    profile_id = sessions_table.c.profile_id
    conditions = [and_(profile_id == pid, closed_at < before) for pid, before in profile_before.items()]
    if default_before is not None:
        default = closed_at < default_before
        if profile_before:
            default = and_(default, profile_id.not_in(list(profile_before)))
        conditions.append(default)
    if not conditions:
        return []
    query = (
        select(sessions_table.c.id)
        .where(and_(sessions_table.c.state.in_(ENDED), or_(*conditions)))
        .order_by(closed_at, sessions_table.c.seq)
        .limit(limit)
    )
    return list(conn.execute(query).scalars())


def ended_before(conn: Connection, before: str, limit: int) -> list[str]:
    """Up to `limit` ended sessions closed before `before` (RFC 3339), oldest first."""
    return expired(conn, before, {}, limit)


def export_head(conn: Connection, session_id: str) -> dict[str, Any] | None:
    """The session line's contents: the session row and its usage rows; None: no such session."""
    session = sessions.get(conn, session_id)
    if session is None:
        return None
    usage = conn.execute(
        select(*(usage_totals.c[name] for name in USAGE_FIELDS)).where(usage_totals.c.session_id == session_id)
        .order_by(usage_totals.c.day, usage_totals.c.client_key_id)
    )
    return {
        "session": {name: getattr(session, name) for name in SESSION_FIELDS},
        "usage": [dict(row._mapping) for row in usage],
    }


def insert_imported(
    conn: Connection, session: dict[str, Any], usage: list[dict[str, Any]], imported: list[ImportedEvent]
) -> None:
    """Recreate an exported session with its ids; raises Conflict (session_exists) when its id or
    an event's is taken."""
    session_id = session["id"]
    if sessions.get(conn, session_id) is not None:
        raise session_exists(f"session {echo(session_id)} already exists")
    taken = events.existing_ids(conn, [event.id for event in imported])
    if taken:
        raise session_exists(f"event {echo(taken[0])} already exists")
    try:
        conn.execute(insert(sessions_table), {name: session[name] for name in SESSION_FIELDS})
        if usage:
            conn.execute(insert(usage_totals), [{**row, "session_id": session_id} for row in usage])
        events.insert_imported(conn, session_id, imported)
    except IntegrityError:  # an import of the same ids that committed meanwhile
        raise session_exists(f"session {echo(session_id)} or one of its events already exists") from None


def session_exists(detail: str) -> Conflict:
    return Conflict(detail, reason="session_exists")


# The sweep's duty lease (leases.take_duty): one replica at a time sweeps.
SWEEP_LEASE = "retention-sweep"


def sweep_step(
    conn: Connection, holder: str, now: float, lease_seconds: float, session_id: str, limit: int
) -> Step | None | Literal[False]:
    """`delete_some` under the sweep's lease, renewed in the same transaction: False when another
    replica holds it (nothing deleted). On PostgreSQL the renewal's row lock makes a rival's
    takeover wait for this transaction, then find the lease ahead again."""
    if not leases.take_duty(conn, SWEEP_LEASE, holder, now, lease_seconds):
        return False
    return delete_some(conn, session_id, limit)


def reclaim(conn: Connection, pages: int) -> int:
    """SQLite: give up to `pages` free pages back to the file system (incremental vacuum; a no-op
    unless the database is in auto_vacuum=INCREMENTAL mode). Returns the free pages left (0 on
    PostgreSQL, which autovacuum looks after)."""
    if conn.dialect.name != "sqlite":
        return 0
    conn.exec_driver_sql(f"PRAGMA incremental_vacuum({int(pages)})")
    if conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() != 2:  # 2: INCREMENTAL
        return 0
    return int(conn.exec_driver_sql("PRAGMA freelist_count").scalar() or 0)
