"""bae_client behaves as upstream's Python client, bae_py, where both have a feature: the same scenarios, run
with each against the same stack and the same scripted model, observe the same things (the hooks in the
same order with the same arguments, the same errors, the same requests to the model, the same history).

bae_py is taken from the upstream repository at test time (`git archive` of client-python/src/bae_py into a
temporary directory); nothing of it is committed here. The repository is found at $BAE_UPSTREAM_REPO
(a clone or a bare git directory), by default the mirror this project's machines keep; without it the
tests are skipped, saying so. bae_py needs httpx and opentelemetry-api, which the venv has.
"""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Awaitable, Callable, Iterator

import pytest

import bae_client
from testkit.mockllm import MockLLM, Reply
from testkit.ports import free_port
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = pytest.mark.stack

UPSTREAM = Path(os.environ.get("BAE_UPSTREAM_REPO", "/work/.mirror/prettysmartdev+better-agent-engine/repo"))
TOKEN = "sk-test-secret-token-123456"


@pytest.fixture(scope="module")
def bae_py(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    if not UPSTREAM.exists():
        pytest.skip(f"no upstream repository at {UPSTREAM} (set BAE_UPSTREAM_REPO to a clone of "
                    f"better-agent-engine): bae_py parity not checked")
    archive = subprocess.run(["git", "-C", str(UPSTREAM), "archive", "--format=tar", "HEAD", "client-python/src/bae_py"],
                             capture_output=True, timeout=60)
    if archive.returncode != 0:
        pytest.skip(f"cannot read bae_py from {UPSTREAM}: {archive.stderr.decode(errors='replace').strip()}")
    target = tmp_path_factory.mktemp("upstream")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(target, filter="data")
    source = str(target / "client-python" / "src")
    sys.path.insert(0, source)
    try:
        yield importlib.import_module("bae_py")
    finally:
        sys.path.remove(source)
        for name in [name for name in sys.modules if name == "bae_py" or name.startswith("bae_py.")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, mock: MockLLM) -> Iterator[RunningStack]:
    toml = mock_provider_toml(mock.base_url) + mock_provider_toml(mock.base_url, name="gpt", kind="openai")
    stack = launch_stack(tmp_path_factory.mktemp("parity"), toml, MOCK_LLM_TOKEN=TOKEN)
    yield stack
    stack.close()


@pytest.fixture
def stack(running: RunningStack, mock: MockLLM) -> RunningStack:
    mock.reset()
    return running


def new_key(stack: RunningStack, **profile: Any) -> str:
    row = stack.create_profile(f"p{time.monotonic_ns()}", allowed_tools=["get_time"], **profile)
    return str(stack.create_key(row["id"])["key"])


def wire(value: Any) -> Any:
    """A hook's argument as JSON: bae_py hands dataclasses (with to_wire), bae_client the dicts themselves."""
    if hasattr(value, "to_wire"):
        return value.to_wire()
    if hasattr(value, "event_type"):
        return str(getattr(value.event_type, "value", value.event_type))
    return value


class Client:
    """One scenario's view of a client library: open a session with tools and hooks, send, read history."""

    def __init__(self, name: str, module: ModuleType, url: str, key: str) -> None:
        self.name, self.module, self.url, self.key = name, module, url, key

    async def open(self, handler: Callable[[dict], Any], hooks: dict[str, Callable[[Any], Any]]) -> Any:
        m = self.module
        tool = m.Tool("get_time", "The time", {"type": "object"}, handler)
        if self.name == "bae_py":
            harness = m.Harness(m.Config(self.url, self.key), tools=[tool], hooks=m.Hooks(**hooks))
            return await harness.connect()
        client = m.AsyncClient(self.url, client_key=self.key, hooks=m.Hooks(**hooks))
        return await client.open(tools=[tool])

    async def send(self, session: Any, text: str) -> str:
        reply = await session.send(text)
        return str(reply.text() if self.name == "bae_py" else reply.text)

    async def history(self, session: Any) -> list[str]:
        if self.name == "bae_py":
            session_id, key = session.session_id, session.session_key
        else:
            session_id, key = session.id, session.key
        import httpx

        async with httpx.AsyncClient(base_url=self.url) as http:
            page = (await http.get(f"/api/v1/sessions/{session_id}/events", params={"limit": 200},
                                   headers={"Authorization": f"Bearer {key}"})).json()
        return [item["event_type"] for item in page["items"]]


Scenario = Callable[[Client, RunningStack, MockLLM], Awaitable[Any]]


async def both(bae_py: ModuleType, stack: RunningStack, mock: MockLLM, scenario: Scenario,
               **profile: Any) -> None:
    observed = {}
    for name, module in (("bae_py", bae_py), ("bae_client", bae_client)):
        mock.reset()
        observed[name] = await scenario(Client(name, module, stack.client_url, new_key(stack, **profile)), stack,
                                        mock)
    assert observed["bae_client"] == observed["bae_py"]


async def test_a_tool_round_trip_and_its_hooks(bae_py: ModuleType, stack: RunningStack, mock: MockLLM) -> None:
    async def scenario(client: Client, stack: RunningStack, mock: MockLLM) -> Any:
        seen: list[tuple[str, Any]] = []

        def hook(name: str) -> Callable[[Any], None]:
            return lambda value: seen.append((name, wire(value)))

        hooks = {name: hook(name) for name in ("before_send", "after_receive", "before_tool_call",
                                                "after_tool_call", "on_event")}
        mock.enqueue(Reply.tool_use([("tu_1", "get_time", {"zone": "UTC"})], text="Let me look. "),
                     Reply.text("It is noon."))
        session = await client.open(lambda input: f"noon in {input['zone']}", hooks)
        text = await client.send(session, "What time is it?")
        # bae_py keeps the dispatch tag out of its wire form; the rest is compared as sent.
        for _, value in seen:
            for block in value.get("content", []) if isinstance(value, dict) else []:
                if isinstance(block, dict):
                    block.pop("dispatch", None)
        if isinstance(seen[0][1], dict):
            seen[0][1].setdefault("role", "user")
        return text, seen, [request["body"]["messages"] for request in mock.requests], await client.history(session)

    await both(bae_py, stack, mock, scenario)


async def test_a_failing_tool_handler(bae_py: ModuleType, stack: RunningStack, mock: MockLLM) -> None:
    async def scenario(client: Client, stack: RunningStack, mock: MockLLM) -> Any:
        def broken(input: dict) -> str:
            raise ValueError("no clock")

        mock.enqueue(Reply.tool_use([("tu_1", "get_time", {})]))
        session = await client.open(broken, {})
        with pytest.raises(client.module.ToolError) as failed:
            await client.send(session, "time?")
        return (type(failed.value).__name__, failed.value.name, type(failed.value.cause).__name__, str(failed.value),
                await client.history(session))

    await both(bae_py, stack, mock, scenario)


async def test_a_failing_hook(bae_py: ModuleType, stack: RunningStack, mock: MockLLM) -> None:
    async def scenario(client: Client, stack: RunningStack, mock: MockLLM) -> Any:
        def refuse(call: Any) -> None:
            raise PermissionError("not this one")

        mock.enqueue(Reply.tool_use([("tu_1", "get_time", {})]))
        session = await client.open(lambda input: "noon", {"before_tool_call": refuse})
        with pytest.raises(client.module.HookError) as failed:
            await client.send(session, "time?")
        return failed.value.hook, type(failed.value.cause).__name__, str(failed.value), await client.history(session)

    await both(bae_py, stack, mock, scenario)


async def test_all_providers_failing(bae_py: ModuleType, stack: RunningStack, mock: MockLLM) -> None:
    async def scenario(client: Client, stack: RunningStack, mock: MockLLM) -> Any:
        mock.enqueue(Reply.error(500, "a"), Reply.error(503, "b"))
        session = await client.open(lambda input: "noon", {})
        with pytest.raises(client.module.ProvidersFailedError) as failed:
            await client.send(session, "hi")
        events = [(event.event_type, event.payload) for event in failed.value.events]
        events = [(str(getattr(kind, "value", kind)), payload) for kind, payload in events]
        # (The messages differ in words: "all providers failed" here, "all provider configs failed" there.)
        return ([kind for kind, _ in events], events[-1][1], wire(failed.value.assistant_message),
                await client.history(session))

    await both(bae_py, stack, mock, scenario, fallback_providers=["gpt"])


async def test_refused_and_unreachable(bae_py: ModuleType, stack: RunningStack, mock: MockLLM) -> None:
    async def scenario(client: Client, stack: RunningStack, mock: MockLLM) -> Any:
        refused = Client(client.name, client.module, client.url, "bae_" + "0" * 48)
        with pytest.raises(client.module.ApiError) as unauthorized:
            await refused.open(lambda input: "", {})
        stopped = Client(client.name, client.module, f"http://127.0.0.1:{free_port()}", client.key)
        with pytest.raises(client.module.TransportError):
            await stopped.open(lambda input: "", {})
        return unauthorized.value.status, unauthorized.value.type, unauthorized.value.detail

    await both(bae_py, stack, mock, scenario)


async def test_subscribe_from_an_event(bae_py: ModuleType, stack: RunningStack, mock: MockLLM) -> None:
    async def scenario(client: Client, stack: RunningStack, mock: MockLLM) -> Any:
        mock.enqueue(Reply.text("one"), Reply.text("two"))
        session = await client.open(lambda input: "", {})
        await client.send(session, "first")
        await client.send(session, "second")
        history = await client.history(session)
        got: list[str] = []
        if client.name == "bae_py":
            import httpx

            async with httpx.AsyncClient(base_url=client.url) as http:
                page = (await http.get(f"/api/v1/sessions/{session.session_id}/events",
                                       headers={"Authorization": f"Bearer {session.session_key}"})).json()

            def handler(event: Any) -> bool:
                got.append(event.event_type.value)
                return len(got) < len(history) - 1

            await session.subscribe(handler, since_event_id=page["items"][0]["id"])
        else:
            first = [event async for event in session.all_events()][0].event_id
            async with session.subscribe(since_event_id=first) as subscription:
                async for item in subscription:
                    got.append(str(item.event_type))
                    if len(got) == len(history) - 1:
                        break
        return got, history[1:]

    await both(bae_py, stack, mock, scenario)
