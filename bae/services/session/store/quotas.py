"""The counts quotas are checked against (bae.common.limits), read in the transaction that would
go over them, so every replica sees the same count.

A count and the write it guards run in one transaction. On PostgreSQL the transaction first locks
the client key's row, so two replicas opening sessions (or starting sandboxes) for one key take
turns and the second sees the first's row; SQLite has a single writer anyway, so there is no lock
to take. A count stops at the limit: it never reads more than `limit` index entries.
"""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, delete, func, insert, select

from bae.common.errors import QuotaExceeded
from bae.common.timefmt import now
from bae.services.session.store import keys as key_rows
from bae.services.session.store import profiles
from bae.services.session.store.schema import keys, sandbox_slots, sessions


def _lock_key(conn: Connection, client_key_id: str) -> None:
    if conn.dialect.name == "postgresql":  # SQLite's one writer already takes them one at a time
        conn.execute(select(keys.c.id).where(keys.c.id == client_key_id).with_for_update())


# A key's open sessions, counted up to the limit only (the index's entries, at most `limit` of them).
_OPEN_OF_KEY = select(func.count()).select_from(
    select(sessions.c.id)
    .where(sessions.c.client_key_id == bindparam("client_key_id"), sessions.c.state == "open")
    .limit(bindparam("limit"))
    .subquery()
)


def check_open_sessions(conn: Connection, client_key_id: str, limit: int) -> None:
    """Raise QuotaExceeded when the key already created `limit` sessions that are still open."""
    _lock_key(conn, client_key_id)
    count = conn.execute(_OPEN_OF_KEY, {"client_key_id": client_key_id, "limit": limit}).scalar_one()
    if count >= limit:
        raise QuotaExceeded("max_open_sessions_per_key", limit)


def claim_sandbox(conn: Connection, session_id: str, client_key_id: str, limit: int) -> None:
    """Count a sandbox for `session_id` against the key that created the session; QuotaExceeded
    when the key's open sessions already hold `limit`. A closed session's slot never counts, so
    a slot a crash left behind frees itself when its session closes."""
    _lock_key(conn, client_key_id)
    held = conn.execute(
        select(func.count())
        .select_from(sandbox_slots.join(sessions, sessions.c.id == sandbox_slots.c.session_id))
        .where(sandbox_slots.c.client_key_id == client_key_id, sessions.c.state == "open",
               sandbox_slots.c.session_id != session_id)
    ).scalar_one()
    if held >= limit:
        raise QuotaExceeded("max_sandboxes_per_key", limit)
    conn.execute(delete(sandbox_slots).where(sandbox_slots.c.session_id == session_id))
    conn.execute(insert(sandbox_slots), {"session_id": session_id, "client_key_id": client_key_id, "created_at": now()})


def limits_of_key(conn: Connection, digest: str) -> dict[str, int | float] | None:
    """The `limits` of the profile of the active client or session key whose digest is `digest`;
    None when there is no such key or its profile sets none."""
    key = key_rows.active_by_digest(conn, digest, "client") or key_rows.active_by_digest(conn, digest, "session")
    if key is None or key.profile_id is None:
        return None
    profile = profiles.active(conn, key.profile_id)
    return None if profile is None else profile.limits


def release_sandbox(conn: Connection, session_id: str) -> None:
    conn.execute(delete(sandbox_slots).where(sandbox_slots.c.session_id == session_id))
