"""The store, on SQLite or PostgreSQL. Only this package touches database connections.

A call is one transaction: `await store.write(fn, *args)` or
`await store.read(fn, *args)` runs `fn(conn, *args)` inside `BEGIN … COMMIT`
(rolled back if it raises), where `fn` is one of this package's synchronous
functions. A database that cannot serve now (locked, full, unreachable) raises
`StoreUnavailable` (an `Unavailable` error, with a retry hint).

SQLite: a writer thread owning one connection, so the asyncio loop never waits
for a commit. Writes go to the single writer, so they are serialized without
locks (this measured best). Calls that queue while the writer is busy are
committed together (group commit): they run in one transaction, and if one
raises, the group is rolled back and its calls run again one at a time, so a
call that raises leaves no trace while the others commit; the group costs one
commit (one fsync) and one wake-up of the loop instead of one per call. Under
load that is most of the writer's cost; a lone call runs as it always did.
Reads run on the loop's own thread, on a connection of their own that never
waits for a lock (busy timeout 0): in WAL mode a read needs no lock a writer
holds, and the thread hop cost as much as the read (an
authenticated GET went from 1.05 to 0.87 ms p50). A read that would have to
wait (another process holds the database in a way that stops readers) is handed
to a reader thread, which waits with patience; so neither path ever holds up a
read behind a blocked write.
The WAL is checkpointed by a thread of its own (checkpoint.py), not inside a
commit.

PostgreSQL (postgres.py): SQLAlchemy's asyncio Engine, a pool of asyncpg connections;
`fn` runs through `AsyncConnection.run_sync`.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from bae.common.errors import UsageError
from bae.common.jsontext import RawJson
from bae.services.session.store import events, live_state, profiles, quotas, sessions, usage
from bae.services.session.store.checkpoint import WalCheckpointer
from bae.services.session.store.migrations import current, migrate
from bae.services.session.store.postgres import PostgresBackend, is_postgres, make_postgres_db
from bae.services.session.store.records import ProfileRecord, SessionRecord
from bae.services.session.store.requests import PreviousRequests
from bae.services.session.store.sqlite import (
    BUSY_TIMEOUT_MS,
    LOCKED_BUSY_TIMEOUT_MS,
    StoreUnavailable,
    is_file_database,
    make_sqlite_db,
    set_busy_timeout,
    unavailable,
)


T = TypeVar("T")


def session_and_profile(conn: Connection, session_id: str) -> tuple[SessionRecord | None, ProfileRecord | None]:
    session = sessions.get(conn, session_id)
    return session, profiles.active(conn, session.profile_id) if session is not None else None


class _Connection:
    """One SQLite connection, opened on first use and again after it broke."""

    def __init__(self, db: Engine, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self._db = db
        self._default_timeout_ms = busy_timeout_ms
        self._timeout_ms = busy_timeout_ms
        self._conn: Connection | None = None

    def open(self) -> Connection:
        """The connection, opened now if it is not open."""
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._conn = self._db.connect()
            self._timeout_ms = BUSY_TIMEOUT_MS  # what the connect hook (sqlite.py) sets
            self.wait_for_locks(self._default_timeout_ms)
        return self._conn

    def wait_for_locks(self, milliseconds: int) -> None:
        """How long the next statements wait for a lock another connection holds."""
        if self._conn is not None and milliseconds != self._timeout_ms:
            set_busy_timeout(self._conn.connection.driver_connection, milliseconds)
            self._timeout_ms = milliseconds

    def transaction(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """`fn(conn, *args)` inside BEGIN … COMMIT; a locked database or a failing disk raises
        StoreUnavailable (after a storage failure the connection is opened afresh next time)."""
        conn = self.open()
        try:
            with conn.begin():
                return fn(conn, *args)
        except OperationalError as exc:
            outage = unavailable(exc)
            if outage is None:
                raise
            if not outage.busy:  # a failed write may leave the connection unusable
                self.close()
            raise outage from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _Worker:
    """One thread and its SQLite connection. After a call found the database locked, the next
    ones wait LOCKED_BUSY_TIMEOUT_MS only, so a database another process holds answers quickly."""

    def __init__(self, db: Engine, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.connection = _Connection(db)

    def _in_transaction(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        try:
            result = self.connection.transaction(fn, args)
        except StoreUnavailable as outage:
            if outage.busy:
                self.connection.wait_for_locks(LOCKED_BUSY_TIMEOUT_MS)
            raise
        self.connection.wait_for_locks(BUSY_TIMEOUT_MS)
        return result

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def transaction(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """`fn(conn, *args)` in one transaction on this worker's thread."""
        return await self.run(functools.partial(self._in_transaction, fn, args))

    async def close(self) -> None:
        await self.run(self.connection.close)
        self._executor.shutdown(wait=True)


