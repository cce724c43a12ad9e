"""The store: one database connection owned by one worker thread.

Every database call runs on a single-thread executor, so the asyncio loop
never blocks on I/O and SQLite writes are serialized without locks. A call is
one transaction: `await store.call(fn, *args)` runs `fn(conn, *args)` inside
`BEGIN … COMMIT` (rolled back if it raises).
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

from bae.jsontext import RawJson
from services.session.store import events, profiles, sessions
from services.session.store.migrations import migrate
from services.session.store.records import ProfileRecord, SessionRecord


T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 5000


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite gets its parent directory, WAL and a busy timeout."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


def session_and_profile(conn: Connection, session_id: str) -> tuple[SessionRecord | None, ProfileRecord | None]:
    session = sessions.get(conn, session_id)
    return session, profiles.active(conn, session.profile_id) if session is not None else None


class Store:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bae-store")
        self._conn: Connection | None = None

    @classmethod
    async def open(cls, url: str) -> "Store":
        """Connect and apply pending migrations."""
        store = cls(make_engine(url))
        try:
            await store.run(store._migrate)
        except BaseException:
            await store.close()
            raise
        return store

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._conn = self._engine.connect()
        return self._conn

    def _migrate(self) -> list[str]:
        return migrate(self._connection())

    def _in_transaction(self, fn: Callable[..., T], args: tuple) -> T:
        conn = self._connection()
        with conn.begin():
            return fn(conn, *args)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn()` on the store thread (no transaction of its own)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)` in one transaction on the store thread."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(self._in_transaction, fn, args)
        )

    async def close(self) -> None:
        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
            self._engine.dispose()

        await self.run(_close)
        self._executor.shutdown(wait=True)

    # The turn engine's API (SERVER-SPEC §7-§12 live on top of these).

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return await self.call(sessions.get, session_id)

    async def session_and_profile(self, session_id: str) -> tuple[SessionRecord | None, ProfileRecord | None]:
        """The session and its profile (None when missing or soft-deleted), in one store call."""
        return await self.call(session_and_profile, session_id)

    async def append_events(
        self,
        session_id: str,
        items: list[tuple[str | None, str, dict | RawJson]],
        new_state: str | None = None,
    ) -> list[events.EventView]:
        """Append (client_key_id, event_type, payload) events in one transaction.

        `new_state` ("closed"/"error") also stamps `closed_at`, and applies only
        while the session is still open; the events are written regardless.
        Returns their EventViews; publish them after this returns.
        """
        return await self.call(events.append, session_id, items, new_state)

    async def list_events(self, session_id: str, after_seq: int, limit: int) -> list[tuple[int, events.EventView]]:
        """A page of events for sending (payloads unparsed), with their sequence numbers."""
        rows = await self.call(events.page, session_id, after_seq, limit)
        return [(row.seq, events.unparsed_view(row)) for row in rows]

    async def event_seq(self, session_id: str, event_id: str) -> int | None:
        return await self.call(events.seq_of, session_id, event_id)

    async def message_events(self, session_id: str) -> list[events.EventView]:
        """client.message.send / server.message.send / session.compaction.completed, in order."""
        rows = await self.call(events.message_rows, session_id)
        return [events.event_view(row) for row in rows]

    async def set_client_tools(self, session_id: str, client_key_id: str, tools: list[dict]) -> None:
        def _set(conn: Connection) -> None:
            session = sessions.get(conn, session_id)
            if session is not None:
                sessions.set_declarations(conn, session, client_key_id, client_tools=tools)

        await self.call(_set)

    async def live_profiles(self) -> list[ProfileRecord]:
        return await self.call(profiles.all_active)

    async def list_open_session_ids(self) -> list[str]:
        return await self.call(sessions.open_ids)
