"""In-memory fakes of the turn engine's ports (bae/services/session/engine/ports.py), and an engine
built on them: turns, tool loops and shutdown run in the test's own event loop with no runner,
sandbox host, MCP server or peer replica behind them. The store is the real one.

    steps = ScriptedSteps()
    steps.enqueue(Step.text("hello"))
    engine = fake_engine(store, steps=steps)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from bae.common.config import Config, ProviderEntry
from bae.common.errors import BaeError, Unavailable
from bae.common.jsontext import RawJson, dump
from bae.services.session.engine.domain import Usage
from bae.services.session.engine.ports import (
    CommandState,
    CommandStatus,
    Delta,
    DeltaKind,
    ExecResult,
    HostCommand,
    HostInventory,
    HostSandbox,
    McpCallResult,
    McpTool,
    Revocation,
    SandboxHandle,
    StepEvent,
    StepFailed,
    StepMessages,
    StepOutcome,
    StepRequest,
    StepResult,
    StepUpdate,
)
from bae.services.session.engine.service import SessionEngine
from bae.services.session.engine.spans import SessionSpans
from bae.services.session.store import ProfileRecord, Store

# -- provider steps -------------------------------------------------------------------------------

DEFAULT_USAGE = Usage(10, 5)


@dataclass
class Step:
    """One scripted provider step: what the provider answers, or how the step fails."""

    outcome: StepOutcome = StepOutcome.OK
    content: list[dict] = field(default_factory=list)
    usage: Usage | None = DEFAULT_USAGE
    attempts: int = 1
    detail: str = ""
    truncated: str = ""
    # Set: the step's provider.request goes out, then the step waits for it before answering.
    release: asyncio.Event | None = None
    # Set: the step fails with StepFailed after its provider.request (a runner that went away).
    failure: str | None = None

    @classmethod
    def text(cls, text: str, usage: Usage | None = DEFAULT_USAGE) -> "Step":
        return cls(content=[{"type": "text", "text": text}], usage=usage)

    @classmethod
    def tool_use(cls, *calls: tuple[str, str, dict], text: str | None = None) -> "Step":
        """`calls`: (id, name, input) of each tool_use block, after an optional text block."""
        blocks: list[dict] = [{"type": "text", "text": text}] if text is not None else []
        blocks += [{"type": "tool_use", "id": tid, "name": name, "input": tool_input} for tid, name, tool_input in calls]
        return cls(content=blocks)

    @classmethod
    def all_failed(cls, attempts: int = 2) -> "Step":
        return cls(outcome=StepOutcome.ALL_FAILED, usage=None, attempts=attempts)

    @classmethod
    def provider_config(cls, detail: str) -> "Step":
        return cls(outcome=StepOutcome.PROVIDER_CONFIG, usage=None, attempts=0, detail=detail)

    @classmethod
    def held(cls, release: asyncio.Event, then: "Step | None" = None) -> "Step":
        step = then or cls.text("ok")
        step.release = release
        return step

    @classmethod
    def unreachable(cls, reason: str = "the runner stream broke: UNAVAILABLE") -> "Step":
        """The runner goes away mid-step: after the step's provider.request, no result."""
        return cls(failure=reason)

    def result(self) -> StepResult:
        message = dump({"role": "assistant", "content": self.content}) if self.outcome == StepOutcome.OK else ""
        return StepResult(
            outcome=self.outcome, message_json=message, usage=self.usage, attempts=self.attempts,
            detail=self.detail, truncated=self.truncated,
        )


@dataclass(frozen=True)
class SentStep:
    """A step as the engine asked for it: its request and its history, parsed."""

    request: StepRequest
    messages: list[dict]
    tools: list[dict]


def _word_deltas(content: list[dict]) -> list[StepUpdate]:
    """The text blocks of `content` as the runner streams them: a delta per word, spaces kept."""
    updates: list[StepUpdate] = []
    for index, block in enumerate(content):
        if block.get("type") == "text":
            for word in re.findall(r"\S+\s*|\s+", block["text"]):
                updates.append(StepUpdate(deltas=[Delta("", len(updates), index, DeltaKind.TEXT, word)]))
    return updates


