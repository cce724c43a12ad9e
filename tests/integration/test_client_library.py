"""bae_client, sync and async, against a stack of service processes and the scripted mock LLM: the tool loop
and its hooks, typed events and errors, the subscribed signal, and subscriptions that resume after `lagged`
or a dropped connection with no gap and no duplicate (deltas included).

A dropped connection is a real one: the subscriber reaches the gateway through a TCP relay (`Relay`) whose
open connections the test shuts down, as a network or a proxy restart would.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from bae_client import (
    ApiError,
    AsyncClient,
    Client,
    Delta,
    DriverNotRegisteredError,
    Event,
    EventType,
    Hooks,
    ProvidersFailedError,
    RpcError,
    Tool,
    ToolError,
    TransportError,
    TurnCancelledError,
    UnknownToolError,
)
from testkit.mockllm import MockLLM, Reply
from testkit.ports import free_port
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"
TEXT = "The quick brown fox jumps over the lazy dog, twice, and then once more for luck."


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, mock: MockLLM) -> Iterator[RunningStack]:
    # "mock" speaks Anthropic Messages, "gpt" OpenAI Chat Completions: the same MockLLM behind both.
    toml = mock_provider_toml(mock.base_url) + mock_provider_toml(mock.base_url, name="gpt", kind="openai")
    stack = launch_stack(tmp_path_factory.mktemp("client-library"), toml, MOCK_LLM_TOKEN=TOKEN)
    yield stack
    stack.close()


@pytest.fixture
def stack(running: RunningStack, mock: MockLLM) -> RunningStack:
    mock.reset()
    return running


def new_key(stack: RunningStack, tools: tuple[str, ...] = ("get_time",), **profile: Any) -> tuple[str, dict]:
    """A client key on a new profile allowing `tools`, and the profile."""
    row = stack.create_profile(f"p{time.monotonic_ns()}", allowed_tools=list(tools), **profile)
    return stack.create_key(row["id"])["key"], row


class Relay:
    """A TCP relay to the gateway's client port; `cut()` shuts down every connection open through it."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.sockets: list[socket.socket] = []
        self.cuts = 0
        self.closed_until = 0.0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.server.accept()
            except OSError:
                return
            time.sleep(max(0.0, self.closed_until - time.monotonic()))  # as a network that takes a while back
            upstream = socket.create_connection(self.target)
            self.sockets += [downstream, upstream]
            for source, sink in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self, down_for: float = 0.0) -> None:
        """Shut every open connection down; a new one reaches the gateway only after `down_for` seconds."""
        self.closed_until = time.monotonic() + down_for
        self.cuts += 1
        for end in self.sockets:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.sockets = []

    def close(self) -> None:
        self.server.close()
        self.cut()


# --- the loop, its hooks and its errors ---------------------------------------------------------

def test_send_runs_the_tools_with_the_hooks_in_bae_pys_order(stack: RunningStack, mock: MockLLM) -> None:
    key, _ = new_key(stack)
    seen: list[tuple[str, Any]] = []

    def after_tool_call(block: dict) -> None:
        seen.append(("after_tool_call", block["content"]))
        block["content"] += " (checked)"  # a hook may rewrite the result before it is sent

    hooks = Hooks(before_send=lambda message: seen.append(("before_send", message["content"])),
                  after_receive=lambda message: seen.append(("after_receive", len(message["content"]))),
                  before_tool_call=lambda call: seen.append(("before_tool_call", call["name"])),
                  after_tool_call=after_tool_call,
                  on_event=lambda event: seen.append(("on_event", event.event_type)))
    inputs: list[dict] = []

    @Tool.define(description="The time in a zone")
    def get_time(input: dict) -> str:
        inputs.append(input)
        return "noon"

    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {"zone": "UTC"})], text="Let me look. "),
                 Reply.text("It is noon."))
    live: list[Event] = []
    with Client(stack.client_url, client_key=key, hooks=hooks) as bae:
        session = bae.open(tools=[get_time])
        reply = session.send("What time is it?", on_event=live.append)
    assert reply.text == "It is noon." and inputs == [{"zone": "UTC"}]
    results = [{"type": "tool_result", "tool_use_id": "tu_1", "content": "noon (checked)"}]
    assert seen == [
        ("before_send", "What time is it?"),
        *[("on_event", kind) for kind in ("provider.request", "provider.response", "tool.call",
                                          "server.message.send")],
        ("after_receive", 2),
        ("before_tool_call", "get_time"),
        ("after_tool_call", "noon"),
        ("before_send", results),
        *[("on_event", kind) for kind in ("provider.request", "provider.response", "server.message.send")],
        ("after_receive", 1),
    ]
    assert [event.event_type for event in live] == [kind for name, kind in seen if name == "on_event"]
    assert mock.requests[-1]["body"]["messages"][-1]["content"] == results
    assert all(isinstance(event.event_type, EventType) for event in reply.events)
    assert reply.events[0].event_type is EventType.CLIENT_MESSAGE_SEND
    assert reply.events[0].payload["content"] == results


