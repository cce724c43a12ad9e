"""The turn engine driven through its own API: no gateway, no gRPC servicer, no runner.

The provider steps, sandbox host, MCP servers and peer replicas are the in-memory fakes of
testkit/fakes.py; the store is the real one (SQLite in a temporary directory, and
PostgreSQL); everything runs in this test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from bae.common.errors import BaeError, Unavailable
from bae.common.jsontext import load
from bae.services.session.engine.domain import CompactRequest, Message, TurnEnd, TurnRequest, Usage
from bae.services.session.engine.errors import (
    CompactionFailed,
    LoopFailed,
    OrphanToolResult,
    SandboxFailed,
    SessionNotOpen,
    ShuttingDown,
    TurnInProgress,
)
from bae.services.session.engine.feed import Watcher
from bae.services.session.engine.live import LiveSession
from bae.services.session.engine.loop import MAX_ITERATIONS
from bae.services.session.engine.ports import (
    CommandState,
    CommandStatus,
    Delta,
    DeltaKind,
    ExecResult,
    HostInventory,
    SandboxHandle,
)
from bae.services.session.engine.service import SessionEngine
from bae.services.session.store import Store, profiles, sessions
from bae.services.session.store.live_state import LiveState
from bae.services.session.engine.subagents import Subagent
from testkit.fakes import FakeCommand, FakeMcp, FakeSandboxes, ScriptedSteps, Step, fake_engine, eventually
from testkit.postgres_support import STORES, store_url  # noqa: F401 - the fixture

pytestmark = [pytest.mark.engine, pytest.mark.parametrize("store_url", STORES, indirect=True)]

ACTOR = "key_driver"
IMAGE = "bae-test-image"
SHELL = {"name": "shell", "description": "run a command", "input_schema": {"type": "object"}}
SPAWN = {
    "name": "spawn", "description": "launch a subagent", "input_schema": {"type": "object"}, "image": IMAGE,
    "subagents": [{"harness": "echoer", "command_template": "echo {model}", "prompt_via": "stdin", "timeout_secs": None}],
}


class EngineHarness:
    def __init__(self, store: Store, engine: SessionEngine, steps: ScriptedSteps, sandboxes: FakeSandboxes,
                 mcp: FakeMcp) -> None:
        self.store = store
        self.service = engine
        self.engine = engine.turns
        self.registry = engine.registry
        self.steps = steps
        self.sandboxes = sandboxes
        self.mcp = mcp

    async def open_session(
        self,
        *,
        compaction: dict | None = None,
        client_tools: Sequence[str] = (),
        sandbox_tools: Sequence[dict] = (),
        subagent_tools: Sequence[dict] = (),
        mcp_servers: Sequence[str] = (),
    ) -> str:
        def create(conn) -> tuple[str, Any]:
            name = f"p_{secrets.token_hex(4)}"
            profile = profiles.create(
                conn,
                {"name": name, "primary_provider": "mock", "fallback_providers": [], "mcp_servers": list(mcp_servers),
                 "allowed_tools": list(client_tools), "available_sandboxes": [IMAGE]},
            )
            tools = [{"name": t, "description": t, "input_schema": {"type": "object"}} for t in client_tools]
            session_id = sessions.create(
                conn, client_key_id=ACTOR, profile_id=profile.id, state="open", client_version=None,
                client_tools=tools, sandbox_tools=list(sandbox_tools), subagent_tools=list(subagent_tools),
                compaction=compaction or {"mode": "client", "prompt": None},
            )
            return session_id, profile

        session_id, profile = await self.store.write(create)
        await self.service.mcp.opened(session_id, profile)
        live = await self.registry.attach(session_id)
        live.drivers.add(ACTOR)
        return session_id

    def live(self, session_id: str) -> LiveSession:
        return self.registry.existing(session_id)

    async def turn(self, session_id: str, content: str | list, watcher: Watcher | None = None) -> Any:
        return await self.engine.run_turn(TurnRequest(session_id, ACTOR, Message("user", content)), watcher=watcher)

    async def events(self, session_id: str) -> list[dict]:
        return [json.loads(view.json) for _, view in await self.store.list_events(session_id, 0, 1000)]

    async def kinds(self, session_id: str) -> list[str]:
        return [event["event_type"] for event in await self.events(session_id)]

    async def state(self, session_id: str) -> str:
        session = await self.store.get_session(session_id)
        assert session is not None
        return session.state


@pytest.fixture
async def harness(store_url) -> AsyncIterator[EngineHarness]:  # noqa: F811 - the fixture
    store = await Store.open(store_url)
    steps, sandboxes, mcp = ScriptedSteps(), FakeSandboxes(), FakeMcp({"tools": ["search", "fetch"]})
    engine = fake_engine(store, steps=steps, sandboxes=sandboxes, mcp=mcp)
    await engine.start()
    yield EngineHarness(store, engine, steps, sandboxes, mcp)
    await engine.drain(5)
    await engine.stop()
    await store.close()



def user(text: str) -> Message:
    return Message(role="user", content=text)


TEXT_TURN = ["client.message.send", "provider.request", "provider.response", "server.message.send"]


# -- turns ------------------------------------------------------------------------------------------


async def test_a_turn_runs_with_no_client_and_returns_its_events(harness: EngineHarness):
    session_id = await harness.open_session()
    harness.steps.enqueue(Step.text("hello there"))
    outcome = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("hi")))
    assert outcome.end == TurnEnd.COMPLETED
    assert outcome.message == {"role": "assistant", "content": [{"type": "text", "text": "hello there"}]}
    kinds = [view["event_type"] for view in outcome.events]
    assert kinds == TEXT_TURN
    assert await harness.kinds(session_id) == kinds
    (sent,) = harness.steps.sent
    assert sent.messages == [{"role": "user", "content": "hi"}]
    assert (sent.request.session_id, sent.request.primary_provider, sent.request.purpose) == (session_id, "mock", "")


async def test_a_watcher_sees_the_turn_but_not_its_own_input(harness: EngineHarness):
    session_id = await harness.open_session()
    watcher = Watcher()
    outcome = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("hi")), watcher=watcher)
    seen = []
    while (items := await watcher.take()) is not None:
        seen += [item["event_type"] for item in items]
    assert seen == ["provider.request", "provider.response", "server.message.send"]
    assert outcome.end == TurnEnd.COMPLETED


async def test_deltas_go_to_the_watchers_that_asked_and_a_late_observer_catches_up(harness: EngineHarness):
    session_id = await harness.open_session()
    asking, plain = Watcher(deltas=True), Watcher()
    caught: list[Delta] = []
    live = await harness.registry.attach(session_id)
    live.feed.join(plain)
    publish = live.feed.publish_deltas

    def publish_and_catch_up(deltas: Sequence[Delta]) -> None:
        publish(deltas)
        if deltas[-1].seq == 1:  # an observer joining now gets the call so far, one delta per block
            caught.extend(live.feed.stream.catch_up())

    live.feed.publish_deltas = publish_and_catch_up  # type: ignore[method-assign]
    harness.steps.enqueue(Step.text("one two three"))
    outcome = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("count")), watcher=asking)
    request_id = outcome.events[1]["id"]
    items = await asking.take() or []
    streamed = [item for item in items if isinstance(item, Delta)]
    assert [(d.request_event_id, d.seq, d.index, d.text) for d in streamed] == [
        (request_id, 0, 0, "one "), (request_id, 1, 0, "two "), (request_id, 2, 0, "three")]
    assert [item["event_type"] for item in items if not isinstance(item, Delta)] == TEXT_TURN[1:]
    assert caught == [Delta(request_id, 1, 0, DeltaKind.TEXT, "one two ")]
    assert not any(isinstance(item, Delta) for item in await plain.take() or [])
    assert live.feed.stream.catch_up() == []  # the response holds it all now
    assert harness.steps.sent[-1].request.stream_deltas
    # Nobody listening: the next step does not stream.
    await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("again")))
    assert not harness.steps.sent[-1].request.stream_deltas


async def test_a_paused_turn_resumes_with_the_client_result(harness: EngineHarness):
    session_id = await harness.open_session(client_tools=["lookup"])
    harness.steps.enqueue(Step.tool_use(("tu_1", "lookup", {"q": "x"})))
    first = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("look it up")))
    assert first.end == TurnEnd.PAUSED
    assert harness.live(session_id).gate.parked is not None
    assert first.message["content"][0]["dispatch"] == "client"
    harness.steps.enqueue(Step.text("found"))
    result = [{"type": "tool_result", "tool_use_id": "tu_1", "content": "42"}]
    second = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, Message("user", result)))
    assert second.end == TurnEnd.COMPLETED
    sent = harness.steps.sent[-1].messages
    assert sent[-1] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "42"}]}
    assert [view["event_type"] for view in second.events] == ["client.message.send", "tool.result", *TEXT_TURN[1:]]


class HeldFirstWrite:
    """Holds the store's first append of a turn (its client message) until the provider has the
    request, then lets it commit or fail: the provider call must not wait for that write."""

    def __init__(self, harness: EngineHarness, failure: Exception | None = None) -> None:
        self.append = harness.store.append_events
        self.steps = harness.steps
        self.failure = failure
        self.held = 0
        self.sent_before = len(harness.steps.sent)
        self.overlapped = False  # the provider had the request while the write was held

    async def __call__(self, session_id, items, new_state=None, charge=None):
        self.held += 1
        if self.held == 1:
            for _ in range(300):
                if len(self.steps.sent) > self.sent_before:
                    self.overlapped = True
                    break
                await asyncio.sleep(0.01)
            if self.failure is not None:
                raise self.failure
        return await self.append(session_id, items, new_state, charge)


async def test_the_provider_call_starts_while_the_client_message_is_written(
    harness: EngineHarness, monkeypatch: pytest.MonkeyPatch
):
    session_id = await harness.open_session()
    harness.steps.enqueue(Step.text("one"))
    await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("first")))
    held = HeldFirstWrite(harness)
    monkeypatch.setattr(harness.store, "append_events", held)
    harness.steps.enqueue(Step.text("two"))
    outcome = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("second")))
    assert outcome.end == TurnEnd.COMPLETED and held.overlapped
    # The request went out before its message was committed, and carried it after the history.
    assert [m["content"] for m in harness.steps.sent[-1].messages] == [
        "first", [{"type": "text", "text": "one"}], "second"
    ]
    assert [view["event_type"] for view in outcome.events] == TEXT_TURN
    assert await harness.kinds(session_id) == TEXT_TURN * 2


async def test_a_client_message_that_fails_to_commit_fails_the_turn_and_records_nothing(
    harness: EngineHarness, monkeypatch: pytest.MonkeyPatch
):
    session_id = await harness.open_session()
    unavailable = Unavailable("the database is busy; retry shortly", retry_after=1)
    held = HeldFirstWrite(harness, unavailable)
    monkeypatch.setattr(harness.store, "append_events", held)
    harness.steps.enqueue(Step.text("never recorded"))
    with pytest.raises(Unavailable):
        await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("hi")))
    assert held.overlapped
    # Neither the message nor the step's provider.request/response that followed it was written.
    assert await harness.events(session_id) == []
    live = harness.live(session_id)
    assert not live.gate.busy and len(live.loaded_history) == 0
    monkeypatch.undo()
    harness.steps.enqueue(Step.text("recorded"))
    outcome = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("again")))
    assert outcome.end == TurnEnd.COMPLETED
    assert [m["content"] for m in harness.steps.sent[-1].messages] == ["again"]


async def test_an_orphan_tool_result_is_refused_and_records_nothing(harness: EngineHarness):
    session_id = await harness.open_session()
    result = [{"type": "tool_result", "tool_use_id": "tu_9", "content": "x"}]
    with pytest.raises(OrphanToolResult):
        await harness.engine.run_turn(TurnRequest(session_id, ACTOR, Message("user", result)))
    assert await harness.events(session_id) == []
    assert not harness.live(session_id).gate.busy


async def test_turns_queue_in_arrival_order(harness: EngineHarness):
    session_id = await harness.open_session()
    release = asyncio.Event()
    harness.steps.enqueue(Step.held(release))
    turns = [
        asyncio.create_task(harness.engine.run_turn(TurnRequest(session_id, ACTOR, user(f"m{i}"))))
        for i in range(3)
    ]
    await eventually(lambda: _true(harness.steps.running == 1))
    release.set()
    await asyncio.gather(*turns)
    sent = [e["payload"]["content"] for e in await harness.events(session_id) if e["event_type"] == "client.message.send"]
    assert sent == ["m0", "m1", "m2"]


async def _true(value: bool) -> bool:
    return value


# -- what a step ends with ---------------------------------------------------------------------------


async def test_all_providers_failing_ends_the_turn_unavailable_and_the_session_in_error(harness: EngineHarness):
    session_id = await harness.open_session()
    harness.steps.enqueue(Step.all_failed(attempts=3))
    outcome = await harness.turn(session_id, "hi")
    assert outcome.end == TurnEnd.UNAVAILABLE
    assert outcome.message["content"] == [{"type": "text", "text": "The provider is currently unavailable."}]
    error = outcome.events[-1]
    assert (error["event_type"], error["payload"]) == ("session.error", {"reason": "all_providers_failed", "attempts": 3})
    assert await harness.kinds(session_id) == [*TEXT_TURN[:3], "session.error"]
    assert await harness.state(session_id) == "error"


async def test_an_unconfigured_primary_provider_is_a_provider_config_error(harness: EngineHarness):
    session_id = await harness.open_session()
    harness.steps.enqueue(Step.provider_config('provider "mock" is not configured'))
    outcome = await harness.turn(session_id, "hi")
    assert outcome.end == TurnEnd.UNAVAILABLE
    assert outcome.events[-1]["payload"] == {"reason": "provider_config", "detail": 'provider "mock" is not configured'}
    assert await harness.state(session_id) == "error"


async def test_a_step_that_fails_mid_stream_fails_the_turn_after_recording_what_came(harness: EngineHarness):
    session_id = await harness.open_session()
    harness.steps.enqueue(Step.unreachable())
    with pytest.raises(LoopFailed) as caught:
        await harness.turn(session_id, "hi")
    assert "UNAVAILABLE" in caught.value.reason and str(caught.value) == "session loop failed"
    # The step's request went out and is on record; nothing answers it; the session stays open.
    assert await harness.kinds(session_id) == ["client.message.send", "provider.request"]
    assert await harness.state(session_id) == "open"
    assert not harness.live(session_id).gate.busy
    harness.steps.enqueue(Step.text("back"))
    assert (await harness.turn(session_id, "again")).end == TurnEnd.COMPLETED


async def test_a_model_that_never_stops_calling_tools_hits_the_loop_limit(harness: EngineHarness):
    session_id = await harness.open_session(mcp_servers=["tools"])
    harness.steps.enqueue(*(Step.tool_use((f"tu_{i}", "search", {})) for i in range(MAX_ITERATIONS)))
    outcome = await harness.turn(session_id, "go")
    assert outcome.end == TurnEnd.UNAVAILABLE
    assert outcome.events[-1]["payload"] == {"reason": "loop_limit", "max_iterations": MAX_ITERATIONS}
    assert len(harness.steps.sent) == MAX_ITERATIONS
    assert await harness.state(session_id) == "error"


# -- tool loops ------------------------------------------------------------------------------------------


async def test_an_mcp_tool_is_answered_inside_the_turn(harness: EngineHarness):
    session_id = await harness.open_session(mcp_servers=["tools"])
    harness.steps.enqueue(Step.tool_use(("tu_1", "search", {"q": "cats"})), Step.text("found cats"))
    outcome = await harness.turn(session_id, "search")
    assert outcome.end == TurnEnd.COMPLETED
    assert [view["event_type"] for view in outcome.events] == [
        "client.message.send", "provider.request", "provider.response", "tool.call", "mcp.request",
        "mcp.response", "tool.result", "provider.request", "provider.response", "server.message.send",
    ]
    assert harness.mcp.calls == [("search", {"q": "cats"})]
    assert {tool["name"] for tool in harness.steps.sent[0].tools} == {"search", "fetch"}
    call = outcome.events[3]["payload"]
    assert (call["dispatch"], call["server_name"]) == ("mcp", "tools")
    answered = harness.steps.sent[1].messages[-1]
    assert answered == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "tu_1", "content": [{"type": "text", "text": "search done"}],
         "is_error": False}
    ]}


async def test_mcp_calls_of_one_step_run_side_by_side_and_answer_in_the_models_order(harness: EngineHarness):
    session_id = await harness.open_session(mcp_servers=["tools"])
    slow = asyncio.Event()
    harness.mcp.answers["search"] = slow  # the first call waits until the second one is in
    harness.steps.enqueue(Step.tool_use(("tu_1", "search", {}), ("tu_2", "fetch", {})), Step.text("both"))
    turn = asyncio.create_task(harness.turn(session_id, "go"))
    await eventually(lambda: _true(len(harness.mcp.calls) == 2))
    slow.set()
    outcome = await turn
    results = [view["payload"]["tool_use_id"] for view in outcome.events if view["event_type"] == "tool.result"]
    assert results == ["tu_1", "tu_2"]


async def test_a_sandbox_tool_runs_in_the_sessions_sandbox(harness: EngineHarness):
    harness.sandboxes.on_exec = lambda command: ExecResult("out\n", "warn\n", 3)
    session_id = await harness.open_session(sandbox_tools=[SHELL])
    handle, _ = await harness.service.sandboxes.start(
        harness.live(session_id), ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10
    )
    harness.steps.enqueue(Step.tool_use(("tu_1", "shell", {"command": "make"})), Step.text("built"))
    outcome = await harness.turn(session_id, "build it")
    assert outcome.end == TurnEnd.COMPLETED
    by_kind = {view["event_type"]: view["payload"] for view in outcome.events}
    assert by_kind["sandbox.request"] == {"tool": "shell", "input": {"command": "make"}, "command": "make"}
    assert by_kind["sandbox.response"] == {
        "sandbox_id": handle.sandbox_id, "ok": False, "result": {"stdout": "out\n", "stderr": "warn\n", "exit_code": 3}
    }
    assert by_kind["tool.result"]["content"] == [{"type": "text", "text": "out\n[stderr]\nwarn\n[exit_code: 3]"}]
    assert ("exec", handle.sandbox_id) in harness.sandboxes.calls


async def test_a_sandbox_tool_without_a_sandbox_and_a_failing_exec_answer_errors(harness: EngineHarness):
    session_id = await harness.open_session(sandbox_tools=[SHELL])
    harness.steps.enqueue(Step.tool_use(("tu_1", "shell", {"command": "ls"})), Step.text("no sandbox"))
    outcome = await harness.turn(session_id, "ls")
    result = next(view["payload"] for view in outcome.events if view["event_type"] == "tool.result")
    assert result["is_error"] and "call session.startRemoteSandbox first" in result["content"][0]["text"]

    handle, _ = await harness.service.sandboxes.start(
        harness.live(session_id), ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10
    )
    harness.sandboxes.fail_next("exec", Unavailable("the sandbox host is unavailable"))
    harness.steps.enqueue(Step.tool_use(("tu_2", "shell", {"command": "ls"})), Step.text("host down"))
    outcome = await harness.turn(session_id, "ls again")
    kinds = [view["event_type"] for view in outcome.events]
    assert kinds[kinds.index("sandbox.request") + 1] == "session.sandbox.error"
    response = next(view["payload"] for view in outcome.events if view["event_type"] == "sandbox.response")
    assert response == {"sandbox_id": handle.sandbox_id, "ok": False, "error": "the sandbox host is unavailable"}


async def test_a_subagent_launched_by_a_turn_reports_through_the_status_tool(harness: EngineHarness):
    session_id = await harness.open_session(subagent_tools=[SPAWN])
    await harness.service.sandboxes.start(harness.live(session_id), ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10)
    harness.steps.enqueue(
        Step.tool_use(("tu_1", "spawn", {"harness": "echoer", "model": "small", "prompt": "hello"})), Step.text("launched")
    )
    outcome = await harness.turn(session_id, "delegate")
    assert outcome.end == TurnEnd.COMPLETED
    started = next(view for view in outcome.events if view["event_type"] == "session.subagent.start")
    subagent_id = started["payload"]["subagent_id"]
    command = harness.sandboxes.commands[subagent_id]
    assert (command.command, command.stdin) == ("echo 'small'", b"hello")

    harness.sandboxes.finish(subagent_id, CommandStatus(CommandState.EXITED, exit_code=0, stdout=b"done\n"))
    await eventually(lambda: _has(harness, session_id, "session.subagent.completed"))
    harness.steps.enqueue(Step.tool_use(("tu_2", "remote_subagent_status", {})), Step.text("it finished"))
    outcome = await harness.turn(session_id, "how did it go?")
    assert "remote_subagent_status" in [tool["name"] for tool in harness.steps.sent[-2].tools]
    report = next(view["payload"] for view in outcome.events if view["event_type"] == "tool.result")
    (entry,) = load(report["content"][0]["text"])["subagents"]
    assert (entry["subagent_id"], entry["status"], entry["stdout"]) == (subagent_id, "completed", "done\n")


async def _has(harness: EngineHarness, session_id: str, kind: str) -> bool:
    return kind in await harness.kinds(session_id)


async def test_a_sandbox_start_the_host_refuses_is_logged_and_raised(harness: EngineHarness):
    session_id = await harness.open_session()
    harness.sandboxes.fail_next("start", BaeError("no sandbox host is available"))
    with pytest.raises(SandboxFailed, match="no sandbox host is available"):
        await harness.service.sandboxes.start(harness.live(session_id), ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10)
    events = await harness.events(session_id)
    assert [e["event_type"] for e in events] == ["session.sandbox.start", "session.sandbox.error"]
    assert events[-1]["payload"]["detail"] == "no sandbox host is available"
    assert harness.live(session_id).sandbox is None


# -- compaction ---------------------------------------------------------------------------------------------


async def test_manual_compaction_makes_the_summary_the_new_start(harness: EngineHarness):
    session_id = await harness.open_session()
    for text in ("one", "two"):
        await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user(text)))
    harness.steps.enqueue(Step.text("SUMMARY", usage=Usage(100, 7)))
    outcome = await harness.engine.compact(CompactRequest(session_id, ACTOR, prompt="Summarize briefly."))
    completed = outcome.completed
    assert completed["event_type"] == "session.compaction.completed"
    assert completed["payload"]["compacted_message_count"] == 4
    assert (completed["payload"]["input_tokens"], completed["payload"]["summary_tokens"]) == (100, 7)
    compaction_call = harness.steps.sent[-1]
    assert compaction_call.request.min_max_tokens >= 4096 and compaction_call.tools == []
    assert compaction_call.request.purpose == "compaction"
    assert compaction_call.messages[-1] == {"role": "user", "content": "Summarize briefly."}

    await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("three")))
    assert harness.steps.sent[-1].messages == [
        {"role": "user", "content": [{"type": "text", "text": "The earlier part of this conversation was compacted. A summary follows."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "SUMMARY"}]},
        {"role": "user", "content": "three"},
    ]


async def test_a_truncated_or_failed_summary_fails_the_compaction_and_keeps_the_history(harness: EngineHarness):
    session_id = await harness.open_session()
    await harness.turn(session_id, "one")
    cut = Step.text("SUMM")
    cut.truncated = "stop_reason max_tokens"
    harness.steps.enqueue(cut, Step.all_failed(attempts=2), Step.unreachable())
    for detail in ("summary truncated: stop_reason max_tokens", "all 2 providers failed", "the model runner is unreachable"):
        with pytest.raises(CompactionFailed, match=detail):
            await harness.engine.compact(CompactRequest(session_id, ACTOR))
    kinds = await harness.kinds(session_id)
    assert "session.compaction.completed" not in kinds and kinds.count("session.compaction.started") == 3
    await harness.turn(session_id, "two")
    assert [m["content"] for m in harness.steps.sent[-1].messages][0] == "one"


async def test_compaction_refuses_a_live_pause(harness: EngineHarness):
    session_id = await harness.open_session(client_tools=["lookup"])
    harness.steps.enqueue(Step.tool_use(("tu_1", "lookup", {})))
    await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("go")))
    with pytest.raises(TurnInProgress):
        await harness.engine.compact(CompactRequest(session_id, ACTOR))


async def test_auto_compaction_runs_after_a_completed_turn_over_the_threshold(harness: EngineHarness):
    session_id = await harness.open_session(compaction={"mode": "auto", "size": 1000})
    harness.steps.enqueue(Step.text("big answer", usage=Usage(1500, 20)))
    harness.steps.enqueue(Step.text("the summary", usage=Usage(1600, 30)))
    outcome = await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("go")))
    kinds = [view["event_type"] for view in outcome.events]
    assert kinds[-7:] == [
        "server.message.send", "session.compaction.started", "provider.request", "provider.response",
        "server.message.send", "server.message.send", "session.compaction.completed",
    ]
    started = outcome.events[-6]["payload"]
    assert started == {"trigger": "auto", "reason": "token_threshold", "token_count": 1520, "threshold_tokens": 1000}


# -- taking a session over ----------------------------------------------------------------------------------


async def held_rebuild(harness: EngineHarness, monkeypatch: pytest.MonkeyPatch,
                       session_id: str) -> asyncio.Event:
    """The session as a replica that has just taken it over sees it (no live state yet), its log read held
    until the returned event is set; the log names one more driver, `key_other`."""
    harness.registry._sessions.pop(session_id)
    read, gate = harness.store.live_state, asyncio.Event()

    async def held(wanted: str) -> LiveState:
        state = await read(wanted)
        await gate.wait()
        return state._replace(drivers=[*state.drivers, "key_other"])

    monkeypatch.setattr(harness.store, "live_state", held)
    return gate


async def test_a_call_during_a_takeover_waits_until_the_drivers_are_read_back(
        harness: EngineHarness, monkeypatch: pytest.MonkeyPatch):
    session_id = await harness.open_session()
    gate = await held_rebuild(harness, monkeypatch, session_id)
    first = asyncio.create_task(harness.registry.attach(session_id))

    async def visible() -> bool:
        return harness.registry.get(session_id) is not None

    await eventually(visible)
    second = asyncio.create_task(harness.registry.attach(session_id))
    await asyncio.sleep(0.05)
    assert not second.done()  # the state exists, but is not rebuilt yet
    gate.set()
    live = await second
    assert live is await first
    assert "key_other" in live.drivers


async def test_a_takeover_whose_caller_is_cancelled_is_attached_anew_by_the_next(
        harness: EngineHarness, monkeypatch: pytest.MonkeyPatch):
    session_id = await harness.open_session()
    gate = await held_rebuild(harness, monkeypatch, session_id)
    first = asyncio.create_task(harness.registry.attach(session_id))

    async def visible() -> bool:
        return harness.registry.get(session_id) is not None

    await eventually(visible)
    second = asyncio.create_task(harness.registry.attach(session_id))
    await asyncio.sleep(0.05)
    first.cancel()
    await asyncio.sleep(0.05)
    assert not second.done()  # attaching again, itself held at the log read
    gate.set()
    live = await second
    assert "key_other" in live.drivers
    assert harness.registry.get(session_id) is live


# -- close, drain, shutdown --------------------------------------------------------------------------------


async def test_a_session_closed_after_its_check_gets_no_live_state_again(harness: EngineHarness):
    """The close race, in the order it happens: a caller checked the session open,
    then the session closed, then the caller asks for the live state."""
    session_id = await harness.open_session()
    assert (await harness.store.get_session(session_id)).state == "open"  # the caller's check
    await harness.store.append_events(session_id, [(ACTOR, "session.close", {"reason": "client_close"})], new_state="closed")
    await harness.service.closer.close(session_id, ACTOR)
    with pytest.raises(SessionNotOpen):
        await harness.registry.attach(session_id)
    assert harness.registry.get(session_id) is None
    with pytest.raises(SessionNotOpen):
        await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("late")))


async def test_a_close_cancels_subagents_then_stops_the_sandbox(harness: EngineHarness):
    session_id = await harness.open_session(subagent_tools=[SPAWN], mcp_servers=["tools"])
    live = harness.live(session_id)
    handle, _ = await harness.service.sandboxes.start(live, ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10)
    harness.steps.enqueue(
        Step.tool_use(("tu_1", "spawn", {"harness": "echoer", "model": "m", "prompt": "p"})), Step.text("ok")
    )
    await harness.turn(session_id, "delegate")
    mcp = await harness.service.mcp.ensure(live, (await harness.store.session_and_profile(session_id))[1])
    watcher = Watcher()
    live.feed.join(watcher)
    await harness.store.append_events(session_id, [(ACTOR, "session.close", {"reason": "client_close"})], new_state="closed")
    await harness.service.closer.close(session_id, ACTOR)
    tail = (await harness.kinds(session_id))[-4:]
    assert tail == ["session.close", "session.subagent.cancelled", "session.sandbox.stop", "session.sandbox.stopped"]
    seen = [item["event_type"] for item in await watcher.take() or []]
    assert seen == tail[1:]  # the subscribers get the close's own events, then their streams end
    assert await watcher.take() is None
    assert ("stop", handle.sandbox_id) in harness.sandboxes.calls
    assert mcp is not None and harness.mcp.sessions[0].closed


async def test_drain_lets_a_running_turn_finish_and_refuses_new_ones(harness: EngineHarness):
    session_id = await harness.open_session()
    release = asyncio.Event()
    harness.steps.enqueue(Step.held(release))
    running = asyncio.create_task(harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("slow"))))
    await eventually(lambda: _true(harness.steps.running == 1))
    draining = asyncio.create_task(harness.engine.drain(10))
    await asyncio.sleep(0.05)
    assert not draining.done()
    release.set()
    await draining
    assert running.done() and running.result().end == TurnEnd.COMPLETED
    with pytest.raises(ShuttingDown):
        await harness.engine.run_turn(TurnRequest(session_id, ACTOR, user("after")))


async def test_stop_drops_live_state_and_leaves_sandboxes_to_the_next_start(harness: EngineHarness, store_url):  # noqa: F811
    session_id = await harness.open_session(mcp_servers=["tools"], client_tools=["lookup"])
    live = harness.live(session_id)
    handle, _ = await harness.service.sandboxes.start(live, ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10)
    harness.steps.enqueue(Step.tool_use(("tu_1", "lookup", {})))
    assert (await harness.turn(session_id, "pause")).end == TurnEnd.PAUSED
    await harness.service.drain(1)
    await harness.service.stop()
    assert harness.registry.get(session_id) is None
    assert harness.mcp.sessions[0].closed and harness.steps.closed
    assert ("stop", handle.sandbox_id) not in harness.sandboxes.calls

    # The next process takes the sandbox back, and the pause from the log, already expired.
    restarted = fake_engine(harness.store, sandboxes=harness.sandboxes, steps=ScriptedSteps())
    await restarted.start()
    try:
        again = restarted.registry.existing(session_id)
        assert again.sandbox == handle and harness.sandboxes.adopted == [handle]
        await restarted.registry.load_history(again)
        assert again.gate.parked is not None and again.gate.parked.expired
    finally:
        await restarted.stop()


async def test_an_idle_sandbox_is_stopped(store_url):  # noqa: F811
    store = await Store.open(store_url)
    engine = fake_engine(store, sandbox_idle_timeout=0.2)
    harness = EngineHarness(store, engine, ScriptedSteps(), FakeSandboxes(), FakeMcp())
    await engine.start()
    try:
        session_id = await harness.open_session()
        await engine.sandboxes.start(harness.live(session_id), ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10)
        await eventually(lambda: _has(harness, session_id, "session.sandbox.stopped"))
        stop = next(e for e in await harness.events(session_id) if e["event_type"] == "session.sandbox.stop")
        assert (stop["payload"]["reason"], stop["client_key_id"]) == ("idle_timeout", None)
        assert harness.live(session_id).sandbox is None
    finally:
        await engine.stop()
        await store.close()


# -- reconciliation (engine/reconcile.py) ---------------------------------------------------------


async def test_a_vanished_sandbox_is_logged_stopped_once(harness: EngineHarness):
    session_id = await harness.open_session()
    live = harness.live(session_id)
    handle, _ = await harness.service.sandboxes.start(live, ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10)
    before = len(await harness.events(session_id))
    del harness.sandboxes.running[handle.sandbox_id]  # removed behind the server's back

    await harness.service.reconciler.run()
    logged = (await harness.events(session_id))[before:]
    stop = {"image": IMAGE, "sandbox_id": handle.sandbox_id, "reason": "vanished", "dispatch": "remote"}
    assert [(e["event_type"], e["payload"], e["client_key_id"]) for e in logged] == [
        ("session.sandbox.stop", stop, None), ("session.sandbox.stopped", {**stop, "unsandboxed": False}, None)]
    assert live.sandbox is None

    await harness.service.reconciler.run()
    assert (await harness.events(session_id))[before:] == logged


async def test_a_vanished_sandbox_whose_stop_fails_is_logged_as_an_error(harness: EngineHarness):
    session_id = await harness.open_session()
    live = harness.live(session_id)
    handle, _ = await harness.service.sandboxes.start(live, ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10)
    del harness.sandboxes.running[handle.sandbox_id]
    harness.sandboxes.fail_next("stop")
    await harness.service.reconciler.run()
    events = await harness.events(session_id)
    assert [e["event_type"] for e in events[-2:]] == ["session.sandbox.stop", "session.sandbox.error"]
    assert events[-1]["payload"]["phase"] == "stop" and live.sandbox is None


async def test_a_host_that_does_not_answer_tells_nothing_about_its_sandboxes(harness: EngineHarness):
    session_id = await harness.open_session()
    live = harness.live(session_id)
    await harness.service.sandboxes.start(live, ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10)
    before = await harness.events(session_id)

    async def no_host_answers() -> list[HostInventory]:
        return []

    harness.sandboxes.inventory = no_host_answers  # type: ignore[method-assign]
    await harness.service.reconciler.run()
    assert await harness.events(session_id) == before and live.sandbox is not None


async def test_a_pass_stops_what_no_open_session_uses(harness: EngineHarness):
    """Sandboxes of closed and unknown sessions, and commands whose sandbox is gone, are stopped;
    a closed session's log is not written to."""
    closed = await harness.open_session()
    kept = harness.sandboxes.place(closed, IMAGE)
    await harness.registry.append(closed, ACTOR, [("session.close", {"reason": "client_close"})], new_state="closed")
    await harness.registry.drop([closed])
    unknown = harness.sandboxes.place("ses_unknown", IMAGE)
    gone = SandboxHandle(FakeSandboxes.HOST, "sbx_gone", IMAGE)
    harness.sandboxes.commands["sba_orphan"] = FakeCommand(gone, "sleep 300", b"")
    logged = await harness.events(closed)

    await harness.service.reconciler.run()
    assert {("stop", kept.sandbox_id), ("stop", unknown.sandbox_id), ("kill_command", "sba_orphan")} <= set(
        harness.sandboxes.calls)
    assert harness.sandboxes.running == {}
    assert harness.sandboxes.commands["sba_orphan"].status.state == CommandState.KILLED
    assert await harness.events(closed) == logged