class ScriptedSteps:
    """Provider steps answered from a script, in order (a text "ok" when it runs out). Each step
    records `provider.request` (with its history) and `provider.response` events as the runner
    does: together with the result, or the request first when the step is held."""

    def __init__(self) -> None:
        self._script: deque[Step] = deque()
        self.sent: list[SentStep] = []
        self.running = 0  # steps under way
        self.closed = False

    def enqueue(self, *steps: Step) -> None:
        self._script.extend(steps)

    async def run_step(
        self, request: StepRequest, messages: StepMessages, *, timeout: float
    ) -> AsyncGenerator[StepUpdate, None]:
        if self.closed:
            raise StepFailed("the session service is shutting down")
        step = self._script.popleft() if self._script else Step.text("ok")
        history = [json.loads(text) for text in messages.texts]
        self.sent.append(SentStep(request, history, json.loads(request.tools_json)))
        attempt = {"attempt": 0, "kind": "primary", "provider": request.primary_provider}
        asked = StepEvent("provider.request", RawJson(dump({**attempt, "messages": history})))
        self.running += 1
        try:
            if step.failure is not None:
                yield StepUpdate([asked])
                raise StepFailed(step.failure)
            if request.stream_deltas:  # as the runner streams: the request first, then a delta per word
                yield StepUpdate([asked])
                for update in _word_deltas(step.content):
                    yield update
                events = []
            elif step.release is not None:
                yield StepUpdate([asked])
                await asyncio.wait_for(step.release.wait(), timeout)
                events = []
            else:
                events = [asked]
            answered = {**attempt, "ok": step.outcome == StepOutcome.OK, "body": {"content": step.content}}
            events.append(StepEvent("provider.response", RawJson(dump(answered))))
            yield StepUpdate(events, step.result())
        finally:
            self.running -= 1

    async def close(self) -> None:
        self.closed = True


# -- sandboxes --------------------------------------------------------------------------------------


@dataclass
class FakeCommand:
    handle: SandboxHandle
    command: str
    stdin: bytes
    status: CommandStatus = field(default_factory=lambda: CommandStatus(CommandState.RUNNING))
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class FakeSandboxes:
    """One in-memory sandbox host. `exec` answers from `on_exec`; background commands run until
    the test ends them (`finish`); `fail_next` makes the next call of a kind raise."""

    HOST = "fake-host:50053"

    def __init__(self, on_exec: Callable[[str], ExecResult] | None = None) -> None:
        self.on_exec = on_exec or (lambda command: ExecResult(stdout=f"ran {command}\n", stderr="", exit_code=0))
        self.running: dict[str, tuple[str, SandboxHandle]] = {}  # sandbox id -> (session id, handle)
        self.commands: dict[str, FakeCommand] = {}
        self.calls: list[tuple[str, str]] = []  # (method, sandbox or command id)
        self.statuses: dict[str, list[dict]] = {}
        self.adopted: list[SandboxHandle] = []
        self._failures: dict[str, BaeError] = {}
        self._ids = itertools.count(1)
        self._new_host: Callable[[], None] | None = None

    def fail_next(self, method: str, error: BaeError | None = None) -> None:
        self._failures[method] = error or Unavailable("the sandbox host is unavailable")

    def _check(self, method: str, target: str) -> None:
        self.calls.append((method, target))
        failure = self._failures.pop(method, None)
        if failure is not None:
            raise failure

    async def start(self, session_id: str, image: str) -> SandboxHandle:
        self._check("start", session_id)
        handle = SandboxHandle(self.HOST, f"sbx{next(self._ids):04d}", image)
        self.running[handle.sandbox_id] = (session_id, handle)
        return handle

    def place(self, session_id: str, image: str) -> SandboxHandle:
        """A sandbox the host already runs (left by a process before this one)."""
        handle = SandboxHandle(self.HOST, f"sbx{next(self._ids):04d}", image)
        self.running[handle.sandbox_id] = (session_id, handle)
        return handle

    async def exec(self, handle: SandboxHandle, command: str) -> ExecResult:
        self._check("exec", handle.sandbox_id)
        if handle.sandbox_id not in self.running:
            raise Unavailable(f"no such sandbox: {handle.sandbox_id}")
        return self.on_exec(command)

    async def stop(self, handle: SandboxHandle) -> None:
        self._check("stop", handle.sandbox_id)
        self.running.pop(handle.sandbox_id, None)
        for command in self.commands.values():
            if command.handle == handle and command.status.state == CommandState.RUNNING:
                self._end(command, CommandStatus(CommandState.KILLED, exit_code=-1))

    async def start_command(
        self, handle: SandboxHandle, command_id: str, command: str, *, stdin: bytes, timeout: float, output_limit: int
    ) -> None:
        self._check("start_command", command_id)
        self.commands[command_id] = FakeCommand(handle, command, stdin)

    async def wait_command(self, host: str, command_id: str, wait: float) -> CommandStatus:
        self._check("wait_command", command_id)
        command = self.commands.get(command_id)
        if command is None:
            raise Unavailable(f'no such command: "{command_id}"')
        if command.status.state == CommandState.RUNNING:
            try:
                await asyncio.wait_for(command.changed.wait(), wait)
            except TimeoutError:
                pass
        return command.status

    async def kill_command(self, host: str, command_id: str) -> None:
        self._check("kill_command", command_id)
        command = self.commands.get(command_id)
        if command is not None and command.status.state == CommandState.RUNNING:
            self._end(command, CommandStatus(CommandState.KILLED, exit_code=-1))

    def finish(self, command_id: str, status: CommandStatus) -> None:
        """The background command ends as `status` says."""
        self._end(self.commands[command_id], status)

    @staticmethod
    def _end(command: FakeCommand, status: CommandStatus) -> None:
        command.status = status
        command.changed.set()

    async def inventory(self) -> list[HostInventory]:
        self._check("inventory", self.HOST)
        sandboxes = [HostSandbox(h.sandbox_id, session_id, h.image, "running") for session_id, h in self.running.values()]
        commands = [
            HostCommand(command_id, command.handle.sandbox_id, command.status.state == CommandState.RUNNING)
            for command_id, command in self.commands.items()
        ]
        return [HostInventory(self.HOST, sandboxes, commands)]

    def adopt(self, handle: SandboxHandle) -> None:
        self.adopted.append(handle)

    def on_new_host(self, callback: Callable[[], None]) -> None:
        self._new_host = callback

    def provision(self, profile_id: str, images: Iterable[str]) -> None:
        names = list(images)
        if names:
            self.statuses[profile_id] = [{"name": name, "status": "available"} for name in names]
        else:
            self.statuses.pop(profile_id, None)

    def status_for(self, profile_id: str) -> list[dict]:
        return [dict(entry) for entry in self.statuses.get(profile_id, [])]

    def status_view(self) -> dict:
        return {"items": [{"profile_id": p, "images": self.status_for(p)} for p in sorted(self.statuses)]}

    async def start_watching(self) -> None:
        pass

    async def close(self) -> None:
        pass