def test_a_failing_tool_a_missing_handler_and_a_failing_hook_stop_the_loop(stack: RunningStack,
                                                                           mock: MockLLM) -> None:
    key, _ = new_key(stack)

    def broken(input: dict) -> str:
        raise ValueError("no clock")

    with Client(stack.client_url, client_key=key) as bae:
        session = bae.open(tools=[Tool("get_time", handler=broken)])
        mock.enqueue(Reply.tool_use([("tu_1", "get_time", {})]))
        with pytest.raises(ToolError) as failed:
            session.send("time?")
        assert failed.value.name == "get_time" and isinstance(failed.value.cause, ValueError)
        assert session.cancel_turn() is True  # the turn waited for the result

        session.tools["get_time"] = Tool("get_time")  # declared, no handler
        mock.enqueue(Reply.tool_use([("tu_2", "get_time", {})]))
        with pytest.raises(UnknownToolError):
            session.send("time?")
        assert session.cancel_turn() is True

    def refuse(message: dict) -> None:
        raise PermissionError("not now")

    with Client(stack.client_url, client_key=key, hooks=Hooks(before_send=refuse)) as bae:
        session = bae.open(tools=[Tool("get_time")])
        with pytest.raises(Exception) as hooked:
            session.send("time?")
        assert type(hooked.value).__name__ == "HookError" and hooked.value.hook == "before_send"  # type: ignore
        assert [event.event_type for event in session.all_events()] == ["session.open", "session.driver.register"]


def test_all_providers_failing_raises_providers_failed(stack: RunningStack, mock: MockLLM) -> None:
    key, _ = new_key(stack, fallback_providers=["gpt"])
    mock.enqueue(Reply.error(500, "a"), Reply.error(503, "b"))
    with Client(stack.client_url, client_key=key) as bae:
        session = bae.open(tools=[Tool("get_time")])
        with pytest.raises(ProvidersFailedError) as failed:
            session.send("hi")
    assert failed.value.assistant_message["content"][0]["text"] == "The provider is currently unavailable."
    assert failed.value.events[-1].payload == {"reason": "all_providers_failed", "attempts": 2}