async def test_a_pass_kills_a_command_no_running_subagent_of_the_session_accounts_for(harness: EngineHarness):
    session_id = await harness.open_session()
    live = harness.live(session_id)
    handle, _ = await harness.service.sandboxes.start(live, ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10)
    tracked = Subagent("sba_tracked", "echoer", "m1", launched_by=ACTOR, host=handle.host)
    live.subagents.entries[tracked.subagent_id] = tracked
    for command_id in ("sba_tracked", "sba_cancelled_while_the_host_was_down"):
        harness.sandboxes.commands[command_id] = FakeCommand(handle, "sleep 300", b"")
    before = await harness.events(session_id)

    await harness.service.reconciler.run()
    commands = harness.sandboxes.commands
    assert commands["sba_cancelled_while_the_host_was_down"].status.state == CommandState.KILLED
    assert commands["sba_tracked"].status.state == CommandState.RUNNING
    assert live.sandbox == handle and await harness.events(session_id) == before


async def test_the_stops_no_session_owns_run_on_one_replica_at_a_time(harness: EngineHarness):
    """Two replicas pass at once: while one stops an unknown session's sandbox under the duty
    lease, the other leaves it alone; once the first is done the duty is free again."""
    other = fake_engine(harness.store, sandboxes=harness.sandboxes, address="127.0.0.1:50052")
    await other.start()
    try:
        stray = harness.sandboxes.place("ses_unknown", IMAGE)
        entered, release = asyncio.Event(), asyncio.Event()
        stop, stops = harness.sandboxes.stop, []

        async def held_stop(handle: SandboxHandle) -> None:
            stops.append(handle)
            if len(stops) == 1:  # the first stop waits until the test lets it go
                entered.set()
                await release.wait()
            await stop(handle)

        harness.sandboxes.stop = held_stop  # type: ignore[method-assign]
        first = asyncio.create_task(harness.service.reconciler.run())
        await entered.wait()
        await other.reconciler.run()  # finds the duty held: stops nothing
        assert stops == [stray]
        release.set()
        await first
        assert stray.sandbox_id not in harness.sandboxes.running
        assert await other.ownership.take_duty("reconcile", 30)
    finally:
        await other.stop()


