"""SQLite's writer commits the calls that queued while it was busy together (group commit), and each call
still ends as it would have alone: its result or its own exception, nothing of a failed call written."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest
from sqlalchemy import Connection

from bae.services.session.store import Store, events, sessions
from bae.services.session.store.sqlite import StoreUnavailable

pytestmark = pytest.mark.unit


@pytest.fixture
async def store(tmp_path):
    store = await Store.open(f"sqlite:///{tmp_path}/bae.db")
    yield store
    await store.close()


def create_session(conn: Connection) -> str:
    return sessions.create(
        conn, client_key_id="key_a", profile_id="pro_a", state="open", client_version=None,
        client_tools=[], sandbox_tools=[], subagent_tools=[], compaction={"mode": "client", "prompt": None},
    )


async def trace_writer(store: Store) -> list[str]:
    """Every statement the writer's connection runs from now on."""
    statements: list[str] = []
    await store.write(lambda conn: conn.connection.driver_connection.set_trace_callback(statements.append))
    return statements


async def in_one_group(store: Store, *calls) -> list:
    """Each of `calls` (a coroutine function) started while a call keeps the writer thread busy, so
    they queue and run as one group once it is released; their outcomes, exceptions included."""
    release = threading.Event()
    holding = asyncio.create_task(store.write(lambda conn: release.wait(10)))
    await asyncio.sleep(0.05)
    tasks = [asyncio.create_task(call()) for call in calls]
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in tasks)  # nothing is answered before its commit
    release.set()
    await holding
    return await asyncio.gather(*tasks, return_exceptions=True)


def appending(store: Store, sid: str, event_type: str):
    return lambda: store.append_events(sid, [(None, event_type, {})])


async def event_types(store: Store, sid: str) -> list[str]:
    return [view["event_type"] for _, view in await store.list_events(sid, 0, 100)]


async def test_calls_queued_behind_a_busy_writer_commit_together(store):
    sid = await store.write(create_session)
    statements = await trace_writer(store)
    views = await in_one_group(store, *(appending(store, sid, f"e{index}") for index in range(5)))
    assert [view[0]["event_type"] for view in views] == [f"e{index}" for index in range(5)]  # in call order
    assert await event_types(store, sid) == [f"e{index}" for index in range(5)]
    # The holding call wrote nothing (no transaction); the five appends are one transaction.
    assert [s for s in statements if s in ("BEGIN", "COMMIT")] == ["BEGIN", "COMMIT"]
    assert not any(s.startswith("SAVEPOINT") for s in statements)


async def test_a_call_that_raises_in_a_group_leaves_no_trace_and_the_others_commit(store):
    sid = await store.write(create_session)

    def append_then_fail(conn: Connection) -> None:
        events.append(conn, sid, [(None, "half-written", {})])
        raise ValueError("refused after writing")

    before, failing, after = await in_one_group(
        store, appending(store, sid, "before"), lambda: store.write(append_then_fail), appending(store, sid, "after"))
    assert isinstance(failing, ValueError) and str(failing) == "refused after writing"
    assert not isinstance(before, BaseException) and not isinstance(after, BaseException)
    assert await event_types(store, sid) == ["before", "after"]
    # Each got the views of what it wrote: the ones of the rolled-back group run are gone.
    assert [view["id"] for view in [*before, *after]] == [view["id"] for _, view in await store.list_events(sid, 0, 100)]


async def test_a_call_with_a_broken_statement_fails_alone(store):
    """A database error of the call's own (not the database's state) fails that call only."""
    sid = await store.write(create_session)
    _, broken, _ = await in_one_group(
        store, appending(store, sid, "good"),
        lambda: store.write(lambda conn: conn.exec_driver_sql("INSERT INTO no_such_table VALUES (1)")),
        appending(store, sid, "also good"))
    assert "no such table" in str(broken)
    assert await event_types(store, sid) == ["good", "also good"]


async def test_a_group_on_a_locked_database_fails_whole_and_writes_nothing(tmp_path, store):
    sid = await store.write(create_session)
    other = sqlite3.connect(tmp_path / "bae.db", isolation_level=None)

    async def lock_then_append(event_type: str) -> object:
        if event_type == "e0":  # the first of the group takes the lock away before the group runs
            other.execute("BEGIN IMMEDIATE")
        return await store.append_events(sid, [(None, event_type, {})])

    try:
        outcomes = await in_one_group(store, *(lambda name=f"e{index}": lock_then_append(name) for index in range(3)))
        assert all(isinstance(outcome, StoreUnavailable) and outcome.busy for outcome in outcomes), outcomes
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert await event_types(store, sid) == []
    await store.append_events(sid, [(None, "after the lock", {})])
    assert await event_types(store, sid) == ["after the lock"]


async def test_a_lone_call_runs_in_a_transaction_of_its_own(store):
    sid = await store.write(create_session)
    statements = await trace_writer(store)
    await store.append_events(sid, [(None, "alone", {})])
    assert not any(s.startswith("SAVEPOINT") for s in statements)
    assert statements.count("COMMIT") == 1
