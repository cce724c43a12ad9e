"""Usage totals a replica follows (engine/budgets.py, Spend): read once, then kept by the charges
the replica records; a read that a charged write overlapped, or a failed write, makes the next
check read again; a key's day is read again once KEY_TOTALS_MAX_AGE old."""

from __future__ import annotations

import asyncio

import pytest

from bae.common.limits import Limits
from bae.services.session.engine.budgets import KeySpends, Spend, exhausted
from bae.services.session.store.usage import Charge, Totals

CHARGE = Charge("key_a", "pro_a", input_tokens=10, output_tokens=5, provider_calls=1, cost_usd=0.1)


class CountingStore:
    """The two reads budgets make, counted; a read may be held until `release` is set."""

    def __init__(self, totals: Totals) -> None:
        self.stored = totals
        self.reads = 0
        self.key_reads = 0
        self.release: asyncio.Event | None = None

    async def read_session(self) -> Totals:
        return await self.session_usage("ses_a")

    async def session_usage(self, session_id: str) -> Totals:
        self.reads += 1
        seen = self.stored
        if self.release is not None:
            await self.release.wait()
        return seen

    async def key_usage_today(self, client_key_id: str) -> Totals:
        self.key_reads += 1
        return Totals(output_tokens=7)


async def test_read_once_then_kept_by_the_charges_recorded():
    store = CountingStore(Totals(input_tokens=100, cost_usd=0.2))
    spend = Spend()
    assert await spend.totals(store.read_session) == Totals(input_tokens=100, cost_usd=0.2)
    for _ in range(8):
        with spend.charging(CHARGE):
            pass  # the write that records the charge succeeded
    with spend.charging(None):  # a write that records no charge changes nothing
        pass
    totals = await spend.totals(store.read_session)
    assert store.reads == 1
    assert (totals.input_tokens, totals.output_tokens, totals.provider_calls) == (180, 40, 8)
    assert totals.cost_usd == 1.0  # in whole billionths, as the store sums it: not 0.9999999999999999


async def test_a_read_overlapped_by_a_charged_write_is_used_once():
    store = CountingStore(Totals(input_tokens=100))
    store.release = asyncio.Event()
    spend = Spend()
    reading = asyncio.ensure_future(spend.totals(store.read_session))
    await asyncio.sleep(0)
    with spend.charging(CHARGE):  # commits while the read is under way: the read may have missed it
        store.stored = Totals(input_tokens=110)
    store.release.set()
    assert (await reading).input_tokens == 100
    store.release = None
    assert (await spend.totals(store.read_session)).input_tokens == 110  # read again, not 100 + 10 added
    assert store.reads == 2
    assert (await spend.totals(store.read_session)).input_tokens == 110
    assert store.reads == 2


async def test_a_failed_charged_write_makes_the_next_check_read_again():
    store = CountingStore(Totals(input_tokens=100))
    spend = Spend()
    await spend.totals(store.read_session)
    with pytest.raises(asyncio.CancelledError):
        with spend.charging(CHARGE):  # cancelled while the store wrote: recorded or not, unknown
            store.stored = Totals(input_tokens=110)
            raise asyncio.CancelledError()
    assert (await spend.totals(store.read_session)).input_tokens == 110
    assert store.reads == 2


async def test_exhausted_reads_only_what_the_budgets_set_need():
    store = CountingStore(Totals(input_tokens=100))
    spend = Spend()
    keys = KeySpends(max_age=3600)
    spends = {"session_spend": spend, "key_spends": keys}
    assert await exhausted(store, Limits(), "ses_a", "key_a", **spends) is None
    assert (store.reads, store.key_reads) == (0, 0)  # no budget set: nothing read
    stop = await exhausted(store, Limits(session_tokens=100), "ses_a", "key_a", **spends)
    assert stop is not None and (stop.budget, stop.used, stop.limit) == ("session_tokens", 100, 100)
    for _ in range(3):
        stop = await exhausted(store, Limits(session_tokens=1000, key_daily_tokens=7), "ses_a", "key_a", **spends)
        assert stop is not None and stop.message == "budget_exhausted: key_daily_tokens 7/7"
    assert (store.reads, store.key_reads) == (1, 1)
    # Without spends (a session this replica does not hold) each check reads.
    await exhausted(store, Limits(session_tokens=1000, key_daily_tokens=8), "ses_a", "key_a")
    assert (store.reads, store.key_reads) == (2, 2)


async def test_a_keys_day_is_read_again_once_old_and_follows_this_replicas_charges():
    store = CountingStore(Totals())
    keys = KeySpends(max_age=0.05)
    read = lambda: store.key_usage_today("key_a")  # noqa: E731
    assert (await keys.of("key_a").totals(read)).output_tokens == 7
    with keys.charging(CHARGE):  # this replica's own charge counts at once
        pass
    with keys.charging(None):
        pass
    assert (await keys.of("key_a").totals(read)).output_tokens == 12
    assert store.key_reads == 1
    await asyncio.sleep(0.06)  # other replicas' charges: seen when the day is read again
    assert (await keys.of("key_a").totals(read)).output_tokens == 7
    assert store.key_reads == 2
    assert keys.of("key_b") is not keys.of("key_a")