# -- MCP ------------------------------------------------------------------------------------------------


class FakeMcpSession:
    def __init__(self, connector: "FakeMcp", session_id: str, servers: Sequence[str]) -> None:
        self._connector = connector
        self.session_id = session_id
        self.tools = [tool for server in servers for tool in connector.servers.get(server, [])]
        self.closed = False

    def route(self, tool_name: str) -> str | None:
        return next((tool.server_name for tool in self.tools if tool.name == tool_name), None)

    async def call(self, tool_name: str, arguments: dict) -> McpCallResult:
        self._connector.calls.append((tool_name, arguments))
        answer = self._connector.answers.get(tool_name)
        if answer is None:
            return McpCallResult(ok=True, result={"content": [{"type": "text", "text": f"{tool_name} done"}]})
        if isinstance(answer, asyncio.Event):
            await answer.wait()
            return McpCallResult(ok=True, result={"content": [{"type": "text", "text": f"{tool_name} done"}]})
        return answer

    async def close(self) -> None:
        self.closed = True


class FakeMcp:
    """MCP servers by name, each with its tools; `answers` scripts a tool's result (or an Event
    the call waits for)."""

    def __init__(self, servers: dict[str, list[str]] | None = None) -> None:
        self.servers = {
            server: [McpTool(name, f"{name} tool", {"type": "object"}, server) for name in names]
            for server, names in (servers or {}).items()
        }
        self.answers: dict[str, McpCallResult | asyncio.Event] = {}
        self.calls: list[tuple[str, dict]] = []
        self.sessions: list[FakeMcpSession] = []

    async def connect(self, session_id: str, profile: ProfileRecord) -> FakeMcpSession:
        session = FakeMcpSession(self, session_id, profile.mcp_servers)
        self.sessions.append(session)
        return session


# -- other replicas -----------------------------------------------------------------------------------


class FakePeers:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Revocation]] = []

    async def apply_revocation(self, address: str, revocation: Revocation) -> None:
        self.sent.append((address, revocation))

    async def close(self) -> None:
        pass


# -- an engine on fakes ---------------------------------------------------------------------------------

# The providers the fake engine's profiles name: the scripted steps answer for them.
FAKE_PROVIDERS = Config(
    providers=(
        ProviderEntry("mock", "anthropic", "mock-model", auth_token="unused"),
        ProviderEntry("fallback", "anthropic", "mock-model", auth_token="unused"),
    )
)


def fake_engine(
    store: Store,
    *,
    steps: ScriptedSteps | None = None,
    sandboxes: FakeSandboxes | None = None,
    mcp: FakeMcp | None = None,
    peers: FakePeers | None = None,
    config: Config | None = None,
    address: str = "127.0.0.1:50051",
    turn_timeout: float = 1.0,
    sandbox_idle_timeout: float = 0.0,
    max_subagents: int = 2,
    reconcile_interval: float = 60.0,
) -> SessionEngine:
    return SessionEngine(
        store=store,
        steps=steps or ScriptedSteps(),
        sandboxes=sandboxes or FakeSandboxes(),
        mcp=mcp or FakeMcp(),
        peers=peers or FakePeers(),
        config=config or FAKE_PROVIDERS,
        spans=SessionSpans(),
        address=address,
        lease_seconds=30.0,
        turn_timeout=turn_timeout,
        rpc_timeout=5.0,
        max_subagents=max_subagents,
        subagent_timeout=60.0,
        sandbox_idle_timeout=sandbox_idle_timeout,
        reconcile_interval=reconcile_interval,
    )


async def eventually(condition: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Wait until `condition()` holds (a TimeoutError after `timeout` seconds)."""
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.01)
