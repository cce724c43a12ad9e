"""The runner as a real process, called over gRPC, against the mock LLM over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import signal
import threading
import time
from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

from bae.common.grpcutil import channel as internal_channel
from bae.common.protos import runner_pb2, runner_pb2_grpc
from bae.services.session.engine.domain import Usage
from bae.services.session.engine.ports import StepFailed, StepMessages, StepOutcome, StepRequest, StepResult, StepUpdate
from bae.services.session.remote.runner import MAX_STEP_REQUEST_BYTES, RunnerClient
from testkit.mockllm import MockLLM, Reply
from testkit.ports import free_port
from testkit.processes import TEST_PLANE, ServiceProcess, service_env
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-" + secrets.token_hex(12)
REDACTED = "\u2022" * 8
PREAMBLE = "The earlier part of this conversation was compacted. A summary follows."
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def runner_config(base_url: str) -> str:
    dead_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    return "\n".join(
        [
            mock_provider_toml(base_url, name="mock"),
            mock_provider_toml(base_url, name="mock-openai", kind="openai"),
            mock_provider_toml(base_url, name="fallback"),
            mock_provider_toml(base_url, name="missing-env", token_var="BAE_TEST_UNSET_VARIABLE"),
            mock_provider_toml(dead_url, name="down"),
            '[[providers.entries]]\nname = "unterminated"\nprovider = "anthropic"\n'
            'model = "m"\nauth_token = "${MOCK_LLM_TOKEN"\n',
            '[[providers.entries]]\nname = "small"\nprovider = "anthropic"\nmodel = "small-model"\n'
            f'base_url = "{base_url}/"\nauth_token = "${{MOCK_LLM_TOKEN}}"\nmax_tokens = 1000\n',
            '[[providers.entries]]\nname = "small-openai"\nprovider = "openai"\nmodel = "small-model"\n'
            f'base_url = "{base_url}"\nauth_token = "Bearer-less ${{MOCK_LLM_TOKEN}}"\nmax_tokens = 1000\n',
        ]
    )


@pytest.fixture(scope="module")
def llm() -> Iterator[MockLLM]:
    with MockLLM() as server:
        yield server


def start_runner(llm: MockLLM, tmp: Path) -> tuple[ServiceProcess, str]:
    """A running `python -m bae.services.runner` and its gRPC address."""
    config = tmp / "bae-config.toml"
    config.write_text(runner_config(llm.base_url))
    address = f"127.0.0.1:{free_port()}"
    env = service_env(
        BAE_RUNNER_GRPC_ADDR=address,
        BAE_PROVIDER_TIMEOUT="1",
        BAE_SHUTDOWN_TIMEOUT="5",
        BAE_LOG="debug",
        MOCK_LLM_TOKEN=TOKEN,
    )
    process = ServiceProcess(
        "bae.services.runner", "--config", str(config), env=env, log_path=tmp / "runner.log"
    )
    try:
        process.wait_grpc_serving(address, "baeproto.v1.Runner")
    except Exception:
        process.stop()
        raise
    return process, address


@pytest.fixture(scope="module")
def runner(llm: MockLLM, tmp_path_factory) -> Iterator[str]:
    """The gRPC address of a running `python -m bae.services.runner`."""
    process, address = start_runner(llm, tmp_path_factory.mktemp("runner"))
    yield address
    assert process.stop() == 0, "SIGTERM must stop the runner cleanly"
    assert TOKEN not in process.log_path.read_text(), "the auth token leaked into the runner's log"


@pytest.fixture(autouse=True)
def fresh_llm(llm: MockLLM) -> None:
    llm.reset()


async def run_step(
    runner: str,
    primary: str,
    messages: list[dict],
    *,
    fallbacks: tuple[str, ...] = (),
    tools: tuple[dict, ...] = (),
    purpose: str = "",
    min_max_tokens: int = 0,
    updates: list[list[str]] | None = None,
) -> tuple[list[tuple[str, dict]], StepResult]:
    """The step's events and result; `updates` gets each update's event types (and "result")."""
    request, history = step_request(
        primary,
        messages,
        fallback_providers=list(fallbacks),
        tools_json=json.dumps(list(tools)),
        purpose=purpose,
        min_max_tokens=min_max_tokens,
    )
    events: list[tuple[str, dict]] = []
    results = []
    async with runner_client(runner) as client:
        async for update in client.run_step(request, history, timeout=30):
            assert not results, "an update arrived after the result"
            for event in update.events:
                assert TOKEN not in event.payload.text, f"the auth token leaked into {event.event_type}"
                events.append((event.event_type, json.loads(event.payload.text)))
            if update.result is not None:
                results.append(update.result)
            if updates is not None:
                updates.append([event.event_type for event in update.events] + ["result"] * len(results))
    assert len(results) == 1, "exactly one result ends the step"
    return events, results[0]


@contextlib.asynccontextmanager
async def runner_client(address: str) -> AsyncIterator[RunnerClient]:
    """The session service's own client of the runner."""
    client = RunnerClient(address, 5.0, TEST_PLANE)
    try:
        yield client
    finally:
        await client.close()


