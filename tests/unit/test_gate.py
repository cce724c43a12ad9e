"""The FIFO turn gate with parked (paused) turns."""

import asyncio
import time

import pytest

from bae.services.session.engine.gate import KeyRevoked, ParkedTurn, TurnGate, TurnInProgress

pytestmark = pytest.mark.unit


def parked(owner="a", seconds=60.0):
    return ParkedTurn(owner=owner, deadline=time.monotonic() + seconds, tool_uses=[], server_results={})


async def test_waiters_are_served_in_arrival_order():
    gate = TurnGate()
    await gate.acquire("a")
    order = []

    async def take(name):
        await gate.acquire(name)
        order.append(name)
        gate.release()

    tasks = [asyncio.create_task(take(n)) for n in "bcd"]
    await asyncio.sleep(0.01)
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["b", "c", "d"]


async def test_owner_takes_back_a_parked_turn_ahead_of_the_queue():
    gate = TurnGate()
    await gate.acquire("a")
    gate.park(parked("a"))
    other = asyncio.create_task(gate.acquire("b"))
    await asyncio.sleep(0.01)
    claim = await gate.acquire("a")
    assert claim.parked is not None and not claim.reclaimed
    assert not other.done()
    gate.release()
    assert (await other).parked is None


async def test_a_queued_waiter_reclaims_an_expired_pause_without_a_new_arrival():
    gate = TurnGate()
    await gate.acquire("a")
    gate.park(parked("a", seconds=0.05))
    claim = await asyncio.wait_for(gate.acquire("b"), 2)
    assert claim.reclaimed and claim.parked.owner == "a"


async def test_compaction_fails_fast_on_a_live_pause_and_reclaims_an_expired_one():
    gate = TurnGate()
    await gate.acquire("a")
    gate.park(parked("a"))
    with pytest.raises(TurnInProgress):
        await gate.acquire_for_compaction()
    gate.parked.deadline = time.monotonic() - 1
    claim = await gate.acquire_for_compaction()
    assert claim.reclaimed


async def test_a_cancelled_waiter_passes_the_gate_on():
    gate = TurnGate()
    await gate.acquire("a")
    quitter = asyncio.create_task(gate.acquire("b"))
    stayer = asyncio.create_task(gate.acquire("c"))
    await asyncio.sleep(0.01)
    quitter.cancel()
    gate.release()
    assert (await asyncio.wait_for(stayer, 1)).parked is None


async def test_a_queued_caller_is_woken_by_the_release_itself_not_by_a_poll():
    gate = TurnGate()
    await gate.acquire("a")
    waiter = asyncio.create_task(gate.acquire("b"))
    await asyncio.sleep(0.01)
    gate.release()
    # One pass of the event loop is enough: no sleep-and-check interval stands between.
    for _ in range(3):
        await asyncio.sleep(0)
    assert waiter.done()


async def test_a_queued_compaction_fails_as_soon_as_the_running_turn_pauses():
    gate = TurnGate()
    await gate.acquire("a")
    compaction = asyncio.create_task(gate.acquire_for_compaction())
    await asyncio.sleep(0.01)
    gate.park(parked("a"))
    for _ in range(3):
        await asyncio.sleep(0)
    assert compaction.done()
    with pytest.raises(TurnInProgress):
        compaction.result()


async def test_a_queued_owner_takes_its_own_pause_when_its_running_turn_parks():
    gate = TurnGate()
    await gate.acquire("a")
    other = asyncio.create_task(gate.acquire("b"))
    await asyncio.sleep(0.01)
    own = asyncio.create_task(gate.acquire("a"))
    await asyncio.sleep(0.01)
    gate.park(parked("a"))
    claim = await asyncio.wait_for(own, 1)
    assert claim.parked is not None and not claim.reclaimed and claim.waited
    assert not other.done()
    gate.release()
    await asyncio.wait_for(other, 1)


async def test_closing_lets_every_waiter_through():
    gate = TurnGate()
    await gate.acquire("a")
    waiters = [asyncio.create_task(gate.acquire(name)) for name in "bc"]
    await asyncio.sleep(0.01)
    gate.close()
    claims = await asyncio.wait_for(asyncio.gather(*waiters), 1)
    assert all(claim.waited and claim.parked is None for claim in claims)


async def test_a_revoked_key_is_refused_in_the_queue_and_its_running_turn_parks_expired():
    gate = TurnGate()
    await gate.acquire("b")  # b's turn runs
    other = asyncio.create_task(gate.acquire("c"))
    queued = asyncio.create_task(gate.acquire("b"))
    await asyncio.sleep(0.01)
    gate.revoke("b")
    with pytest.raises(KeyRevoked):
        await asyncio.wait_for(queued, 1)  # woken by the revocation itself, while b's turn still runs
    with pytest.raises(KeyRevoked):
        await gate.acquire("b")
    assert not other.done()
    gate.park(parked("b"))  # b's running turn pauses: nobody may answer it, so it is reclaimable at once
    claim = await asyncio.wait_for(other, 1)
    assert claim.reclaimed and claim.parked.owner == "b"
