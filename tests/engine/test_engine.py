"""The turn engine driven through its own API: no gateway, no gRPC servicer.

A real runner process calls the scripted mock provider over HTTP; the store is
a real SQLite file; the engine runs in this test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import AsyncIterator

import pytest

from bae.common.config import load_config
from bae.common.settings import load_settings
from services.session.engine.domain import CompactRequest, Message, TurnEnd, TurnRequest
from services.session.engine.errors import OrphanToolResult, SessionNotOpen, ShuttingDown, TurnInProgress
from services.session.engine.feed import Watcher
from services.session.engine.service import SessionEngine
from services.session.store import Store, profiles, sessions
from services.session.wiring import session_engine
from services.session.store.sqlite import StoreUnavailable
from testkit.mockllm import MockLLM, Reply
from testkit.ports import free_port
from testkit.processes import ServiceProcess, service_env
from testkit.stack import mock_provider_toml, store_url

pytestmark = [pytest.mark.engine, pytest.mark.stack]

TOKEN = "mock-token-for-engine-tests"
ACTOR = "key_driver"


class EngineHarness:
    def __init__(self, store: Store, service: SessionEngine) -> None:
        self.store = store
        self.service = service
        self.runtime = service.registry
        self.engine = service.turns

    async def open_session(self, *, compaction: dict | None = None, client_tools: list[str] = ()) -> str:
        def create(conn) -> str:
            name = f"p_{secrets.token_hex(4)}"
            profile = profiles.create(
                conn,
                {"name": name, "primary_provider": "mock", "fallback_providers": [], "mcp_servers": [],
                 "allowed_tools": list(client_tools), "available_sandboxes": []},
            )
            tools = [{"name": t, "description": t, "input_schema": {"type": "object"}} for t in client_tools]
            return sessions.create(
                conn, client_key_id=ACTOR, profile_id=profile.id, state="open", client_version=None,
                client_tools=tools, sandbox_tools=[], subagent_tools=[],
                compaction=compaction or {"mode": "client", "prompt": None},
            )

        session_id = await self.store.write(create)
        live = await self.runtime.attach(session_id)
        live.drivers.add(ACTOR)
        return session_id

    async def events(self, session_id: str) -> list[dict]:
        return [json.loads(view.json) for _, view in await self.store.list_events(session_id, 0, 1000)]


@pytest.fixture(scope="module")
def runner(tmp_path_factory, mock: MockLLM):
    tmp = tmp_path_factory.mktemp("runner")
    config = tmp / "bae-config.toml"
    config.write_text(mock_provider_toml(mock.base_url))
    address = f"127.0.0.1:{free_port()}"
    token = secrets.token_hex(16)
    env = service_env(
        BAE_RUNNER_GRPC_ADDR=address, BAE_CONFIG=str(config), MOCK_LLM_TOKEN=TOKEN, BAE_INTERNAL_TOKEN=token
    )
    process = ServiceProcess("services.runner", env=env, log_path=tmp / "runner.log")
    process.wait_grpc_serving(address)
    yield {"address": address, "token": token, "config": config, "process": process}
    process.stop()


@pytest.fixture
async def harness(runner, tmp_path: Path, mock: MockLLM) -> AsyncIterator[EngineHarness]:
    mock.reset()
    settings = load_settings(
        {"BAE_RUNNER_GRPC_ADDR": runner["address"], "BAE_INTERNAL_TOKEN": runner["token"], "BAE_TURN_TIMEOUT": "1",
         "BAE_SANDBOX_GRPC_ADDRS": ""}
    )
    store = await Store.open(store_url(tmp_path))
    service = session_engine(settings, load_config(str(runner["config"])), store)
    yield EngineHarness(store, service)
    await service.drain(5)
    await service.stop()
    await store.close()


def user(text: str) -> Message:
    return Message(role="user", content=text)


async def test_a_turn_runs_with_no_client_and_returns_its_events(harness: EngineHarness, mock: MockLLM):
    session_id = await harness.open_session()
    mock.enqueue(Reply.text("hello there"))
    outcome = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("hi")))
    assert outcome.end == TurnEnd.COMPLETED
    assert outcome.message == {"role": "assistant", "content": [{"type": "text", "text": "hello there"}]}
    kinds = [view["event_type"] for view in outcome.events]
    assert kinds == ["client.message.send", "provider.request", "provider.response", "server.message.send"]
    assert [e["event_type"] for e in await harness.events(session_id)] == kinds


async def test_a_watcher_sees_the_turn_but_not_its_own_input(harness: EngineHarness, mock: MockLLM):
    session_id = await harness.open_session()
    watcher = Watcher()
    outcome = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("hi")), watcher=watcher)
    seen = []
    while (items := await watcher.take()) is not None:
        seen += [item["event_type"] for item in items]
    assert seen == ["provider.request", "provider.response", "server.message.send"]
    assert outcome.end == TurnEnd.COMPLETED


async def test_a_paused_turn_resumes_with_the_client_result(harness: EngineHarness, mock: MockLLM):
    session_id = await harness.open_session(client_tools=["lookup"])
    mock.enqueue(Reply.tool_use([("tu_1", "lookup", {"q": "x"})]))
    first = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("look it up")))
    assert first.end == TurnEnd.PAUSED
    assert harness.runtime.existing(session_id).gate.parked is not None
    mock.enqueue(Reply.text("found"))
    result = [{"type": "tool_result", "tool_use_id": "tu_1", "content": "42"}]
    second = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, Message("user", result)))
    assert second.end == TurnEnd.COMPLETED
    sent = mock.requests[-1]["body"]["messages"]
    assert sent[-1] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "42"}]}


class HeldFirstWrite:
    """Holds the store's first append of a turn (its client message) until the provider has the
    request, then lets it commit or fail: the provider call must not wait for that write."""

    def __init__(self, harness: EngineHarness, mock: MockLLM, failure: Exception | None = None) -> None:
        self.append = harness.store.append_events
        self.mock = mock
        self.failure = failure
        self.held = 0
        self.overlapped = False  # the provider had the request while the write was held

    async def __call__(self, session_id, items, new_state=None):
        self.held += 1
        if self.held == 1:
            for _ in range(300):
                if self.mock.requests:
                    self.overlapped = True
                    break
                await asyncio.sleep(0.01)
            if self.failure is not None:
                raise self.failure
        return await self.append(session_id, items, new_state)


async def test_the_provider_call_starts_while_the_client_message_is_written(
    harness: EngineHarness, mock: MockLLM, monkeypatch: pytest.MonkeyPatch
):
    session_id = await harness.open_session()
    mock.enqueue(Reply.text("one"))
    await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("first")))
    held = HeldFirstWrite(harness, mock)
    monkeypatch.setattr(harness.store, "append_events", held)
    mock.reset()
    mock.enqueue(Reply.text("two"))
    outcome = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("second")))
    assert outcome.end == TurnEnd.COMPLETED and held.overlapped
    # The request went out before its message was committed, and carried it after the history.
    assert [m["content"] for m in mock.requests[0]["body"]["messages"]] == [
        "first", [{"type": "text", "text": "one"}], "second"
    ]
    kinds = ["client.message.send", "provider.request", "provider.response", "server.message.send"]
    assert [view["event_type"] for view in outcome.events] == kinds
    assert [e["event_type"] for e in await harness.events(session_id)] == kinds * 2


async def test_a_client_message_that_fails_to_commit_fails_the_turn_and_records_nothing(
    harness: EngineHarness, mock: MockLLM, monkeypatch: pytest.MonkeyPatch
):
    session_id = await harness.open_session()
    unavailable = StoreUnavailable("the database is busy; retry shortly", busy=True)
    held = HeldFirstWrite(harness, mock, unavailable)
    monkeypatch.setattr(harness.store, "append_events", held)
    mock.enqueue(Reply.text("never recorded"))
    with pytest.raises(StoreUnavailable):
        await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("hi")))
    assert held.overlapped
    # Neither the message nor the step's provider.request/response that followed it was written.
    assert await harness.events(session_id) == []
    live = harness.runtime.existing(session_id)
    assert not live.gate.busy and len(live.loaded_history) == 0
    monkeypatch.undo()
    mock.enqueue(Reply.text("recorded"))
    outcome = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("again")))
    assert outcome.end == TurnEnd.COMPLETED
    assert [m["content"] for m in mock.requests[-1]["body"]["messages"]] == ["again"]


async def test_an_orphan_tool_result_is_refused_and_records_nothing(harness: EngineHarness):
    session_id = await harness.open_session()
    result = [{"type": "tool_result", "tool_use_id": "tu_9", "content": "x"}]
    with pytest.raises(OrphanToolResult):
        await harness.engine.run_turn(TurnRequest(session_id, ACTOR, Message("user", result)))
    assert await harness.events(session_id) == []
    assert not harness.runtime.existing(session_id).gate.busy


async def test_turns_queue_in_arrival_order(harness: EngineHarness, mock: MockLLM):
    session_id = await harness.open_session()
    mock.enqueue(Reply.hang(0.3))
    turns = [
        asyncio.create_task(harness.engine.run_turn(TurnRequest(session_id, ACTOR, user(f"m{i}"))))
        for i in range(3)
    ]
    await asyncio.gather(*turns)
    sent = [e["payload"]["content"] for e in await harness.events(session_id) if e["event_type"] == "client.message.send"]
    assert sent == ["m0", "m1", "m2"]


async def test_manual_compaction_makes_the_summary_the_new_start(harness: EngineHarness, mock: MockLLM):
    session_id = await harness.open_session()
    for text in ("one", "two"):
        await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user(text)))
    mock.enqueue(Reply.text("SUMMARY", usage=(100, 7)))
    outcome = await harness.engine.compact(CompactRequest(session_id, ACTOR, prompt="Summarize briefly."))
    completed = outcome.completed
    assert completed["event_type"] == "session.compaction.completed"
    assert completed["payload"]["compacted_message_count"] == 4
    assert (completed["payload"]["input_tokens"], completed["payload"]["summary_tokens"]) == (100, 7)
    compaction_call = mock.requests[-1]["body"]
    assert compaction_call["max_tokens"] >= 4096 and compaction_call["tools"] == []
    assert compaction_call["messages"][-1] == {"role": "user", "content": "Summarize briefly."}

    await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("three")))
    assert mock.requests[-1]["body"]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "The earlier part of this conversation was compacted. A summary follows."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "SUMMARY"}]},
        {"role": "user", "content": "three"},
    ]


async def test_compaction_refuses_a_live_pause(harness: EngineHarness, mock: MockLLM):
    session_id = await harness.open_session(client_tools=["lookup"])
    mock.enqueue(Reply.tool_use([("tu_1", "lookup", {})]))
    await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("go")))
    with pytest.raises(TurnInProgress):
        await harness.engine.compact(CompactRequest(session_id, ACTOR))


async def test_auto_compaction_runs_after_a_completed_turn_over_the_threshold(harness: EngineHarness, mock: MockLLM):
    session_id = await harness.open_session(compaction={"mode": "auto", "size": 1000})
    mock.enqueue(Reply.text("big answer", usage=(1500, 20)))
    mock.enqueue(Reply.text("the summary", usage=(1600, 30)))
    outcome = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("go")))
    kinds = [view["event_type"] for view in outcome.events]
    assert kinds[-7:] == [
        "server.message.send", "session.compaction.started", "provider.request", "provider.response",
        "server.message.send", "server.message.send", "session.compaction.completed",
    ]
    started = outcome.events[-6]["payload"]
    assert started == {"trigger": "auto", "reason": "token_threshold", "token_count": 1520, "threshold_tokens": 1000}


async def test_a_session_closed_after_its_check_gets_no_live_state_again(harness: EngineHarness):
    """The close race, in the order it happens: a caller checked the session open,
    then the session closed, then the caller asks for the live state."""
    session_id = await harness.open_session()
    assert (await harness.store.get_session(session_id)).state == "open"  # the caller's check
    await harness.store.append_events(session_id, [(ACTOR, "session.close", {"reason": "client_close"})], new_state="closed")
    await harness.service.closer.close(session_id, ACTOR)
    with pytest.raises(SessionNotOpen):
        await harness.runtime.attach(session_id)
    assert harness.runtime.get(session_id) is None
    with pytest.raises(SessionNotOpen):
        await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("late")))


async def test_drain_lets_a_running_turn_finish_and_refuses_new_ones(harness: EngineHarness, mock: MockLLM):
    session_id = await harness.open_session()
    mock.enqueue(Reply.hang(0.5))
    running = asyncio.create_task(harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("slow"))))
    await asyncio.sleep(0.2)
    await harness.engine.drain(10)
    assert running.done() and running.result().end == TurnEnd.COMPLETED
    with pytest.raises(ShuttingDown):
        await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("after")))
