"""Durability and availability on SQLite: the synchronous mode, private files, a database locked by another
connection, and the WAL's checkpoints (PostgreSQL's outages: test_postgres_outage.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from bae.common.errors import Unavailable, UsageError
from bae.common.settings import load_settings
from bae.services.session.store import Store, sessions
from bae.services.session.store.sqlite import WAL_AUTOCHECKPOINT_PAGES, StoreUnavailable

pytestmark = pytest.mark.unit


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def synchronous_of(store: Store) -> int:
    return await store.write(lambda conn: conn.exec_driver_sql("PRAGMA synchronous").scalar())


async def new_session(store: Store) -> str:
    return await store.write(
        lambda conn: sessions.create(
            conn, client_key_id="key_a", profile_id="pro_a", state="open", client_version=None,
            client_tools=[], sandbox_tools=[], subagent_tools=[], compaction={"mode": "client", "prompt": None},
        )
    )


async def test_synchronous_full_by_default_and_configurable(tmp_path):
    assert load_settings({}).sqlite_synchronous == "FULL"
    store = await Store.open(f"sqlite:///{tmp_path}/a.db")
    try:
        assert await synchronous_of(store) == 2  # FULL
    finally:
        await store.close()
    chosen = load_settings({"BAE_SQLITE_SYNCHRONOUS": " normal "}).sqlite_synchronous
    store = await Store.open(f"sqlite:///{tmp_path}/b.db", chosen)
    try:
        assert await synchronous_of(store) == 1  # NORMAL
    finally:
        await store.close()


def test_synchronous_setting_rejects_unknown_modes():
    with pytest.raises(UsageError, match='BAE_SQLITE_SYNCHRONOUS: "sometimes" is not one of OFF, NORMAL, FULL, EXTRA'):
        load_settings({"BAE_SQLITE_SYNCHRONOUS": "sometimes"})


async def test_database_directory_and_files_are_private(tmp_path):
    directory = tmp_path / "state"
    umask = os.umask(0o022)  # the usual one, under which files would be world-readable
    try:
        store = await Store.open(f"sqlite:///{directory}/bae.db")
    finally:
        os.umask(umask)
    try:
        await new_session(store)
        files = sorted(p.name for p in directory.iterdir())
        assert files == ["bae.db", "bae.db-shm", "bae.db-wal"]
        assert mode(directory) == 0o700
        assert {name: mode(directory / name) for name in files} == {name: 0o600 for name in files}
    finally:
        await store.close()


async def test_an_existing_world_readable_database_is_tightened(tmp_path):
    path = tmp_path / "bae.db"
    store = await Store.open(f"sqlite:///{path}")
    await store.close()
    os.chmod(path, 0o644)
    store = await Store.open(f"sqlite:///{path}")
    try:
        assert mode(path) == 0o600
    finally:
        await store.close()


@pytest.fixture
async def locked(tmp_path):
    """A store whose database another connection holds a write lock on (BEGIN IMMEDIATE)."""
    path = tmp_path / "bae.db"
    store = await Store.open(f"sqlite:///{path}")
    sid = await new_session(store)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    yield store, sid, other
    other.close()
    await store.close()


async def test_a_locked_database_is_a_503_with_retry_after(locked):
    store, sid, other = locked
    with pytest.raises(StoreUnavailable) as caught:
        await store.append_events(sid, [(None, "x", {})])
    problem = caught.value
    assert isinstance(problem, Unavailable)  # the kind the API answers 503 for
    assert (problem.reason, problem.retry_after, problem.busy) == ("service_unavailable", 1, True)
    assert problem.detail == "the database is busy; retry shortly"
    # Released: writes work again and nothing half-written shows.
    other.execute("ROLLBACK")
    await store.append_events(sid, [(None, "y", {})])
    assert [view["event_type"] for _, view in await store.list_events(sid, 0, 10)] == ["y"]


async def test_reads_do_not_wait_behind_a_blocked_write(locked):
    store, sid, _ = locked
    write = asyncio.create_task(store.append_events(sid, [(None, "x", {})]))
    await asyncio.sleep(0.05)  # the write is now waiting for the lock on the writer thread
    session = await store.get_session(sid)
    assert session.id == sid and not write.done()
    with pytest.raises(StoreUnavailable):
        await write


async def test_a_read_that_would_wait_moves_from_the_loop_to_the_reader_thread(tmp_path):
    # Reads run on the loop's thread with a busy timeout of 0. In WAL mode a reader needs no lock
    # a writer holds, so only rare states (WAL recovery after a crash, another process holding the
    # file exclusively) make it busy; such a read is not refused but handed to the reader thread.
    store = await Store.open(f"sqlite:///{tmp_path}/bae.db")
    sid = await new_session(store)
    backend = store._backend
    loop_reader = backend.loop_reader
    used = []

    def busy_once(fn, args):
        used.append(fn)
        if len(used) == 1:
            raise StoreUnavailable("the database is busy; retry shortly", busy=True)
        return loop_reader.transaction(fn, args)

    backend.loop_reader = type("BusyOnce", (), {"transaction": staticmethod(busy_once), "close": loop_reader.close})()
    try:
        assert (await store.get_session(sid)).id == sid  # answered by the reader thread
        assert (await store.get_session(sid)).id == sid  # and the next read is the loop's again
        assert len(used) == 2
        timeout = await store.read(lambda conn: conn.exec_driver_sql("PRAGMA busy_timeout").scalar())
        assert timeout == 0  # the loop's own connection never waits
    finally:
        await store.close()


def rows_in_the_database_file_alone(path, table: str) -> int:
    """The rows of `table` a copy of the database file holds without its WAL: what checkpoints copied."""
    copy = path.parent / "copy-without-wal.db"
    shutil.copyfile(path, copy)
    db = sqlite3.connect(copy)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
            return 0  # not even the schema was copied yet
        return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        db.close()
        for name in (copy, Path(f"{copy}-wal"), Path(f"{copy}-shm")):
            name.unlink(missing_ok=True)


async def test_the_wal_is_checkpointed_by_the_stores_own_thread(tmp_path):
    """A commit checkpoints only as a backstop; the store's thread copies the WAL into the database
    file shortly after writes, with no further write and no connection closed."""
    path = tmp_path / "bae.db"
    others = checkpoint_threads()  # other tests' stores, some perhaps still closing
    store = await Store.open(f"sqlite:///{path}")
    try:
        backstop = await store.write(lambda conn: conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar())
        assert backstop == WAL_AUTOCHECKPOINT_PAGES > 1000  # SQLite's default would checkpoint inside commits
        written = [await new_session(store) for _ in range(3)]
        deadline = asyncio.get_running_loop().time() + 10
        while rows_in_the_database_file_alone(path, "sessions") < len(written):
            assert asyncio.get_running_loop().time() < deadline, "the WAL was never checkpointed"
            await asyncio.sleep(0.05)
    finally:
        await store.close()
    assert checkpoint_threads() <= others  # closing stopped this store's thread


def checkpoint_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "bae-store-checkpoint"}