def count_streams(client: RunnerClient) -> list[object]:
    """The RunSteps calls `client` opens from now on, one item each."""
    opened: list[object] = []
    run_steps = client.stub.RunSteps

    def counted(*args, **kwargs):
        opened.append(run_steps(*args, **kwargs))
        return opened[-1]

    client.stub.RunSteps = counted
    return opened


def step_request(primary: str, messages: list[dict], **fields) -> tuple[StepRequest, StepMessages]:
    """A step's request for RunnerClient.run_step, and its history."""
    fields = {"session_id": "ses_test", "tools_json": "[]", "fallback_providers": [], **fields}
    history = StepMessages([json.dumps(message) for message in messages], [message["role"] for message in messages])
    return StepRequest(primary_provider=primary, **fields), history


def types(events: list[tuple[str, dict]]) -> list[str]:
    return [event_type for event_type, _ in events]


def assert_sent_as_the_walk_waits(updates: list[list[str]], event_types: list[str]) -> None:
    """The updates carry `event_types` in order, then the result. An update goes out when the walk
    starts waiting for a provider (it ends with that provider's request) or with the result; which
    requests travel with their answer depends on how fast the provider answered."""
    assert sum(updates, []) == [*event_types, "result"]
    assert all(update[-1] == "provider.request" for update in updates[:-1]), updates


USER_HELLO = [{"role": "user", "content": "hello"}]
# A failed primary turn attempt, its provider_call_failed, then the fallback's attempt.
FAILOVER_EVENTS = [
    "provider.request",
    "provider.response",
    "session.error",
    "provider.request",
    "provider.response",
]


async def test_text_success_exact_payloads(runner, llm):
    llm.enqueue(Reply.text("hi there", usage=(12, 3)))
    updates: list[list[str]] = []
    events, result = await run_step(runner, "mock", USER_HELLO, tools=(WEATHER_TOOL,), updates=updates)

    assert types(events) == ["provider.request", "provider.response"]
    assert_sent_as_the_walk_waits(updates, ["provider.request", "provider.response"])
    assert events[0][1] == {
        "attempt": 0,
        "kind": "primary",
        "provider": "anthropic",
        "base_url": llm.base_url,
        "model": "mock-model",
        "max_tokens": 4096,
        "messages": USER_HELLO,
        "tools": [WEATHER_TOOL],
    }
    response = events[1][1]
    assert response == {
        "attempt": 0,
        "kind": "primary",
        "provider": "anthropic",
        "ok": True,
        "status": 200,
        "body": response["body"],
        "usage": {"input_tokens": 12, "output_tokens": 3},
    }
    assert response["body"]["content"] == [{"type": "text", "text": "hi there"}]
    assert response["body"]["stop_reason"] == "end_turn"

    assert result.outcome == StepOutcome.OK
    assert json.loads(result.message_json) == {
        "role": "assistant",
        "content": [{"type": "text", "text": "hi there"}],
    }
    assert result.usage == Usage(12, 3)
    assert result.truncated == ""

    (seen,) = llm.requests
    assert seen["path"] == "/v1/messages"
    assert seen["headers"]["x-api-key"] == TOKEN
    assert seen["headers"]["anthropic-version"] == "2023-06-01"
    assert "authorization" not in seen["headers"]
    assert seen["headers"]["content-type"] == "application/json"
    assert seen["body"] == {
        "model": "mock-model",
        "max_tokens": 4096,
        "messages": USER_HELLO,
        "tools": [WEATHER_TOOL],
    }


async def test_a_slow_providers_request_event_goes_out_while_it_waits(runner, llm):
    llm.enqueue(Reply.hang(0.5))
    async with runner_client(runner) as client:
        started = time.monotonic()
        updates = client.run_step(*step_request("mock", USER_HELLO), timeout=30)
        first = await anext(updates)
        waited = time.monotonic() - started
        rest = [update async for update in updates]
    assert [event.event_type for event in first.events] == ["provider.request"]
    assert not first.result is not None
    assert waited < 0.4, f"the request event waited {waited:.3f} s, for the provider's answer"
    assert [[event.event_type for event in update.events] for update in rest] == [["provider.response"]]
    assert rest[-1].result is not None


