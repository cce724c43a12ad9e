"""HTTP trigger runs through the engine (engine/triggers.py, store/triggers.py): the store is real (SQLite,
and PostgreSQL), the provider steps scripted, no gateway and no servicer. The Idempotency-Key rules at
the store: a repeat answers the first run, another body is refused, concurrent starts make one run, a
key older than the window is released, and a refused open holds no key. A run left `running` by a
stopped replica is finished by a takeover pass (`runs.take_over()`, run by hand) from its session's log."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bae.common.errors import Conflict, Unprocessable
from bae.services.session.api.rest import ClientRestApi
from bae.services.session.engine.fire import TURN_CUT_OFF, Fire, ServerDeclarations
from bae.services.session.engine.service import SessionEngine
from bae.services.session.engine.triggers import TriggerRuns
from bae.services.session.store import Store, events, keys, leases, profiles, triggers
from bae.services.session.store.records import KeyRecord, TriggerRecord, TriggerRunRecord
from bae.services.session.store.triggers import Call, Repeated, Started
from testkit.fakes import FAKE_PROVIDERS, ScriptedSteps, Step, fake_engine, eventually
from testkit.postgres_support import STORES, store_url  # noqa: F401 - the fixture

pytestmark = [pytest.mark.engine, pytest.mark.parametrize("store_url", STORES, indirect=True)]

DAY = 24 * 3600.0


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
        self.runs = TriggerRuns(store=store, fire=fire, ownership=engine.ownership)

    async def trigger(self) -> tuple[TriggerRecord, KeyRecord]:
        def create(conn) -> tuple[TriggerRecord, KeyRecord]:
            profile = profiles.create(conn, {"name": f"p{time.monotonic_ns()}", "primary_provider": "mock",
                                             "fallback_providers": [], "mcp_servers": [], "allowed_tools": [],
                                             "available_sandboxes": []})
            minted = keys.mint_client(conn, "ci", profile.id)
            assert minted is not None
            trigger = triggers.create(conn, {"name": f"t{time.monotonic_ns()}", "profile_id": profile.id,
                                             "input_schema": "{}", "message_template": "go", "close_after": True})
            return trigger, minted[1]

        return await self.store.write(create)

    async def listed(self, trigger_id: str) -> list[TriggerRunRecord]:
        return [run for _, run in await self.store.read(triggers.runs_page, trigger_id, 0, 1000)]

    async def settled(self, trigger_id: str) -> TriggerRunRecord:
        async def done() -> bool:
            return all(run.outcome != "running" for run in await self.listed(trigger_id))

        await eventually(done)
        (run,) = await self.listed(trigger_id)
        return run

    async def left_by(
        self, replica_id: str, trigger: TriggerRecord, key: KeyRecord, logged: list[tuple[str, dict[str, Any]]]
    ) -> TriggerRunRecord:
        """A run as `replica_id` left it when it stopped: its session open with `logged` in its log."""

        def started(conn) -> TriggerRunRecord:
            outcome = triggers.start_run(
                conn, call(trigger, None), triggers.new_run_id(), replica_id, key,
                ServerDeclarations(client_version=f"trigger {trigger.id}"), self.runs.fire.vetting,
            )
            assert isinstance(outcome, Started) and outcome.run.session_id is not None
            items = [(key.id, "session.driver.register", {})] + [(key.id, kind, payload) for kind, payload in logged]
            if logged:
                events.append(conn, outcome.run.session_id, items)
            return outcome.run

        return await self.store.write(started)

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
    await harness.runs.stop()
    await engine.drain(5)
    await engine.stop()
    await store.close()


def call(trigger: TriggerRecord, key: str | None, digest: str = "body-a", at: float | None = None) -> Call:
    return Call(trigger.id, key, digest, "triage #1", time.time() if at is None else at, DAY)



STOPPED = "10.0.0.9:50051"  # a replica that never beat (or stopped beating)
USER = ("client.message.send", {"role": "user", "content": "triage #1"})


async def test_a_run_sends_its_message_records_completed_and_closes_the_session(harness: Harness):
    trigger, key = await harness.trigger()
    started = await harness.runs.open(trigger, key, call(trigger, None))
    assert isinstance(started, Started)
    harness.steps.enqueue(Step.text("done"))
    outcome = await harness.runs.run(trigger, started.run, key.id, None)
    assert outcome.message["role"] == "assistant"
    (run,) = await harness.listed(trigger.id)
    assert (run.outcome, run.detail, run.session_id) == ("completed", None, started.run.session_id)
    session = await harness.store.get_session(run.session_id or "")
    assert session is not None and session.state == "closed" and session.client_version == f"trigger {trigger.id}"
    assert harness.steps.sent[0].messages == [{"role": "user", "content": "triage #1"}]


async def test_a_repeated_key_answers_the_first_run_and_another_body_is_refused(harness: Harness):
    trigger, key = await harness.trigger()
    first = await harness.runs.open(trigger, key, call(trigger, "k1"))
    again = await harness.runs.open(trigger, key, call(trigger, "k1"))
    assert isinstance(first, Started) and isinstance(again, Repeated) and again.run.id == first.run.id
    with pytest.raises(Conflict) as refused:
        await harness.runs.open(trigger, key, call(trigger, "k1", digest="body-b"))
    assert refused.value.reason == "idempotency_key_reused"
    assert [run.id for run in await harness.listed(trigger.id)] == [first.run.id]


async def test_concurrent_starts_with_one_key_make_one_run_and_one_session(harness: Harness):
    trigger, key = await harness.trigger()
    outcomes = await asyncio.gather(*(harness.runs.open(trigger, key, call(trigger, "k1")) for _ in range(20)))
    assert sum(isinstance(outcome, Started) for outcome in outcomes) == 1
    assert {outcome.run.id for outcome in outcomes} == {outcomes[0].run.id}
    assert {outcome.run.session_id for outcome in outcomes} == {outcomes[0].run.session_id}
    assert len(await harness.listed(trigger.id)) == 1


async def test_a_key_older_than_the_window_is_released_and_starts_a_new_run(harness: Harness):
    trigger, key = await harness.trigger()
    old = await harness.runs.open(trigger, key, call(trigger, "k1", at=time.time() - DAY - 1))
    new = await harness.runs.open(trigger, key, call(trigger, "k1", digest="body-b"))
    assert isinstance(old, Started) and isinstance(new, Started) and new.run.id != old.run.id
    first, second = await harness.listed(trigger.id)
    assert (first.idempotency_key, first.shown_idempotency_key) == (None, "k1")
    assert (second.idempotency_key, second.shown_idempotency_key) == ("k1", "k1")


async def test_a_refused_open_holds_no_key(harness: Harness):
    trigger, key = await harness.trigger()
    await harness.store.write(lambda conn: profiles.soft_delete(conn, trigger.profile_id))
    with pytest.raises(Unprocessable):
        await harness.runs.open(trigger, key, call(trigger, "k1"))
    assert await harness.listed(trigger.id) == []


async def test_a_turn_that_ends_the_session_in_error_fails_its_run(harness: Harness):
    trigger, key = await harness.trigger()
    started = await harness.runs.open(trigger, key, call(trigger, None))
    assert isinstance(started, Started)
    harness.steps.enqueue(Step.all_failed())
    await asyncio.wait({harness.runs.run(trigger, started.run, key.id, None)})
    (run,) = await harness.listed(trigger.id)
    assert (run.outcome, run.detail) == ("failed", "the provider is currently unavailable; the session is in error")


async def test_a_stopped_replicas_run_whose_message_was_never_sent_is_sent_by_another_and_completes(harness: Harness):
    trigger, key = await harness.trigger()
    stranded = await harness.left_by(STOPPED, trigger, key, [])
    harness.steps.enqueue(Step.text("done"))
    await harness.runs.take_over()
    run = await harness.settled(trigger.id)
    me = harness.engine.ownership.replica_id
    assert (run.id, run.outcome, run.detail, run.replica_id, run.message) == (stranded.id, "completed", None, me, None)
    assert harness.steps.sent[0].messages == [{"role": "user", "content": "triage #1"}]
    assert (await harness.kinds(run.session_id or ""))[-2:] == ["server.message.send", "session.close"]


async def test_a_run_whose_turn_was_cut_by_the_stop_fails_without_running_it_again(harness: Harness):
    trigger, key = await harness.trigger()
    stranded = await harness.left_by(STOPPED, trigger, key, [USER])
    await harness.runs.take_over()
    run = await harness.settled(trigger.id)
    assert (run.outcome, run.detail) == ("failed", TURN_CUT_OFF)
    assert harness.steps.sent == []  # the message is never sent twice
    assert (await harness.kinds(stranded.session_id or ""))[-1] == "session.close"


async def test_a_run_completed_in_its_log_is_completed_this_replicas_own_after_a_restart_too(harness: Harness):
    trigger, key = await harness.trigger()
    answer = ("server.message.send", {"role": "assistant", "content": [{"type": "text", "text": "done"}]})
    await harness.left_by(harness.engine.ownership.replica_id, trigger, key, [USER, answer])  # not driven here
    await harness.runs.take_over()
    run = await harness.settled(trigger.id)
    assert (run.outcome, run.detail) == ("completed", None)
    assert harness.steps.sent == []
    session = await harness.store.get_session(run.session_id or "")
    assert session is not None and session.state == "closed"


async def test_a_live_replicas_run_is_left_alone(harness: Harness):
    trigger, key = await harness.trigger()
    live = "10.0.0.8:50051"
    await harness.store.write(leases.heartbeat, live, live, "2026-01-01T00:00:00Z", time.time() + 60)
    await harness.left_by(live, trigger, key, [USER])
    await harness.runs.take_over()
    await asyncio.sleep(0.2)
    (run,) = await harness.listed(trigger.id)
    assert (run.outcome, run.replica_id) == ("running", live)
    assert harness.steps.sent == []


async def test_a_run_whose_session_a_live_replica_took_over_goes_to_that_replica(harness: Harness):
    trigger, key = await harness.trigger()
    adopter = "10.0.0.8:50051"
    await harness.store.write(leases.heartbeat, adopter, adopter, "2026-01-01T00:00:00Z", time.time() + 60)
    stranded = await harness.left_by(STOPPED, trigger, key, [USER])
    await harness.store.write(leases.claim, stranded.session_id, adopter, adopter, time.time())
    await harness.runs.take_over()

    async def handed() -> bool:
        (run,) = await harness.listed(trigger.id)
        return run.replica_id == adopter

    await eventually(handed)
    (run,) = await harness.listed(trigger.id)
    assert run.outcome == "running"  # the adopter finishes it
    assert harness.steps.sent == []


async def test_a_takeover_pass_never_takes_a_run_its_call_is_about_to_drive(harness: Harness):
    trigger, key = await harness.trigger()
    started = await harness.runs.open(trigger, key, call(trigger, None))
    assert isinstance(started, Started)
    await harness.runs.take_over()  # between the call's answer and its turn
    harness.steps.enqueue(Step.text("done"))
    await harness.runs.run(trigger, started.run, key.id, None)
    (run,) = await harness.listed(trigger.id)
    assert (run.outcome, len(harness.steps.sent)) == ("completed", 1)