async def test_a_sandbox_stopped_while_the_hosts_were_asked_is_not_taken_back(harness: EngineHarness):
    """The hosts' lists show a sandbox the session stops before the pass reaches it: the stale
    entry is left alone (the handle stays gone), and the log has the explicit stop only."""
    session_id = await harness.open_session()
    live = harness.live(session_id)
    handle, _ = await harness.service.sandboxes.start(live, ACTOR, IMAGE, owner_key=ACTOR, max_per_key=10)
    listed = harness.sandboxes.inventory

    async def stopped_meanwhile() -> list[HostInventory]:
        answer = await listed()
        await harness.service.sandboxes.stop(live, ACTOR, reason="explicit")
        return answer

    harness.sandboxes.inventory = stopped_meanwhile  # type: ignore[method-assign]
    await harness.service.reconciler.run()
    assert live.sandbox is None and harness.sandboxes.adopted == []
    tail = [(e["event_type"], e["payload"].get("reason")) for e in (await harness.events(session_id))[-2:]]
    assert tail == [("session.sandbox.stop", "explicit"), ("session.sandbox.stopped", "explicit")]
    assert handle.sandbox_id not in harness.sandboxes.running


async def test_profiles_changed_through_another_replica_reach_this_ones_image_set(harness: EngineHarness):
    """Every pass follows the store's profiles, so each replica tells the hosts the same images."""
    def create(conn, name: str, images: list[str]):
        return profiles.create(conn, {"name": name, "primary_provider": "mock", "fallback_providers": [],
                                      "mcp_servers": [], "allowed_tools": [], "available_sandboxes": images})
    elsewhere = await harness.store.write(create, f"p_{secrets.token_hex(4)}", ["busybox:other", IMAGE])
    assert harness.sandboxes.status_for(elsewhere.id) == []  # created through another replica
    await harness.service.sandboxes.follow_profiles()
    assert [image["name"] for image in harness.sandboxes.status_for(elsewhere.id)] == ["busybox:other", IMAGE]
    await harness.store.write(lambda conn: profiles.soft_delete(conn, elsewhere.id))
    await harness.service.sandboxes.follow_profiles()
    assert harness.sandboxes.status_for(elsewhere.id) == []
    # A start on this replica provisions a profile it has not seen yet before asking for its image.
    other = await harness.store.write(create, f"p_{secrets.token_hex(4)}", ["busybox:third"])
    harness.service.sandboxes.know(other)
    assert [image["name"] for image in harness.sandboxes.status_for(other.id)] == ["busybox:third"]