async def test_a_fast_providers_request_event_goes_with_its_answer(runner, llm):
    # The provider answering within the runner's 5 ms is up to the machine, so of a few quick
    # steps one must have gone out as a single update.
    sent = []
    async with runner_client(runner) as client:
        for _ in range(5):
            llm.enqueue(Reply.text("quick"))
            updates = [update async for update in client.run_step(*step_request("mock", USER_HELLO), timeout=30)]
            sent.append([[event.event_type for event in update.events] for update in updates])
            if len(updates) == 1:
                break
    assert [["provider.request", "provider.response"]] in sent, sent


async def test_a_compactions_request_event_is_never_held(runner, llm):
    llm.enqueue(Reply.text("summary"))
    updates: list[list[str]] = []
    await run_step(runner, "mock", USER_HELLO, purpose="compaction", updates=updates)
    assert updates == [["provider.request"], ["provider.response", "result"]]


async def test_a_history_is_sent_as_the_texts_that_came_in(runner, llm):
    # Texts in a spacing of their own: a re-serialization would show.
    texts = ['{"role": "user",  "content": "hello"}', '{"role": "assistant",  "content": "hi"}',
             '{"role": "user",  "content": "again"}']
    request = StepRequest(session_id="ses_test", primary_provider="mock", fallback_providers=[], tools_json="[]")
    llm.enqueue(Reply.text("ok"))
    async with runner_client(runner) as client:
        updates = [u async for u in client.run_step(request, StepMessages(texts, ["user", "assistant", "user"]), timeout=30)]
    first = updates[0].events[0]
    assert first.event_type == "provider.request"
    assert '"messages":[' + ",".join(texts) + "]" in first.payload.text
    assert llm.requests[0]["body"]["messages"] == [json.loads(text) for text in texts]


async def test_a_step_sends_what_changed_and_the_runner_keeps_the_rest(runner, llm):
    texts = [json.dumps({"role": role, "content": f"message {i}"}) for i, role in enumerate(["user", "assistant"] * 3)]
    roles = ["user", "assistant"] * 3

    def start(session_id: str, kept: int, new: slice, forget: tuple[str, ...] = (), hold: bool = True) -> runner_pb2.StepStart:
        return runner_pb2.StepStart(request=runner_pb2.StepRequest(
            session_id=session_id, primary_provider="mock", tools_json="[]", kept_messages=kept,
            messages=texts[new], roles=roles[new], forget_sessions=forget, hold_history=hold))

    for _ in range(6):
        llm.enqueue(Reply.text("ok"))
    async with raw_step_stream(runner) as step:
        # The whole history, then the same session's next step keeps three and adds two.
        first = await step(start("ses_a", 0, slice(0, 3)))
        second = await step(start("ses_a", 3, slice(3, 5)))
        # One message fewer than held, then one more: a step may keep any part of what is held.
        third = await step(start("ses_a", 2, slice(2, 6)))
        assert (await step(start("ses_a", 7, slice(0, 0)))).refused == (
            "the step keeps 7 messages of the session's history; the runner holds 6")
        # A refusal drops the session's history: only a step that keeps nothing is taken now.
        assert "the runner holds 0" in (await step(start("ses_a", 1, slice(1, 2)))).refused
        fourth = await step(start("ses_a", 0, slice(0, 2)))
        # A session the caller names is forgotten before the step is taken.
        held_b = await step(start("ses_b", 0, slice(0, 1), forget=("ses_a",)))
        assert "the runner holds 0" in (await step(start("ses_a", 2, slice(2, 3)))).refused
        # A step that does not ask for its history to be held leaves none: the runner says so.
        unheld = await step(start("ses_b", 0, slice(0, 2), hold=False))
        assert "the runner holds 0" in (await step(start("ses_b", 1, slice(1, 2)))).refused
    sent = [request["body"]["messages"] for request in llm.requests]
    assert sent == [[json.loads(text) for text in texts[:n]] for n in (3, 5, 6, 2, 1, 2)]
    for reply in (first, second, third, fourth):
        request_event = reply.events[0]
        assert request_event.event_type == "provider.request" and request_event.messages_as_sent
        assert "messages" not in json.loads(request_event.payload_json)
    assert all(update.history_held for update in held_b.updates)
    assert not any(update.history_held for update in unheld.updates)


async def test_a_history_the_runner_changes_comes_back_in_its_request_event(runner, llm):
    # A routing field is dropped before the provider sees it: the event carries what was sent.
    tagged = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {}, "dispatch": "client"}]}
    answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "sunny"}]}
    history = [*USER_HELLO, tagged, answer]
    llm.enqueue(Reply.text("ok"))
    async with raw_step_stream(runner) as step:
        reply = await step(runner_pb2.StepStart(request=runner_pb2.StepRequest(
            session_id="ses_a", primary_provider="mock", tools_json="[]",
            messages=[json.dumps(message) for message in history], roles=[m["role"] for m in history])))
    request_event = reply.events[0]
    assert not request_event.messages_as_sent
    stripped = {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {}}]}
    assert json.loads(request_event.payload_json)["messages"] == [*USER_HELLO, stripped, answer]
    assert llm.requests[0]["body"]["messages"] == [*USER_HELLO, stripped, answer]


