"""Session leases between two replicas sharing one store (SQLite file and PostgreSQL)."""

from __future__ import annotations

import asyncio

import pytest

from bae.services.session.engine.ownership import NotOwner, Ownership
from bae.services.session.store import Store, sessions
from testkit.postgres_support import STORES, store_url  # noqa: F401 - the fixture

# Each test on a SQLite file (unit) and on PostgreSQL (postgres).
pytestmark = pytest.mark.parametrize("store_url", STORES, indirect=True)


@pytest.fixture
async def store(store_url):  # noqa: F811 - the fixture
    store = await Store.open(store_url)
    yield store
    await store.close()


async def open_session(store: Store) -> str:
    return await store.write(
        lambda conn: sessions.create(
            conn, client_key_id="key_a", profile_id="pro_a", state="open", client_version=None,
            client_tools=[], sandbox_tools=[], subagent_tools=[], compaction=None,
        )
    )


class Replica:
    """An Ownership with recorded callbacks."""

    def __init__(self, store: Store, address: str, lease: float) -> None:
        self.lost: list[set[str]] = []
        self.adopted: list[str] = []
        self.ownership = Ownership(store=store, address=address, lease_seconds=lease,
                                   on_lost=self._lost, on_adopt=self._adopt)

    async def _lost(self, session_ids: set[str]) -> None:
        self.lost.append(set(session_ids))

    async def _adopt(self, session_id: str) -> None:
        self.adopted.append(session_id)


async def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_one_owner_at_a_time_and_placement_by_load(store):
    a, b = Replica(store, "10.0.0.1:50051", 30), Replica(store, "10.0.0.2:50051", 30)
    await a.ownership.start()
    await b.ownership.start()
    try:
        first, second = await open_session(store), await open_session(store)
        await a.ownership.claim(first)
        with pytest.raises(NotOwner) as refused:
            await b.ownership.claim(first)
        assert refused.value.address == "10.0.0.1:50051"
        # b holds nothing yet: it is where the next session goes, whoever asks.
        assert (await a.ownership.least_loaded()).id == "10.0.0.2:50051"
        await b.ownership.claim(second)
        assert {r.id: r.sessions for r in await a.ownership.replicas()} == {"10.0.0.1:50051": 1, "10.0.0.2:50051": 1}
        # A session that is not open has no live state to own: nothing is claimed.
        await a.ownership.claim("ses_unknown")
        assert "ses_unknown" not in a.ownership.held
    finally:
        await a.ownership.stop()
        await b.ownership.stop()
    # Replicas that stop give their sessions up at once.
    assert await a.ownership.replicas() == []


async def test_a_dead_owners_sessions_are_adopted_and_it_is_fenced(store):
    a, b = Replica(store, "10.0.0.1:50051", 0.6), Replica(store, "10.0.0.2:50051", 0.6)
    await a.ownership.start()
    session_id = await open_session(store)
    await a.ownership.claim(session_id)
    await a.ownership._tasks.cancel()  # a stops beating, as a stalled or dead process would
    await b.ownership.start()
    try:
        await wait_for(lambda: b.adopted == [session_id])
        assert session_id in b.ownership.held
        with pytest.raises(NotOwner):  # a's own cache is stale, but the store says b
            a.ownership.held.discard(session_id)
            await a.ownership.claim(session_id)
        # Had a woken up still believing it owned the session, its next beat drops it.
        a.ownership.held.add(session_id)
        await a.ownership._beat()
        await a.ownership._check_held()
        assert a.lost == [{session_id}] and session_id not in a.ownership.held
    finally:
        await b.ownership.stop()


async def test_two_replicas_claiming_a_new_session_at_once_agree_on_one_owner(store):
    replicas = [Replica(store, f"10.0.0.{n}:50051", 30) for n in (1, 2)]
    for replica in replicas:
        await replica.ownership.start()
    try:
        for _ in range(10):
            session_id = await open_session(store)
            outcomes = await asyncio.gather(*(r.ownership.claim(session_id) for r in replicas), return_exceptions=True)
            refused = [outcome for outcome in outcomes if isinstance(outcome, NotOwner)]
            assert len(refused) == 1 and outcomes.count(None) == 1, outcomes
            winner = replicas[outcomes.index(None)]
            assert refused[0].address == winner.ownership.address
    finally:
        for replica in replicas:
            await replica.ownership.stop()


async def test_a_duty_is_held_by_one_replica_at_a_time(store):
    a, b = Replica(store, "10.0.0.1:50051", 30).ownership, Replica(store, "10.0.0.2:50051", 30).ownership
    assert await a.take_duty("reconcile", 30)
    assert not await b.take_duty("reconcile", 30)
    assert await a.take_duty("reconcile", 30)  # renewed by its holder
    assert await b.take_duty("retention", 30)  # another duty is another lease
    await a.release_duty("reconcile")
    assert await b.take_duty("reconcile", 30)
    assert not await a.take_duty("reconcile", 30)
    await a.release_duty("reconcile")  # not a's to release: b still holds it
    assert not await a.take_duty("reconcile", 30)
    assert await b.take_duty("reconcile", 0)  # a hold that lapses at once ...
    assert await a.take_duty("reconcile", 30)  # ... is taken over


async def test_replicas_taking_a_duty_at_once_agree_on_one_holder(store_url):  # noqa: F811 - the fixture
    """Each replica on a store (connection pool) of its own, as separate processes would be."""
    stores = [await Store.open(store_url) for _ in range(3)]
    try:
        replicas = [Replica(s, f"10.0.0.{n}:50051", 30).ownership for n, s in enumerate(stores)]
        for round_ in range(10):
            name = f"duty-{round_}"
            taken = await asyncio.gather(*(replica.take_duty(name, 30) for replica in replicas))
            assert taken.count(True) == 1, taken
            holder = replicas[taken.index(True)]
            await holder.release_duty(name)
            again = await asyncio.gather(*(replica.take_duty(name, 30) for replica in replicas))
            assert again.count(True) == 1, again
    finally:
        for opened in stores:
            await opened.close()
