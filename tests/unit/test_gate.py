"""The FIFO turn gate with parked (paused) turns."""

import asyncio
import time

import pytest

from services.session.engine.gate import ParkedTurn, TurnGate, TurnInProgress


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