async def test_a_client_sends_each_history_whole_through_the_runner_it_keeps(runner, llm):
    """RunnerClient over one stream: the history grows, has its last message replaced (as a
    compaction instruction does), shrinks, and starts again; every provider call and every
    `provider.request` carries the whole history, and a refusal does not lose the next step."""
    messages = [{"role": role, "content": f"m{i}"} for i, role in enumerate(["user", "assistant"] * 4)]
    histories = [messages[:1], messages[:3], messages[:5], [*messages[:4], {"role": "user", "content": "summarize"}],
                 messages[:2], messages[:7]]
    async with runner_client(runner) as client:
        for history in histories:
            llm.enqueue(Reply.text("ok"))
            updates = [u async for u in client.run_step(*step_request("mock", history), timeout=30)]
            assert json.loads(updates[0].events[0].payload.text)["messages"] == history
            assert client.runner_holds_histories  # from the first step's replies on
        # A step the runner refuses (its tools are not JSON) is the step's failure; the next one is whole.
        request, texts = step_request("mock", messages, tools_json="{")
        with pytest.raises(StepFailed, match="tools_json is not valid JSON"):
            async for _ in client.run_step(request, texts, timeout=30):
                pass
        llm.enqueue(Reply.text("ok"))
        updates = [u async for u in client.run_step(*step_request("mock", messages), timeout=30)]
        assert json.loads(updates[0].events[0].payload.text)["messages"] == messages
    assert [request["body"]["messages"] for request in llm.requests] == [*histories, messages]


async def test_messages_and_roles_must_pair_up(runner, llm):
    async with raw_step_stream(runner) as step:
        reply = await step(runner_pb2.StepStart(request=runner_pb2.StepRequest(
            session_id="ses_test", primary_provider="mock", messages=['{"role":"user","content":"hi"}'], roles=[])))
        assert reply.refused == "1 messages but 0 roles"
        # Only the step failed: the stream serves the next one.
        llm.enqueue(Reply.text("still here"))
        request, history = step_request("mock", USER_HELLO)
        reply = await step(runner_pb2.StepStart(request=runner_pb2.StepRequest(
            session_id="ses_test", primary_provider="mock", messages=history.texts, roles=history.roles)))
    assert reply.result is not None
    assert json.loads(reply.result.message_json)["content"] == [{"type": "text", "text": "still here"}]
    with pytest.raises(ValueError, match="1 messages but 0 roles"):
        async with runner_client(runner) as client:
            async for _ in client.run_step(request, StepMessages(['{"role":"user","content":"hi"}'], []), timeout=30):
                pass


@dataclasses.dataclass
class StepReplies:
    """What one step answered: its events and result, or its refusal."""

    updates: list[runner_pb2.StepUpdate] = dataclasses.field(default_factory=list)
    events: list[runner_pb2.StepEvent] = dataclasses.field(default_factory=list)
    result: runner_pb2.StepResult | None = None
    refused: str = ""


@contextlib.asynccontextmanager
async def raw_step_stream(address: str):
    """A `RunSteps` stream driven by hand: `step(start)` sends one step and returns what it
    answered, one step at a time."""
    calls: asyncio.Queue = asyncio.Queue()
    step_ids = iter(range(1, 1000))

    async def packs():
        while (call := await calls.get()) is not None:
            yield runner_pb2.StepCalls(calls=[call])

    async with internal_channel(address, TEST_PLANE) as channel:
        stream = runner_pb2_grpc.RunnerStub(channel).RunSteps(packs(), timeout=30)
        replies = stream.__aiter__()

        async def step(start: runner_pb2.StepStart) -> StepReplies:
            await calls.put(runner_pb2.StepCall(step_id=next(step_ids), start=start))
            answered = StepReplies()
            while True:
                for reply in (await anext(replies)).replies:
                    if reply.WhichOneof("kind") == "refused":
                        answered.refused = reply.refused
                        return answered
                    answered.updates.append(reply.update)
                    answered.events += reply.update.events
                    if reply.update.HasField("result"):
                        answered.result = reply.update.result
                        return answered

        try:
            yield step
        finally:
            await calls.put(None)
            async for _ in replies:
                pass


async def test_missing_usage_is_null(runner, llm):
    llm.enqueue(Reply.text("hi", usage=None))
    events, result = await run_step(runner, "mock", USER_HELLO)
    assert events[1][1]["usage"] is None
    assert result.outcome == StepOutcome.OK and result.usage is None


