"""Usage totals in the store: written with the events that record the responses, read summed.
Against a real SQLite file and a real PostgreSQL server."""

from __future__ import annotations

import pytest

from bae.common.jsontext import RawJson
from bae.common.timefmt import now
from bae.services.session.store import Store, sessions, usage
from bae.services.session.store.usage import Charge, Totals
from testkit.postgres_support import STORES, store_url  # noqa: F401 - the fixture

pytestmark = pytest.mark.parametrize("store_url", STORES, indirect=True)

RESPONSE = (None, "provider.response", RawJson('{"ok":true}'))


@pytest.fixture
async def store(store_url):  # noqa: F811 - the fixture
    store = await Store.open(store_url)
    yield store
    await store.close()


async def new_session(store: Store, key: str = "key_a", profile: str = "pro_a") -> str:
    return await store.write(
        lambda conn: sessions.create(
            conn, client_key_id=key, profile_id=profile, state="open", client_version=None,
            client_tools=[], sandbox_tools=[], subagent_tools=[], compaction=None,
        )
    )


async def test_charges_add_up_per_session_key_and_day(store):
    first, second = await new_session(store), await new_session(store, key="key_b", profile="pro_b")
    await store.append_events(first, [RESPONSE], charge=Charge("key_a", "pro_a", input_tokens=10, output_tokens=5,
                                                                cache_read_input_tokens=100, provider_calls=1, turns=1,
                                                                cost_usd=0.000123))
    # A second key acting on the same session, an unpriced response: the cost stays what the first made.
    await store.append_events(first, [RESPONSE, RESPONSE], charge=Charge("key_b", "pro_a", input_tokens=1,
                                                                          output_tokens=2, cache_creation_input_tokens=7,
                                                                          provider_calls=2))
    await store.append_events(second, [RESPONSE], charge=Charge("key_b", "pro_b", output_tokens=3, provider_calls=1))
    await store.append_events(second, [(None, "session.error", {})])  # no charge: nothing added

    totals = await store.read(usage.session_totals, first)
    assert totals == Totals(11, 7, 100, 7, 3, 1, 0.000123)
    assert totals.tokens == 125
    assert await store.read(usage.session_totals, second) == Totals(0, 3, 0, 0, 1, 0, None)
    assert await store.read(usage.session_totals, "ses_none") == Totals()
    assert await store.read(usage.key_day_totals, "key_b") == Totals(1, 5, 0, 7, 3, 0, None)
    assert await store.read(usage.key_day_totals, "key_b", "2000-01-01") == Totals()

    today = now()[:10]
    by_key = await store.read(usage.grouped, "key", None, None, None, 10)
    assert by_key == [("key_a", Totals(10, 5, 100, 0, 1, 1, 0.000123)), ("key_b", Totals(1, 5, 0, 7, 3, 0, None))]
    by_profile = await store.read(usage.grouped, "profile", today, today, None, 10)
    assert [group for group, _ in by_profile] == ["pro_a", "pro_b"]
    assert await store.read(usage.grouped, "day", None, None, None, 10) == [(today, Totals(11, 10, 100, 7, 4, 1, 0.000123))]
    # Pages: after a key, and days outside the range.
    assert [g for g, _ in await store.read(usage.grouped, "key", None, None, "key_a", 10)] == ["key_b"]
    assert await store.read(usage.grouped, "key", "2000-01-01", "2000-01-02", None, 10) == []


async def test_cost_sums_exactly(store):
    sid = await new_session(store)
    for _ in range(10):
        await store.append_events(sid, [RESPONSE], charge=Charge("key_a", "pro_a", provider_calls=1, cost_usd=0.1))
    # In billionths of a dollar: ten 0.1s make exactly 1.0, not 0.9999999999999999.
    assert (await store.read(usage.session_totals, sid)).cost_usd == 1.0


async def test_a_refused_append_adds_nothing(store):
    sid = await new_session(store)
    charge = Charge("key_a", "pro_a", input_tokens=5, provider_calls=1)
    await store.append_events(sid, [RESPONSE], charge=charge)

    def refused(conn):
        usage.append_charged(conn, sid, [RESPONSE], None, charge)
        raise RuntimeError("the transaction fails after the charge")

    with pytest.raises(RuntimeError):
        await store.write(refused)
    assert await store.read(usage.session_totals, sid) == Totals(5, 0, 0, 0, 1, 0, None)
    assert len(await store.list_events(sid, 0, 10)) == 1


async def test_compaction_charges_with_its_records(store):
    sid = await new_session(store)
    views = await store.append_compaction(
        sid, "key_a", [RESPONSE], {"role": "user", "content": "p"}, {"role": "assistant", "content": "s"}, {},
        charge=Charge("key_a", "pro_a", input_tokens=40, output_tokens=8, provider_calls=1),
    )
    assert [view["event_type"] for view in views][-1] == "session.compaction.completed"
    assert await store.read(usage.session_totals, sid) == Totals(40, 8, 0, 0, 1, 0, None)


async def test_totals_plus_adds_a_charge_as_the_store_does(store):
    # What a live session keeps in memory (engine/budgets.py) must equal what the store sums.
    sid = await new_session(store)
    kept = await store.session_usage(sid)
    charges = [
        Charge("key_a", "pro_a", provider_calls=1, turns=1),  # a failed call: no usage, no price
        Charge("key_a", "pro_a", input_tokens=3, output_tokens=4, cache_read_input_tokens=5,
               cache_creation_input_tokens=6, provider_calls=1, cost_usd=0.0000001234),
        Charge("key_b", "pro_a", output_tokens=9, provider_calls=1, cost_usd=1 / 3),
        Charge("key_a", "pro_a", input_tokens=1, provider_calls=1),
    ]
    for charge in charges:
        await store.append_events(sid, [RESPONSE], charge=charge)
        kept = kept.plus(charge)
        assert kept == await store.session_usage(sid)
