"""Schedules driven through the engine's ticker (engine/schedules.py) and fire (engine/fire.py):
the store is real (SQLite, and PostgreSQL), the provider steps scripted, no gateway and no servicer.
Passes are run by hand (`ticker.tick(now)`), so each test says which ticks are due."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

import pytest

from bae.common.timefmt import format_time
from bae.services.session.api.rest import ClientRestApi
from bae.services.session.engine.fire import TURN_CUT_OFF, Fire
from bae.services.session.engine.schedules import ScheduleTicker
from bae.services.session.engine.service import SessionEngine
from bae.services.session.store import Store, events, keys, leases, profiles, schedules, sessions
from bae.services.session.store.records import ScheduleRecord, ScheduleRunRecord
from testkit.fakes import FAKE_PROVIDERS, ScriptedSteps, Step, fake_engine, eventually
from testkit.postgres_support import STORES, store_url  # noqa: F401 - the fixture

pytestmark = [pytest.mark.engine, pytest.mark.parametrize("store_url", STORES, indirect=True)]

EVERY_SECOND = "* * * * * *"  # six fields: BAE_SCHEDULE_TEST_SECONDS


class Harness:
    def __init__(self, store: Store, engine: SessionEngine, steps: ScriptedSteps) -> None:
        self.store = store
        self.engine = engine
        self.steps = steps
        rest = ClientRestApi(
            store=store, auth=None, sessions=engine.registry, mcp=engine.mcp,  # type: ignore[arg-type]
            closer=engine.closer, spans=engine.spans, config=FAKE_PROVIDERS,
        )
        fire = Fire(
            store=store, registry=engine.registry, turns=engine.turns, mcp=engine.mcp, sandboxes=engine.sandboxes,
            closer=engine.closer, spans=engine.spans, vetting=rest,
        )
        self.ticker = ScheduleTicker(store=store, fire=fire, ownership=engine.ownership, test_seconds=True)

    async def schedule(self, *, since: float, cron: str = EVERY_SECOND, **fields: Any) -> ScheduleRecord:
        def create(conn) -> ScheduleRecord:
            profile = profiles.create(conn, {"name": f"p{time.monotonic_ns()}", "primary_provider": "mock",
                                             "fallback_providers": [], "mcp_servers": [], "allowed_tools": [],
                                             "available_sandboxes": []})
            minted = keys.mint_client(conn, "scheduler", profile.id)
            assert minted is not None
            body = {"name": "s", "profile_id": profile.id, "client_key_id": minted[1].id, "cron": cron,
                    "timezone": "UTC", "message": "run the report", "overlap": "skip", "catch_up": "latest",
                    "close_after": True, "enabled": True, **fields}
            return schedules.create(conn, body, since)

        return await self.store.write(create)

    async def runs(self, schedule_id: str) -> list[ScheduleRunRecord]:
        return [run for _, run in await self.store.read(schedules.runs_page, schedule_id, 0, 1000)]

    async def settled(self, schedule_id: str, count: int) -> list[ScheduleRunRecord]:
        async def done() -> bool:
            runs = await self.runs(schedule_id)
            return len(runs) == count and all(run.outcome != "running" for run in runs)

        await eventually(done)
        return await self.runs(schedule_id)

    async def kinds(self, session_id: str) -> list[str]:
        return [json.loads(view.json)["event_type"] for _, view in await self.store.list_events(session_id, 0, 1000)]


@pytest.fixture
async def harness(store_url) -> AsyncIterator[Harness]:  # noqa: F811 - the fixture
    store = await Store.open(store_url)
    steps = ScriptedSteps()
    engine = fake_engine(store, steps=steps)
    await engine.start()
    harness = Harness(store, engine, steps)
    yield harness
    await harness.ticker.stop()
    await engine.drain(5)
    await engine.stop()
    await store.close()



def whole_second(offset: float = 0.0) -> float:
    return float(int(time.time())) + offset


async def test_a_due_tick_opens_a_session_sends_the_message_and_closes_it(harness: Harness):
    now = whole_second(0.5)
    schedule = await harness.schedule(since=now - 1.0)  # one tick due: now - 0.5
    harness.steps.enqueue(Step.text("the report"))
    await harness.ticker.tick(now)
    (run,) = await harness.settled(schedule.id, 1)
    assert (run.outcome, run.detail) == ("completed", None)
    assert run.scheduled_for == format_time(datetime.fromtimestamp(now - 0.5, timezone.utc))
    assert run.session_id is not None
    assert await harness.kinds(run.session_id) == [
        "session.open", "session.driver.register", "client.message.send", "provider.request", "provider.response",
        "server.message.send", "session.close",
    ]
    session = await harness.store.get_session(run.session_id)
    assert session is not None and session.state == "closed"
    assert session.client_version == f"schedule {schedule.id}"
    assert harness.steps.sent[0].messages == [{"role": "user", "content": "run the report"}]


async def test_a_tick_is_claimed_once_however_many_passes_find_it(harness: Harness):
    now = whole_second(0.5)
    schedule = await harness.schedule(since=now - 1.0)
    tick = format_time(datetime.fromtimestamp(now - 0.5, timezone.utc))
    first = await harness.store.write(schedules.claim_tick, schedule, tick, "replica-a")
    second = await harness.store.write(schedules.claim_tick, schedule, tick, "replica-b")
    assert first is not None and second is None
    await harness.store.write(schedules.finish, first.id, "completed", None)
    await harness.ticker.tick(now)  # the same tick again: already claimed
    assert [run.id for run in await harness.runs(schedule.id)] == [first.id]


async def test_overlap_skip_records_a_skipped_run_while_the_previous_one_runs(harness: Harness):
    now = whole_second(0.5)
    schedule = await harness.schedule(since=now - 3.0)
    earlier = format_time(datetime.fromtimestamp(now - 2.5, timezone.utc))
    later = format_time(datetime.fromtimestamp(now - 1.5, timezone.utc))
    running = await harness.store.write(schedules.claim_tick, schedule, earlier, "replica-a")
    assert running is not None
    assert await harness.store.write(schedules.claim_tick, schedule, later, "replica-a") is None
    runs = await harness.runs(schedule.id)
    assert [(run.scheduled_for, run.outcome) for run in runs] == [(earlier, "running"), (later, "skipped")]
    assert runs[1].detail == f"the run {running.id} for {earlier} was still running"


async def test_after_downtime_catch_up_latest_runs_the_most_recent_missed_tick_once(harness: Harness):
    now = whole_second(0.5)
    schedule = await harness.schedule(since=now - 30.0)  # 30 ticks missed: longer than the 5 s gap
    await harness.ticker.tick(now)
    (run,) = await harness.settled(schedule.id, 1)
    assert run.scheduled_for == format_time(datetime.fromtimestamp(now - 0.5, timezone.utc))
    assert run.outcome == "completed"


async def test_after_downtime_catch_up_none_runs_nothing(harness: Harness):
    now = whole_second(0.5)
    schedule = await harness.schedule(since=now - 30.0, catch_up="none")
    await harness.ticker.tick(now)
    await asyncio.sleep(0.2)
    assert await harness.runs(schedule.id) == []
    current = await harness.store.read(schedules.get, schedule.id)
    assert current is not None and current.checked_through == now  # the missed ticks are behind it


async def test_a_run_left_by_a_stopped_replica_before_its_session_is_fired_by_another(harness: Harness):
    now = whole_second(0.5)
    schedule = await harness.schedule(since=now)  # nothing due: only the stranded run
    tick = format_time(datetime.fromtimestamp(now - 0.5, timezone.utc))
    stranded = await harness.store.write(schedules.claim_tick, schedule, tick, "10.0.0.9:50051")  # never beat
    assert stranded is not None
    await harness.ticker.tick(now)
    (run,) = await harness.settled(schedule.id, 1)
    assert (run.id, run.outcome, run.replica_id) == (stranded.id, "completed", harness.engine.ownership.replica_id)
    assert run.session_id is not None
    assert "server.message.send" in await harness.kinds(run.session_id)


async def test_a_run_whose_turn_died_with_its_replica_fails_from_its_log_and_is_closed(harness: Harness):
    now = whole_second(0.5)
    schedule = await harness.schedule(since=now)
    tick = format_time(datetime.fromtimestamp(now - 0.5, timezone.utc))
    stranded = await harness.store.write(schedules.claim_tick, schedule, tick, "10.0.0.9:50051")
    assert stranded is not None

    def opened_and_sent(conn) -> str:
        session_id = sessions.create(
            conn, client_key_id=schedule.client_key_id, profile_id=schedule.profile_id, state="open",
            client_version=None, client_tools=[], sandbox_tools=[], subagent_tools=[], compaction=None,
        )
        events.append(conn, session_id, [(schedule.client_key_id, "session.driver.register", {}),
                                          (schedule.client_key_id, "client.message.send",
                                           {"role": "user", "content": "run the report"})])
        schedules.set_session(conn, stranded.id, session_id)
        return session_id

    session_id = await harness.store.write(opened_and_sent)
    await harness.ticker.tick(now)
    (run,) = await harness.settled(schedule.id, 1)
    assert (run.outcome, run.detail, run.session_id) == ("failed", TURN_CUT_OFF, session_id)
    assert harness.steps.sent == []  # the message is never sent twice
    assert (await harness.kinds(session_id))[-1] == "session.close"


async def test_a_run_whose_session_a_live_replica_took_over_goes_to_that_replica(harness: Harness):
    now = whole_second(0.5)
    schedule = await harness.schedule(since=now)
    tick = format_time(datetime.fromtimestamp(now - 0.5, timezone.utc))
    stranded = await harness.store.write(schedules.claim_tick, schedule, tick, "10.0.0.9:50051")
    assert stranded is not None
    adopter = "10.0.0.8:50051"
    await harness.store.write(leases.heartbeat, adopter, adopter, "2026-01-01T00:00:00Z", time.time() + 60)

    def opened_and_adopted(conn) -> None:
        session_id = sessions.create(
            conn, client_key_id=schedule.client_key_id, profile_id=schedule.profile_id, state="open",
            client_version=None, client_tools=[], sandbox_tools=[], subagent_tools=[], compaction=None,
        )
        schedules.set_session(conn, stranded.id, session_id)
        leases.claim(conn, session_id, adopter, adopter, time.time())

    await harness.store.write(opened_and_adopted)
    await harness.ticker.tick(now)

    async def handed() -> bool:
        (run,) = await harness.runs(schedule.id)
        return run.replica_id == adopter

    await eventually(handed)
    (run,) = await harness.runs(schedule.id)
    assert run.outcome == "running"  # the adopter finishes it
    assert harness.steps.sent == []

async def test_a_revoked_key_fails_the_run_with_its_reason(harness: Harness):
    now = whole_second(0.5)
    schedule = await harness.schedule(since=now - 1.0)
    await harness.store.write(keys.revoke_client, schedule.client_key_id)
    await harness.ticker.tick(now)
    (run,) = await harness.settled(schedule.id, 1)
    assert run.outcome == "failed" and run.session_id is None
    assert run.detail == f"client key {schedule.client_key_id} is not an active key of the profile"


async def test_overlap_queue_opens_the_next_session_only_after_the_running_run_ended(harness: Harness):
    now = whole_second(0.5)
    schedule = await harness.schedule(since=now - 2.0, overlap="queue")  # two ticks due
    release = asyncio.Event()
    harness.steps.enqueue(Step.held(release, Step.text("first")), Step.text("second"))
    await harness.ticker.tick(now)

    async def first_waits() -> bool:
        return len(harness.steps.sent) == 1

    await eventually(first_waits)
    await asyncio.sleep(1.2)  # longer than QUEUE_POLL: the queued run had every chance to start
    first, second = await harness.runs(schedule.id)
    assert (first.outcome, second.outcome, second.session_id) == ("running", "running", None)
    assert len(harness.steps.sent) == 1
    release.set()
    first, second = await harness.settled(schedule.id, 2)
    assert (first.outcome, second.outcome) == ("completed", "completed")
    assert second.session_id is not None and second.session_id != first.session_id


async def test_a_turn_that_ends_the_session_in_error_fails_its_run(harness: Harness):
    now = whole_second(0.5)
    schedule = await harness.schedule(since=now - 1.0)
    harness.steps.enqueue(Step.all_failed())
    await harness.ticker.tick(now)
    (run,) = await harness.settled(schedule.id, 1)
    assert (run.outcome, run.detail) == ("failed", "the provider is currently unavailable; the session is in error")
    session = await harness.store.get_session(run.session_id)
    assert session is not None and session.state == "error"
