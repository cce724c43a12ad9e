"""SQLite specifics of the store: file modes, pragmas, and the errors that mean "try again".

The conversation database holds every message of every session, so its
directory is created 0700 and its files are 0600 (SQLite gives the -wal and
-shm files the database file's mode). A database that is locked by another
process, or a disk that is full, is a temporary outage (`Unavailable`, with a
retry hint): clients get a 503 with Retry-After instead of a 500.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import ConnectionPoolEntry

from bae.common.errors import Unavailable

log = logging.getLogger("bae.session.store")

BUSY_TIMEOUT_MS = 2000
# A commit checkpoints the WAL only past this many pages (about 40 MB): the store's own thread
# does it long before (checkpoint.py), and this is the backstop should that thread fall behind.
WAL_AUTOCHECKPOINT_PAGES = 10_000
# Once a write found the database locked, the next ones wait this long only, so a
# database held by another process answers quickly instead of queueing every write.
LOCKED_BUSY_TIMEOUT_MS = 100
BUSY_RETRY_AFTER = 1
STORAGE_RETRY_AFTER = 5
PRIVATE_FILE = 0o600
_COMPANIONS = ("-wal", "-shm", "-journal")
_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
_STORAGE_CODES = (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)


class StoreUnavailable(Unavailable):
    """The database cannot serve this call now; `busy` tells a lock from a storage failure."""

    def __init__(self, detail: str, *, busy: bool) -> None:
        super().__init__(detail, retry_after=BUSY_RETRY_AFTER if busy else STORAGE_RETRY_AFTER)
        self.busy = busy


def is_file_database(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and bool(url.database) and url.database != ":memory:"


def prepare_files(database: str) -> None:
    """Create the directory 0700 and the database file 0600; tighten an existing file to 0600."""
    path = Path(database).expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    os.close(fd)
    for name in (str(path), *(f"{path}{suffix}" for suffix in _COMPANIONS)):
        try:
            if stat.S_IMODE(os.stat(name).st_mode) & 0o077:
                os.chmod(name, PRIVATE_FILE)
        except FileNotFoundError:
            continue
        except PermissionError as exc:  # another owner's file: say so, the store still opens
            log.warning("cannot restrict %s to mode 0600: %s", name, exc)


def make_sqlite_db(url: URL, synchronous: str) -> Engine:
    if url.database and is_file_database(url):
        prepare_files(url.database)
    db = create_engine(url, connect_args={"check_same_thread": False})

    @event.listens_for(db, "connect")
    def _pragmas(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        cursor = dbapi_connection.cursor()
        # First: a new database gives deleted pages back (store/retention.py, reclaim). The mode is
        # fixed once the file exists (journal_mode=WAL creates it); an existing database changes
        # mode only with a VACUUM (docs/operations.md, Retention), so it is not asked to here.
        if cursor.execute("PRAGMA page_count").fetchone()[0] == 0:
            cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        cursor.close()

    return db


def set_busy_timeout(driver_connection: sqlite3.Connection | None, milliseconds: int) -> None:
    if driver_connection is not None:
        driver_connection.execute(f"PRAGMA busy_timeout={milliseconds}")


def _primary_code(error: BaseException) -> int | None:
    """The primary SQLite result code of a sqlite3 error, or of the one SQLAlchemy wraps."""
    code = getattr(getattr(error, "orig", error), "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def is_busy(error: BaseException) -> bool:
    """Whether `error` says another connection holds the database."""
    return _primary_code(error) in _BUSY_CODES


def unavailable(error: OperationalError) -> StoreUnavailable | None:
    """The StoreUnavailable for a locked database or a failing disk; None for any other error."""
    primary = _primary_code(error)
    if primary in _BUSY_CODES:
        return StoreUnavailable("the database is busy; retry shortly", busy=True)
    if primary in _STORAGE_CODES:
        log.error("database write failed: %s", error.orig)
        return StoreUnavailable("the database cannot be written right now; retry later", busy=False)
    return None
