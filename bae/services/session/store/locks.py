"""A process's own appends to one session take turns (PostgreSQL; SQLite has one writer thread).

The database numbers a session's events and refuses a duplicate number, so two
writers racing on one session make one of them fail (events.OrderConflict). Within
one process that failure is avoidable: on PostgreSQL every transaction that writes
a session's events first takes that session's lock here, and holds it until the
transaction ends, so the pool's connections never race each other. Only another
process can still conflict, and then the database says so.

Store functions are synchronous (they run through `AsyncConnection.run_sync`), so
`hold_session` waits for the asyncio lock with SQLAlchemy's greenlet bridge. The
backend puts the `SessionLocks` of the transaction into `conn.info` and releases
what it holds when the transaction ends.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import Connection
from sqlalchemy.util import await_only

INFO_KEY = "bae_session_locks"


class SessionLocks:
    """One asyncio lock per session that some transaction holds or waits for."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    async def acquire(self, session_id: str) -> None:
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        self._users[session_id] = self._users.get(session_id, 0) + 1
        try:
            await lock.acquire()
        except BaseException:
            self._forget(session_id)
            raise

    def release(self, session_id: str) -> None:
        self._locks[session_id].release()
        self._forget(session_id)

    def _forget(self, session_id: str) -> None:
        self._users[session_id] -= 1
        if not self._users[session_id]:
            del self._users[session_id], self._locks[session_id]


class Held:
    """The session locks one transaction holds."""

    def __init__(self, locks: SessionLocks) -> None:
        self.locks = locks
        self.sessions: list[str] = []

    def release(self) -> None:
        for session_id in reversed(self.sessions):
            self.locks.release(session_id)
        self.sessions.clear()


def hold_session(conn: Connection, session_id: str) -> None:
    """Take `session_id`'s lock for the rest of this transaction (no-op where writes are serial)."""
    held: Held | None = conn.info.get(INFO_KEY)
    if held is None or session_id in held.sessions:
        return
    await_only(held.locks.acquire(session_id))
    held.sessions.append(session_id)
