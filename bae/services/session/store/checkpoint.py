"""Checkpointing SQLite's write-ahead log from a thread of the store's own.

A checkpoint copies the pages the WAL holds back into the database file. SQLite runs one
inside the commit that takes the WAL past `wal_autocheckpoint` pages (1,000 by default):
on a long session that was every ~65 turns, that commit took about 7 ms, and every write
queued behind it waited as long. So the store checkpoints shortly after its writes from a
thread of its own, in PASSIVE mode, which waits for no reader or writer. Once a checkpoint
has copied the whole WAL, the next commit starts it again from its beginning, so the file
stays about as large as what was written between two checkpoints. The writer's automatic
checkpoint stays as a backstop at a much larger WAL (sqlite.py: WAL_AUTOCHECKPOINT_PAGES).
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Engine
from sqlalchemy.pool import PoolProxiedConnection

from bae.services.session.store.sqlite import is_busy

log = logging.getLogger("bae.session.store")

# At most one checkpoint per this many seconds: a burst of writes is checkpointed once.
CHECKPOINT_PACE = 0.2
# What closing waits for a checkpoint under way (a stalled disk must not hold up shutdown).
CLOSE_WAIT = 5.0


class WalCheckpointer:
    """Checkpoints the database `db` (a file, in WAL mode) CHECKPOINT_PACE after a write."""

    def __init__(self, db: Engine) -> None:
        self._db = db
        self._wrote = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bae-store-checkpoint", daemon=True)
        self._thread.start()

    def wrote(self) -> None:
        """A write was committed (from any thread): checkpoint soon."""
        self._wrote.set()

    def close(self) -> None:
        """Stop, once a checkpoint under way has finished."""
        self._stopping.set()
        self._wrote.set()
        self._thread.join(CLOSE_WAIT)

    def _run(self) -> None:
        connection: PoolProxiedConnection | None = None
        try:
            while True:
                self._wrote.wait()
                if self._stopping.wait(CHECKPOINT_PACE):
                    return
                self._wrote.clear()  # a write from now on asks for the next checkpoint
                connection = self._checkpoint(connection)
        finally:
            if connection is not None:
                connection.close()

    def _checkpoint(self, connection: PoolProxiedConnection | None) -> PoolProxiedConnection | None:
        """One PASSIVE checkpoint; the connection to use next time (None after it failed)."""
        try:
            if connection is None:
                connection = self._db.raw_connection()
            connection.cursor().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            return connection
        except Exception as exc:  # sqlite3's, or SQLAlchemy's when the connection could not open
            # The WAL keeps every page until a checkpoint copied it: nothing is lost, the next write asks again.
            log.log(logging.DEBUG if is_busy(exc) else logging.WARNING,
                    "checkpointing the database failed: %s; the next write tries again", exc)
            if connection is not None:
                connection.close()
            return None