async def test_primary_500_then_fallback(runner, llm):
    llm.enqueue(Reply.error(500, '{"error":"boom"}'), Reply.text("from fallback"))
    updates: list[list[str]] = []
    events, result = await run_step(
        runner, "mock", USER_HELLO, fallbacks=("not-in-registry", "fallback"), updates=updates
    )
    assert types(events) == FAILOVER_EVENTS
    # What the failed attempt recorded goes with the next attempt's request, or with the result.
    assert_sent_as_the_walk_waits(updates, FAILOVER_EVENTS)
    assert events[1][1] == {
        "attempt": 0,
        "kind": "primary",
        "provider": "anthropic",
        "ok": False,
        "status": 500,
        "error": "provider returned HTTP 500",
        "body": '{"error":"boom"}',
    }
    assert events[2][1] == {
        "reason": "provider_call_failed",
        "provider": "anthropic",
        "detail": "provider returned HTTP 500",
    }
    assert events[3][1]["attempt"] == 1 and events[3][1]["kind"] == "fallback"
    assert events[4][1]["ok"] is True and events[4][1]["kind"] == "fallback"
    assert json.loads(result.message_json)["content"] == [{"type": "text", "text": "from fallback"}]
    assert len(llm.requests) == 2, "the SDK must not retry on its own"


async def test_all_failed(runner, llm):
    llm.enqueue(Reply.error(503, "overloaded"))
    events, result = await run_step(runner, "mock", USER_HELLO, fallbacks=("down",))
    assert types(events) == FAILOVER_EVENTS
    assert events[1][1]["status"] == 503 and events[1][1]["body"] == "overloaded"
    down = events[4][1]
    assert down["ok"] is False and down["status"] is None and down["body"] is None
    assert down["error"].startswith("connection error")
    assert "127.0.0.1" not in down["error"], "the request URL is stripped from transport errors"
    assert result.outcome == StepOutcome.ALL_FAILED
    assert result.attempts == 2
    assert len(llm.requests) == 1


async def test_single_provider_failure_writes_no_provider_call_failed(runner, llm):
    llm.enqueue(Reply.error(429, "slow down"))
    events, result = await run_step(runner, "mock", USER_HELLO)
    assert types(events) == ["provider.request", "provider.response"]
    assert events[1][1]["error"] == "provider returned HTTP 429"
    assert (result.outcome, result.attempts) == (StepOutcome.ALL_FAILED, 1)


async def test_missing_env_var_fails_the_attempt_and_walks_on(runner, llm):
    events, result = await run_step(runner, "missing-env", USER_HELLO, fallbacks=("mock",))
    detail = "environment variable BAE_TEST_UNSET_VARIABLE referenced by provider config is not set"
    assert events[1][1] == {
        "attempt": 0,
        "kind": "primary",
        "provider": "anthropic",
        "ok": False,
        "status": None,
        "error": detail,
        "body": None,
    }
    assert events[2][1] == {"reason": "provider_call_failed", "provider": "anthropic", "detail": detail}
    assert result.outcome == StepOutcome.OK
    assert len(llm.requests) == 1


async def test_unterminated_token(runner, llm):
    events, result = await run_step(runner, "unterminated", USER_HELLO)
    assert events[1][1]["error"] == "unterminated ${...} token in provider config"
    assert events[1][1]["status"] is None
    assert (result.outcome, result.attempts) == (StepOutcome.ALL_FAILED, 1)
    assert llm.requests == []


async def test_primary_not_in_registry(runner, llm):
    events, result = await run_step(runner, "nope", USER_HELLO, fallbacks=("mock",))
    assert events == []
    assert result.outcome == StepOutcome.PROVIDER_CONFIG
    assert result.detail == 'primary provider "nope" is not configured in bae-config.toml'