@dataclass
class _Queued(Generic[T]):
    """A write waiting for the writer thread, and what it ended with."""

    fn: Callable[..., T]
    args: tuple[Any, ...]
    future: asyncio.Future[T]
    result: T | None = None
    error: BaseException | None = None

    def deliver(self) -> None:
        """On the loop's thread: hand the outcome to the caller, unless it stopped waiting."""
        if self.future.done():
            return
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.result)  # type: ignore[arg-type]  # fn's own result


class _GroupWriter(_Worker):
    """The writer thread: the calls that queued while it was busy are committed together.

    The loop queues a call and starts a drain on the thread unless one is running;
    the drain takes everything queued at once, as one group, until none is left. A
    group runs in one transaction. If a call raises, or the database fails the group
    (locked, disk full), the group is rolled back and its calls run again one by one,
    so each ends as it would have alone; a store function only reads and writes
    through its connection, so running it again is safe. Calls rarely raise, so this
    costs less than a savepoint around each call (two statements more per call, an
    eighth of the session service's CPU under load).
    """

    def __init__(self, db: Engine, name: str, *, on_commit: Callable[[], None] | None = None) -> None:
        super().__init__(db, name)
        self._on_commit = on_commit  # called on the thread after each group
        self._queue: deque[_Queued[Any]] = deque()
        self._lock = threading.Lock()  # the queue's hand-over between the loop and the thread
        self._draining = False

    async def transaction(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """`fn(conn, *args)` queued for the next group."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        queued = _Queued(fn, args, future)
        with self._lock:
            self._queue.append(queued)
            start, self._draining = not self._draining, True
        if start:
            self._executor.submit(self._drain, queued.future.get_loop())
        return await queued.future

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                group = list(self._queue)
                self._queue.clear()
            self._run_group(group)
            loop.call_soon_threadsafe(_deliver_all, group)
            if self._on_commit is not None:
                self._on_commit()

    def _run_group(self, group: list[_Queued[Any]]) -> None:
        if len(group) > 1:
            try:
                self._in_transaction(_together, (group,))
                return
            except Exception:  # rolled back, nothing of the group written: each call alone, as it would have run
                pass
        for queued in group:
            try:
                queued.result, queued.error = self._in_transaction(queued.fn, queued.args), None
            except Exception as exc:
                queued.error = exc


def _together(conn: Connection, group: list[_Queued[Any]]) -> None:
    """The group's calls in the caller's transaction; the first that raises fails the whole group."""
    # pysqlite begins a transaction only before the first INSERT/UPDATE/DELETE: the reads before it
    # belong to the group's transaction too.
    conn.exec_driver_sql("BEGIN")
    for queued in group:
        queued.result = queued.fn(conn, *queued.args)


def _deliver_all(group: list[_Queued[Any]]) -> None:
    for queued in group:
        queued.deliver()


class _SqliteBackend:
    """The writer thread; for a file database, the loop's reader, a reader thread to fall back
    on, and the WAL's checkpointer (an in-memory database is one connection: the writer's)."""

    def __init__(self, db: Engine) -> None:
        self.db = db
        separate = is_file_database(db.url)
        self.checkpointer = WalCheckpointer(db) if separate else None
        self.writer = _GroupWriter(
            db, "bae-store", on_commit=self.checkpointer.wrote if self.checkpointer is not None else None
        )
        self.reader = _Worker(db, "bae-store-read") if separate else self.writer
        # Used only from the event loop's thread; it never waits for a lock.
        self.loop_reader = _Connection(db, busy_timeout_ms=0) if separate else None

    async def read(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        if self.loop_reader is not None:
            try:
                return self.loop_reader.transaction(fn, args)
            except StoreUnavailable as outage:
                if not outage.busy:
                    raise
        return await self.reader.transaction(fn, args)

    async def close(self) -> None:
        if self.loop_reader is not None:
            self.loop_reader.close()
        if self.reader is not self.writer:
            await self.reader.close()
        await self.writer.close()
        if self.checkpointer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.checkpointer.close)
        self.db.dispose()


class Store:
    def __init__(self, backend: _SqliteBackend | PostgresBackend) -> None:
        self._backend = backend
        self.migrations_applied: list[str] = []  # by `open`, oldest first
        # Each session's last provider request as stored, so the next finds what it shares at once.
        self._previous_requests = PreviousRequests()

    @classmethod
    async def open(cls, url: str, synchronous: str = "FULL") -> "Store":
        """Connect and apply pending migrations.

        `url` as users write it: sqlite:///path, or postgresql://user:password@host:port/db.
        """
        parsed = make_url(url)
        backend: _SqliteBackend | PostgresBackend
        if is_postgres(parsed):
            backend = PostgresBackend(make_postgres_db(parsed))
        elif parsed.get_backend_name() == "sqlite":
            backend = _SqliteBackend(make_sqlite_db(parsed, synchronous))
        else:
            raise UsageError(f"unsupported database {parsed.get_backend_name()!r}: use sqlite:// or postgresql://")
        store = cls(backend)
        try:
            store.migrations_applied = await store._migrate()
        except BaseException:
            await store.close()
            raise
        return store

    async def _migrate(self) -> list[str]:
        backend = self._backend
        if isinstance(backend, PostgresBackend):
            return await backend.run_on_connection(migrate)
        return await backend.writer.run(lambda: migrate(backend.writer.connection.open()))

    @property
    def dialect(self) -> str:
        """"sqlite" or "postgresql"."""
        return self._backend.db.dialect.name

    async def revision(self) -> str | None:
        """The schema revision the database is at."""
        return await self.read(current)

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)` in one writing transaction."""
        if isinstance(self._backend, PostgresBackend):
            return await self._backend.transaction(fn, args)
        return await self._backend.writer.transaction(fn, args)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(conn, *args)`, which only reads, in one transaction."""
        if isinstance(self._backend, PostgresBackend):
            return await self._backend.transaction(fn, args)
        return await self._backend.read(fn, args)

    async def close(self) -> None:
        await self._backend.close()

    # The turn engine's API (SERVER-SPEC §7-§12 live on top of these).

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return await self.read(sessions.get, session_id)

    async def live_state(self, session_id: str) -> live_state.LiveState:
        return await self.read(live_state.read, session_id)

    async def session_and_profile(self, session_id: str) -> tuple[SessionRecord | None, ProfileRecord | None]:
        """The session and its profile (None when missing or soft-deleted), in one store call."""
        return await self.read(session_and_profile, session_id)

    async def append_events(
        self,
        session_id: str,
        items: list[tuple[str | None, str, dict[str, Any] | RawJson]],
        new_state: str | None = None,
        charge: usage.Charge | None = None,
    ) -> list[events.EventView]:
        """Append (client_key_id, event_type, payload) events in one transaction.

        `new_state` ("closed"/"error") also stamps `closed_at`, and applies only
        while the session is still open; the events are written regardless.
        `charge` is the usage of the provider responses among them, added in the
        same transaction. Returns their EventViews; publish them after this returns.
        """
        previous = self._previous_requests
        if charge is not None:
            return await self.write(usage.append_charged, session_id, items, new_state, charge, previous)
        return await self.write(events.append, session_id, items, new_state, previous)

    async def append_compaction(
        self,
        session_id: str,
        client_key_id: str | None,
        leading: list[tuple[str | None, str, dict[str, Any] | RawJson]],
        preamble: dict[str, Any],
        summary: dict[str, Any],
        completed: dict[str, Any],
        charge: usage.Charge | None = None,
    ) -> list[events.EventView]:
        """A compaction's records in one transaction, after `leading` (carried) events and with
        the usage `charge` of the provider responses among them."""
        if charge is not None:
            return await self.write(
                usage.append_compaction_charged,
                session_id, client_key_id, leading, preamble, summary, completed, charge, self._previous_requests,
            )
        return await self.write(
            events.append_compaction,
            session_id, client_key_id, leading, preamble, summary, completed, self._previous_requests,
        )

    async def server_tool_results(self, session_id: str, tool_use_ids: list[str]) -> dict[str, dict[str, Any]]:
        return await self.read(events.server_tool_results, session_id, tool_use_ids)

    async def subagent_events(self, session_id: str) -> list[events.EventView]:
        """The session's `session.subagent.*` events, in order."""
        rows = await self.read(events.subagent_rows, session_id)
        return [events.event_view(row) for row in rows]

    async def latest_turn_usage(self, session_id: str) -> dict[str, Any] | None:
        return await self.read(events.latest_turn_usage, session_id)

    async def list_events(
        self, session_id: str, after_seq: int, limit: int, budget: int | None = None
    ) -> list[tuple[int, events.EventView]]:
        """A page of events for sending (payloads unparsed), with their sequence numbers; with a
        `budget`, read as `events.page` reads it."""
        rows = await self.read(events.page, session_id, after_seq, limit, budget)
        return [(row.seq, events.unparsed_view(row)) for row in rows]

    async def event_seq(self, session_id: str, event_id: str) -> int | None:
        return await self.read(events.seq_of, session_id, event_id)

    async def session_usage(self, session_id: str) -> usage.Totals:
        return await self.read(usage.session_totals, session_id)

    async def key_usage_today(self, client_key_id: str) -> usage.Totals:
        return await self.read(usage.key_day_totals, client_key_id)

    async def claim_sandbox(self, session_id: str, client_key_id: str, limit: int) -> None:
        await self.write(quotas.claim_sandbox, session_id, client_key_id, limit)

    async def release_sandbox(self, session_id: str) -> None:
        await self.write(quotas.release_sandbox, session_id)

    async def message_events(self, session_id: str) -> list[events.EventView]:
        """client.message.send / server.message.send / session.compaction.completed, in order."""
        rows = await self.read(events.message_rows, session_id)
        return [events.event_view(row) for row in rows]

    async def set_client_tools(self, session_id: str, client_key_id: str, tools: list[dict[str, Any]]) -> None:
        def _set(conn: Connection) -> None:
            session = sessions.get(conn, session_id)
            if session is not None:
                sessions.set_declarations(conn, session, client_key_id, client_tools=tools)

        await self.write(_set)

    async def live_profiles(self) -> list[ProfileRecord]:
        return await self.read(profiles.all_active)

    async def session_states(self, session_ids: list[str]) -> dict[str, str]:
        """session id -> state for those the store knows (in one statement per 500 ids)."""
        found: dict[str, str] = {}
        for start in range(0, len(session_ids), 500):
            found.update(await self.read(sessions.states, session_ids[start:start + 500]))
        return found

    async def list_open_session_ids(self) -> list[str]:
        return await self.read(sessions.open_ids)
