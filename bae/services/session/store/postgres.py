"""PostgreSQL specifics of the store: the asyncpg connection pool, and the errors that mean "try again".

Users write `postgresql://user:password@host:port/db`; the store runs it on
asyncpg through SQLAlchemy's asyncio Engine, with a pool. A transaction is
`fn(conn, *args)` run by `AsyncConnection.run_sync`, so the store's functions
are the same synchronous functions SQLite runs on its threads.

An unreachable server, one that is starting or shutting down, one out of
connections or disk, and a dropped connection are outages: callers get a 503
with Retry-After, never a 500. The URL's password never reaches a log line:
only `URL.render_as_string(hide_password=True)` is ever printed.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

from sqlalchemy import Connection
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bae.common.errors import UsageError
from bae.services.session.store.locks import INFO_KEY, Held, SessionLocks
from bae.services.session.store.sqlite import StoreUnavailable

log = logging.getLogger("bae.session.store")

T = TypeVar("T")

DRIVER = "postgresql+asyncpg"
POOL_SIZE = 10
POOL_OVERFLOW = 10
POOL_TIMEOUT = 10  # seconds a call waits for a pooled connection before it is a 503
CONNECT_TIMEOUT = 5
# SQLSTATE classes and codes that mean the server cannot serve now (retrying later can succeed).
_UNAVAILABLE_CLASSES = ("08", "53", "57")  # connection exception, insufficient resources, operator intervention
_BUSY_CODES = ("40001", "40P01", "55P03")  # serialization failure, deadlock, lock not available
_READ_ONLY = "25006"  # a standby, or a server in read-only mode


def is_postgres(url: URL) -> bool:
    return url.get_backend_name() in ("postgresql", "postgres")


def asyncpg_url(url: URL) -> URL:
    """The URL users write (postgresql://, postgres://, or already +asyncpg) on the asyncpg driver."""
    if url.drivername not in ("postgresql", "postgres", DRIVER):
        raise UsageError(f"unsupported PostgreSQL driver {url.drivername!r}: write the URL as postgresql://…")
    return url.set(drivername=DRIVER)


def make_postgres_db(url: URL) -> AsyncEngine:
    return create_async_engine(
        asyncpg_url(url),
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        pool_timeout=POOL_TIMEOUT,
        pool_pre_ping=True,
        connect_args={"timeout": CONNECT_TIMEOUT},
    )


def _sqlstate(error: DBAPIError) -> str:
    orig = error.orig
    return str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")


def unavailable(error: BaseException) -> StoreUnavailable | None:
    """The StoreUnavailable for a server that cannot serve this call now; None for any other error."""
    if isinstance(error, (OSError, TimeoutError, PoolTimeout)):
        log.warning("database unreachable: %s", type(error).__name__)
        return StoreUnavailable("the database is unavailable; retry later", busy=False)
    if not isinstance(error, DBAPIError):
        return None
    state = _sqlstate(error)
    if state in _BUSY_CODES:
        return StoreUnavailable("the database is busy; retry shortly", busy=True)
    if (
        error.connection_invalidated
        or state[:2] in _UNAVAILABLE_CLASSES
        or state == _READ_ONLY
        or (not state and isinstance(error, (OperationalError, InterfaceError)))
    ):
        # The SQLSTATE and the exception type name the cause; the message may carry host names.
        log.warning("database unavailable: %s (SQLSTATE %s)", type(error.orig).__name__, state or "none")
        return StoreUnavailable("the database is unavailable; retry later", busy=False)
    return None


def _holding(conn: Connection, held: Held, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    """`fn(conn, *args)`, with the session locks it takes recorded in `held` (released after the commit)."""
    # The dict is taken once: after a failure that invalidated the connection, `conn.info` itself
    # raises (PendingRollbackError), which would hide the failure unavailable() maps to a 503.
    info = conn.info
    info[INFO_KEY] = held
    try:
        return fn(conn, *args)
    finally:
        info.pop(INFO_KEY, None)


class PostgresBackend:
    """Transactions on pooled connections; a process's writes to one session take turns (locks.py)."""

    def __init__(self, db: AsyncEngine) -> None:
        self.db = db
        self._locks = SessionLocks()

    async def transaction(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """`fn(conn, *args)` in one transaction on a pooled connection."""
        held = Held(self._locks)
        try:
            async with self.db.connect() as conn, conn.begin():
                return await conn.run_sync(_holding, held, fn, args)
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            outage = unavailable(exc)
            if outage is None:
                raise
            raise outage from None
        finally:
            held.release()

    async def run_on_connection(self, fn: Callable[[Connection], T]) -> T:
        """`fn(conn)` on a connection of its own, which manages its transactions itself."""
        async with self.db.connect() as conn:
            return await conn.run_sync(fn)

    async def close(self) -> None:
        await self.db.dispose()