def test_typed_errors(stack: RunningStack, mock: MockLLM) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    with Client(nobody, client_key="bae_x") as bae:
        with pytest.raises(TransportError) as unreachable:
            bae.open()
    assert nobody in str(unreachable.value) and "bae run" in str(unreachable.value)
    assert unreachable.value.url == nobody

    key, _ = new_key(stack)
    with Client(stack.client_url) as bae:
        with pytest.raises(ApiError) as refused:
            bae.open(client_key="bae_" + "0" * 48)
        assert (refused.value.status, refused.value.type) == (401, "unauthorized")
        with pytest.raises(ValueError, match="BAE_CLIENT_KEY"):
            bae.open()
        session = bae.open(client_key=key, tools=[Tool("get_time")])
        with pytest.raises(DriverNotRegisteredError) as unregistered:
            session.call("session.sendMessage", {"message": {"content": "x"}})
        assert unregistered.value.code == -32001 and isinstance(unregistered.value, RpcError)

        # A turn another thread cancels ends with TurnCancelledError.
        release = threading.Event()
        mock.enqueue(Reply.held(release))
        outcome: list[BaseException] = []

        def send() -> None:
            try:
                session.send("wait for it")
            except BaseException as exc:  # noqa: B036 - handed to the test's thread
                outcome.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 30
        while not any(event.event_type == "provider.request" for event in session.all_events()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert session.cancel_turn() is True
        sender.join(30)
        release.set()
        assert len(outcome) == 1 and isinstance(outcome[0], TurnCancelledError), outcome
        assert outcome[0].code == -32052


# --- subscriptions ------------------------------------------------------------------------------

def test_events_sent_right_after_subscribing_are_all_delivered(stack: RunningStack, mock: MockLLM) -> None:
    key, profile = new_key(stack)
    other = stack.create_key(profile["id"], name="watcher")["key"]
    with Client(stack.client_url, client_key=key) as bae:
        session = bae.open(tools=[Tool("get_time")])
        session.register_driver()
        watcher = bae.join(session.id, client_key=other)
        for _ in range(3):
            mock.enqueue(Reply.text("hello"))
            # resume=False: no anchor read first, so only the subscribed signal keeps the first event.
            with watcher.subscribe(resume=False) as subscription:
                assert subscription.subscribed
                reply = session.send("hi")
                got: list[str] = []
                for item in subscription:
                    assert isinstance(item, Event)
                    got.append(item.event_id)
                    if item.event_type == EventType.SERVER_MESSAGE_SEND:
                        break
            assert got == [event.event_id for event in reply.events]


def test_a_lagged_subscription_resumes_with_no_gap_and_no_duplicate(stack: RunningStack, mock: MockLLM) -> None:
    key, profile = new_key(stack, fallback_providers=["gpt"])
    with Client(stack.client_url, client_key=key) as bae:
        session = bae.open(tools=[Tool("get_time")])
        session.register_driver()
        watcher = bae.join(session.id, client_key=stack.create_key(profile["id"], name="watcher")["key"])
        subscription = watcher.subscribe()
        anchor = subscription.last_event_id
        # Not read meanwhile: a failed attempt's body (logged, never in the history) pushes ~3 MB per turn
        # at the subscriber, which fills every buffer on the way; 300 tool calls then overflow its queue.
        for _ in range(10):
            mock.enqueue(Reply.error(500, "x" * 3_000_000), Reply.text("ok"))
            assert session.send_message("fill").text == "ok"
        mock.enqueue(Reply.tool_use([(f"tu_{i}", "get_time", {}) for i in range(300)]))
        assert len(session.send_message("many").client_tool_calls) == 300
        recorded = [event.event_id for event in session.all_events()]
        after = recorded[recorded.index(anchor) + 1:]
        seen = []
        for item in subscription:
            assert isinstance(item, Event)
            seen.append(item.event_id)
            if item.event_id == recorded[-1]:
                break
        subscription.close()
    assert subscription.reconnects >= 1  # it was cut off as lagged, and resumed
    assert seen == after


@pytest.mark.parametrize("paced", [False, True], ids=["paused", "streaming-on"])
async def test_async_subscription_resumes_after_a_dropped_connection_deltas_included(
        stack: RunningStack, mock: MockLLM, paced: bool) -> None:
    """Paused: the provider holds its answer while the subscriber is away, so the catch-up holds nothing
    new. Streaming on: pieces come while it is away, and the catch-up's new part is delivered."""
    key, profile = new_key(stack)
    relay = Relay(stack.client_url)
    resume = threading.Event()
    mock.enqueue(Reply.text(TEXT).streaming(pace=0.08) if paced else
                 Reply.text(TEXT).streaming(pause_at=4, resume=resume))
    sent: list[Delta] = []
    items: list[Event | Delta] = []
    try:
        async with AsyncClient(stack.client_url, client_key=key) as bae, \
                AsyncClient(relay.url, client_key=stack.create_key(profile["id"], name="w")["key"]) as far:
            session = await bae.open(tools=[Tool("get_time")])
            await session.register_driver()
            watcher = await far.join(session.id)
            async with watcher.subscribe(deltas=True) as subscription:
                assert subscription.subscribed

                async def collect() -> None:
                    async for item in subscription:
                        items.append(item)
                        if isinstance(item, Event) and item.event_type == EventType.SERVER_MESSAGE_SEND:
                            return

                collector = asyncio.create_task(collect())
                turn = asyncio.create_task(session.send("go", on_delta=sent.append))
                while sum(isinstance(item, Delta) for item in items) < 4:
                    await asyncio.sleep(0.01)
                relay.cut(down_for=0.5 if paced else 0.0)  # mid-call
                while subscription.reconnects < 1:
                    await asyncio.sleep(0.01)
                # Reconnected while the call still streams: it got a catch-up of the call so far.
                resume.set()
                reply = await turn
                await asyncio.wait_for(collector, 30)
                assert subscription.reconnects == 1 and relay.cuts == 1
    finally:
        relay.close()
    text = [delta.text for delta in sent if delta.kind == "text"]
    assert "".join(text) == TEXT and len(text) > 4
    watched = [item.text for item in items if isinstance(item, Delta) and item.kind == "text"]
    assert "".join(watched) == TEXT
    # Streaming on, what came while away came back as one catch-up delta: its new part only.
    assert len(watched) < len(text) if paced else watched == text
    events = [item.event_id for item in items if isinstance(item, Event)]
    assert events == [event.event_id for event in reply.events]
    assert reply.text == TEXT


async def test_async_send_with_async_tools_and_hooks(stack: RunningStack, mock: MockLLM, tmp_path: Path) -> None:
    key, _ = new_key(stack)
    order: list[str] = []

    async def note(name: str) -> None:
        await asyncio.sleep(0)
        order.append(name)

    async def get_time(input: dict) -> dict:
        await note("handler")
        return {"time": "noon", **input}

    hooks = Hooks(before_send=lambda _: note("before_send"), after_receive=lambda _: note("after_receive"),
                  before_tool_call=lambda _: note("before_tool_call"),
                  after_tool_call=lambda _: note("after_tool_call"))
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {"zone": "UTC"})]), Reply.text("noon"))
    async with AsyncClient(stack.client_url, client_key=key, hooks=hooks) as bae:
        assert (await bae.meta())["api_versions"] == ["v1"]
        session = await bae.open(tools=[Tool("get_time", handler=get_time)], client_version="async/1")
        reply = await session.send("time?")
        assert reply.text == "noon"
        assert order == ["before_send", "after_receive", "before_tool_call", "handler", "after_tool_call",
                         "before_send", "after_receive"]
        assert mock.requests[-1]["body"]["messages"][-1]["content"][0]["content"] == '{"time": "noon", "zone": "UTC"}'
        events = [event async for event in session.all_events()]
        assert events[0].payload["client_version"] == "async/1"
        assert await session.drivers() == [events[1].client_key_id]
        assert (await session.close())["state"] == "closed"
        with pytest.raises(ApiError) as closed:
            await session.close()
        assert closed.value.type == "session_closed"
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", client_key=key) as nobody:
        with pytest.raises(TransportError, match="is it running"):
            await nobody.open()


def test_closing_a_subscription_from_another_thread_ends_its_iteration(stack: RunningStack, mock: MockLLM) -> None:
    key, _ = new_key(stack)
    with Client(stack.client_url, client_key=key) as bae:
        session = bae.open()
        subscription = session.subscribe()
        got: list[Any] = []
        ended = threading.Event()

        def read() -> None:
            got.extend(subscription)
            ended.set()

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.3)  # the reader waits for an event
        subscription.close()
        assert ended.wait(10), "the iteration did not end"
        reader.join(10)
        assert got == [] and not subscription.subscribed


async def test_closing_an_async_subscription_from_another_task_ends_its_iteration(stack: RunningStack) -> None:
    key, _ = new_key(stack)
    async with AsyncClient(stack.client_url, client_key=key) as bae:
        session = await bae.open()
        subscription = await session.subscribe()
        reader = asyncio.create_task(asyncio.wait_for(_all(subscription), 10))
        await asyncio.sleep(0.3)  # the reader waits for an event
        await subscription.aclose()
        assert await reader == [] and not subscription.subscribed


async def _all(subscription: Any) -> list[Any]:
    return [item async for item in subscription]