async def test_openai_tool_round_trip(runner, llm):
    llm.enqueue(Reply.tool_use([("call_1", "get_weather", {"city": "Paris"})], usage=(30, 8)))
    events, result = await run_step(runner, "mock-openai", USER_HELLO, tools=(WEATHER_TOOL,))
    assert events[0][1]["provider"] == "openai" and "normalized" not in events[0][1]
    assert events[1][1]["usage"] == {"input_tokens": 30, "output_tokens": 8}
    assert events[1][1]["body"]["choices"][0]["finish_reason"] == "tool_calls"
    assistant = json.loads(result.message_json)
    assert assistant == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}],
    }
    first = llm.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert "x-api-key" not in first["headers"]
    assert first["body"] == {
        "model": "mock-model",
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": "hello"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather",
                    "parameters": WEATHER_TOOL["input_schema"],
                },
            }
        ],
    }

    # The engine tags the tool_use with `dispatch` and answers it; the runner strips the tag.
    tagged = {"role": "assistant", "content": [{**assistant["content"][0], "dispatch": "client"}]}
    answer = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "sunny"}]}],
    }
    llm.enqueue(Reply.text("It is sunny in Paris."))
    events, result = await run_step(runner, "mock-openai", [*USER_HELLO, tagged, answer])
    assert events[0][1]["messages"] == [*USER_HELLO, {"role": "assistant", "content": assistant["content"]}, answer]
    assert llm.requests[1]["body"] == {
        "model": "mock-model",
        "max_tokens": 4096,
        "messages": [
            {"role": "user", "content": "hello"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    }
    assert json.loads(result.message_json)["content"] == [{"type": "text", "text": "It is sunny in Paris."}]


async def test_mixed_kind_fallback(runner, llm):
    # Assistant-first history: the anthropic attempt normalizes it, the openai one does not.
    history = [{"role": "assistant", "content": "summary"}, {"role": "user", "content": "go on"}]
    llm.enqueue(Reply.error(502, "bad gateway"), Reply.tool_use([("call_9", "get_weather", {})]))
    events, result = await run_step(runner, "mock", history, fallbacks=("mock-openai",), tools=(WEATHER_TOOL,))
    assert types(events) == FAILOVER_EVENTS
    anthropic_request, openai_request = events[0][1], events[3][1]
    assert anthropic_request["normalized"] == {"prepended_user": True, "merged": []}
    assert anthropic_request["messages"][0] == {"role": "user", "content": [{"type": "text", "text": PREAMBLE}]}
    assert openai_request["provider"] == "openai" and "normalized" not in openai_request
    assert openai_request["messages"] == history
    assert [r["path"] for r in llm.requests] == ["/v1/messages", "/v1/chat/completions"]
    assert json.loads(result.message_json)["content"] == [
        {"type": "tool_use", "id": "call_9", "name": "get_weather", "input": {}}
    ]


async def test_compaction_raises_budget_and_reports_truncation(runner, llm):
    llm.enqueue(Reply.error(500, "x"), Reply.truncated("partial summ"))
    events, result = await run_step(
        runner, "small", USER_HELLO, fallbacks=("small",), purpose="compaction", min_max_tokens=4096
    )
    assert types(events) == ["provider.request", "provider.response"] * 2, "compaction writes no session.error"
    assert all(payload["purpose"] == "compaction" for _, payload in events)
    assert events[0][1]["max_tokens"] == 4096
    assert events[0][1]["base_url"] == llm.base_url, "trailing / trimmed"
    assert all(r["body"]["max_tokens"] == 4096 for r in llm.requests)
    assert result.outcome == StepOutcome.OK
    assert result.truncated == "stop_reason max_tokens"

    llm.enqueue(Reply.truncated("partial"))
    _, result = await run_step(runner, "small-openai", USER_HELLO, purpose="compaction", min_max_tokens=4096)
    assert result.truncated == "finish_reason length"
    assert llm.requests[-1]["body"]["max_tokens"] == 4096

    # A turn never reports truncation and keeps the entry's own budget.
    llm.enqueue(Reply.truncated("partial"))
    events, result = await run_step(runner, "small", USER_HELLO)
    assert "purpose" not in events[0][1] and events[0][1]["max_tokens"] == 1000
    assert result.truncated == ""


async def test_token_never_reaches_events(runner, llm):
    # A provider that echoes the credential back must not get it into the log.
    llm.enqueue(Reply.error(401, f'{{"error":"invalid x-api-key {TOKEN}"}}'))
    llm.enqueue(Reply.raw({"choices": [{"message": {"role": "assistant", "content": TOKEN}}]}))
    events, result = await run_step(runner, "mock", USER_HELLO, fallbacks=("mock-openai",))
    # The space goes too: " sk-test-…" is a run of another entry's secret ("Bearer-less ${TOKEN}").
    assert events[1][1]["body"] == f'{{"error":"invalid x-api-key{REDACTED}"}}'
    assert events[4][1]["body"]["choices"][0]["message"]["content"] == REDACTED
    assert llm.requests[0]["headers"]["x-api-key"] == TOKEN
    assert llm.requests[1]["headers"]["authorization"] == f"Bearer {TOKEN}"
    # Literal text around ${VAR} is kept; the whole resolved value is the token sent.
    llm.enqueue(Reply.text("ok"))
    await run_step(runner, "small-openai", USER_HELLO)
    assert llm.requests[2]["headers"]["authorization"] == f"Bearer Bearer-less {TOKEN}"


async def test_unreadable_success_bodies_fail_the_attempt(runner, llm):
    llm.enqueue(Reply.error(200, "not json at all"))
    events, _ = await run_step(runner, "mock", USER_HELLO)
    assert events[1][1]["status"] == 200 and events[1][1]["ok"] is False
    assert events[1][1]["error"].startswith("provider returned non-JSON body: ")
    assert events[1][1]["body"] == "not json at all"

    llm.enqueue(Reply.raw({"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}}]}))
    events, result = await run_step(runner, "mock-openai", USER_HELLO)
    assert events[1][1]["status"] is None
    assert events[1][1]["error"] == "provider tool call is missing function.name"
    assert result.outcome == StepOutcome.ALL_FAILED


async def test_attempt_timeout(runner, llm):
    llm.enqueue(Reply.hang(3))
    started = time.monotonic()
    events, result = await run_step(runner, "mock", USER_HELLO, fallbacks=("fallback",))
    assert time.monotonic() - started < 2.5
    assert events[1][1]["status"] is None
    assert events[1][1]["error"] == "request timed out after 1 s"
    assert result.outcome == StepOutcome.OK


# -- Retry-After ---------------------------------------------------------------------


async def test_rate_limited_entries_are_tried_again_in_the_order_their_waits_end(runner, llm):
    llm.enqueue(
        Reply.error(429, "primary", {"retry-after": "1"}),
        Reply.error(529, "fallback", {"retry-after-ms": "200"}),
        Reply.text("fallback, later"),
    )
    updates: list[list[str]] = []
    events, result = await run_step(runner, "mock", USER_HELLO, fallbacks=("fallback",), updates=updates)
    assert types(events) == [*FAILOVER_EVENTS, "provider.request", "provider.response"]
    assert [(payload["attempt"], payload["kind"], payload.get("retry_after")) for kind, payload in events
            if kind == "provider.response"] == [(0, "primary", 1), (1, "fallback", 0.2), (2, "fallback", None)]
    assert (result.outcome, result.attempts) == (StepOutcome.OK, 3)
    # The failed fallback's answer goes out as the wait starts, not with the retry's request.
    assert sum(updates, []) == [*types(events), "result"]
    assert ["provider.response"] in [update[-1:] for update in updates[:-1]], updates
    assert llm.requests[2]["received"] - llm.requests[1]["received"] >= 0.2
    assert len(llm.requests) == 3


async def test_a_retry_that_is_rate_limited_again_ends_the_walk(runner, llm):
    llm.enqueue(*[Reply.error(429, "still busy", {"retry-after-ms": "100"})] * 2)
    events, result = await run_step(runner, "mock", USER_HELLO)
    assert [payload["attempt"] for kind, payload in events if kind == "provider.response"] == [0, 1]
    assert (result.outcome, result.attempts) == (StepOutcome.ALL_FAILED, 2)
    assert len(llm.requests) == 2


async def test_a_500_with_retry_after_is_not_tried_again(runner, llm):
    llm.enqueue(Reply.error(503, "down", {"retry-after": "1"}))
    events, result = await run_step(runner, "mock", USER_HELLO)
    assert "retry_after" not in events[1][1]
    assert (result.outcome, result.attempts) == (StepOutcome.ALL_FAILED, 1)
    assert len(llm.requests) == 1


async def test_the_steps_deadline_ends_a_wait_for_retry_after(runner, llm):
    llm.enqueue(Reply.error(429, "slow down", {"retry-after": "1"}))
    async with runner_client(runner) as client:
        with pytest.raises(StepFailed, match="longer than 0.5 s"):
            async for _ in client.run_step(*step_request("mock", USER_HELLO), timeout=0.5):
                pass
        await asyncio.sleep(1.2)
    assert len(llm.requests) == 1, "the step tried again after its deadline"


# -- the step stream ------------------------------------------------------------------


async def test_concurrent_steps_share_one_stream_and_each_gets_its_own_replies(runner, llm):
    release = threading.Event()
    for _ in range(3):
        llm.enqueue(Reply.held(release))
    async with runner_client(runner) as client:
        opened = count_streams(client)

        async def step(word: str) -> list[StepUpdate]:
            request = step_request("mock", [{"role": "user", "content": word}])
            return [update async for update in client.run_step(*request, timeout=30)]

        steps = [asyncio.ensure_future(step(word)) for word in ("one", "two", "three")]
        while len(llm.requests) < 3:  # all three wait on the provider at once
            await asyncio.sleep(0.02)
        release.set()
        answers = await asyncio.gather(*steps)
    assert len(opened) == 1
    for word, updates in zip(("one", "two", "three"), answers):
        request_event = json.loads(updates[0].events[0].payload.text)
        assert request_event["messages"] == [{"role": "user", "content": word}]
        assert [update.result is not None for update in updates] == [False, True]
        assert updates[-1].result.outcome == StepOutcome.OK


async def test_a_step_its_caller_stops_waiting_for_is_stopped(runner, llm):
    # Unstopped, the walk would give up on the primary after its 1 s timeout and call the fallback.
    llm.enqueue(Reply.hang(3))
    async with runner_client(runner) as client:
        updates = client.run_step(*step_request("mock", USER_HELLO, fallback_providers=["fallback"]), timeout=30)
        first = await anext(updates)
        assert first.events[0].event_type == "provider.request"
        await updates.aclose()
        await asyncio.sleep(1.8)
        assert len(llm.requests) == 1, "the stopped step went on to its fallback"
        # The stream carries on.
        llm.enqueue(Reply.text("next"))
        answer = [update async for update in client.run_step(*step_request("mock", USER_HELLO), timeout=30)]
    assert answer[-1].result.outcome == StepOutcome.OK


async def test_a_step_that_overruns_its_deadline_fails_and_is_stopped(runner, llm):
    llm.enqueue(Reply.hang(3))
    async with runner_client(runner) as client:
        with pytest.raises(StepFailed, match="longer than 0.5 s"):
            async for _ in client.run_step(*step_request("mock", USER_HELLO, fallback_providers=["fallback"]),
                                           timeout=0.5):
                pass
        await asyncio.sleep(1.5)
    assert len(llm.requests) == 1, "the step went on after its deadline"


async def test_a_runner_shutting_down_finishes_running_steps_then_ends_the_stream(llm, tmp_path):
    process, address = start_runner(llm, tmp_path)
    release = threading.Event()
    llm.enqueue(Reply.held(release))
    try:
        async with runner_client(address) as client:
            running = client.run_step(*step_request("mock", USER_HELLO), timeout=30)
            assert (await anext(running)).events[0].event_type == "provider.request"
            process.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            # A step asked for now is refused (or finds the stream ended): it never runs.
            with pytest.raises(StepFailed, match="shutting down"):
                async for _ in client.run_step(*step_request("mock", USER_HELLO), timeout=30):
                    pass
            release.set()
            rest = [update async for update in running]
            assert rest[-1].result.outcome == StepOutcome.OK
            started = time.monotonic()
            assert await asyncio.to_thread(process.process.wait, 5) == 0
            assert time.monotonic() - started < 2, "an idle stream held the shutdown to its budget"
    finally:
        release.set()
        process.stop()
    assert len(llm.requests) == 1


async def test_a_request_too_large_for_the_stream_fails_its_step_alone(runner, llm):
    huge = [{"role": "user", "content": "x" * MAX_STEP_REQUEST_BYTES}]
    async with runner_client(runner) as client:
        with pytest.raises(StepFailed, match="over the"):
            async for _ in client.run_step(*step_request("mock", huge), timeout=30):
                pass
        llm.enqueue(Reply.text("fine"))
        answer = [update async for update in client.run_step(*step_request("mock", USER_HELLO), timeout=30)]
    assert answer[-1].result.outcome == StepOutcome.OK
    assert len(llm.requests) == 1


async def test_a_caller_that_stops_writing_still_gets_its_running_steps_answered(runner, llm):
    llm.enqueue(Reply.text("half-closed"))
    _, history = step_request("mock", USER_HELLO)
    request = runner_pb2.StepRequest(
        session_id="ses_test", primary_provider="mock", tools_json="[]", messages=history.texts, roles=history.roles
    )
    start = runner_pb2.StepStart(request=request)
    async with internal_channel(runner, TEST_PLANE) as channel:
        # The request iterator ends after the start: the client half-closes at once.
        packs = [runner_pb2.StepCalls(calls=[runner_pb2.StepCall(step_id=7, start=start)])]
        call = runner_pb2_grpc.RunnerStub(channel).RunSteps(iter(packs), timeout=30)
        replies = [reply async for pack in call for reply in pack.replies]
    assert {reply.step_id for reply in replies} == {7}
    assert json.loads(replies[-1].update.result.message_json)["content"] == [{"type": "text", "text": "half-closed"}]


def test_a_second_runner_on_a_port_in_use_fails_to_start(runner, llm, tmp_path):
    # Sharing the port would split the session service's connections between the two.
    env = service_env(BAE_RUNNER_GRPC_ADDR=runner, MOCK_LLM_TOKEN=TOKEN)
    (tmp_path / "bae-config.toml").write_text(runner_config(llm.base_url))
    second = ServiceProcess("bae.services.runner", "--config", str(tmp_path / "bae-config.toml"), env=env,
                            log_path=tmp_path / "second.log")
    try:
        assert second.process.wait(30) == 1
    finally:
        second.stop()
    assert "cannot bind gRPC address" in second.log_path.read_text()
