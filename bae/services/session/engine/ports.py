"""What the turn engine needs from outside it, as small Protocols in its own vocabulary.

The engine runs provider steps, drives a session's sandbox, calls MCP tools, reads and
writes the session's log and tells other replicas of a revocation; it knows no wire
format. `remote/` and `store/` implement these ports (the runner client and the sandbox
pool translate their protobuf messages to and from the types below); `testkit/fakes.py`
has an in-memory fake of each, so the engine runs in a test with no process around it.

A port call that fails raises one of the kinds of `bae.common.errors`; its `detail` is
the text events and clients see.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, NotRequired, Protocol, TypedDict

from bae.common import errors
from bae.common.jsontext import JsonObject, RawJson
from bae.services.session.engine.domain import Usage
from bae.services.session.store.events import EventView
from bae.services.session.store.live_state import LiveState
from bae.services.session.store.records import ProfileRecord, SessionRecord
from bae.services.session.store.usage import Charge, Totals

# -- provider steps -------------------------------------------------------------------------


class StepOutcome(StrEnum):
    OK = "ok"  # `message_json` holds the assistant message
    ALL_FAILED = "all_failed"  # every attempt failed; `attempts` says how many
    PROVIDER_CONFIG = "provider_config"  # the primary provider is not configured; see `detail`


class DeltaKind(StrEnum):
    """What a piece of a streamed provider call is (a `session.delta`'s `kind`)."""

    TEXT = "text"
    THINKING = "thinking"
    TOOL_INPUT = "tool_input"  # a piece of the partial JSON of a tool call's input
    RESET = "reset"  # the attempt failed: discard what the call streamed


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of a provider call's output as it is generated; never stored."""

    request_event_id: str  # the call's `provider.request` event ("" until the turn knows it)
    seq: int  # from 0 per call, without gaps
    index: int  # the content block
    kind: DeltaKind
    text: str


class StepMessages(NamedTuple):
    """A provider step's history: each message's JSON text, and its role."""

    texts: Sequence[str]
    roles: Sequence[str]


@dataclass(frozen=True)
class StepRequest:
    """One provider step, without its history (that is `StepMessages`)."""

    session_id: str
    primary_provider: str
    fallback_providers: Sequence[str]
    tools_json: str  # the advertised tools as one JSON array
    purpose: str = ""  # "" for a turn, "compaction" for a compaction call
    min_max_tokens: int = 0
    stream_deltas: bool = False  # someone listens: the runner streams, and the updates carry deltas


class StepEvent(NamedTuple):
    """An event a step records (`provider.request`, `provider.response`, `session.error`), its
    payload as the runner wrote it: stored and sent as it is, never parsed here."""

    event_type: str
    payload: RawJson


@dataclass(frozen=True)
class StepResult:
    outcome: StepOutcome
    message_json: str = ""  # {"role": "assistant", "content": [...]}
    usage: Usage | None = None  # None when the provider reported none
    cost_usd: float | None = None  # at the answering entry's prices; None without prices or usage
    attempts: int = 0
    detail: str = ""
    # Compaction only: why the summary was cut off by its output budget, "" when it was not.
    truncated: str = ""


@dataclass(frozen=True)
class StepUpdate:
    """Events of a step as they come; the last update of a step carries its result. A streamed
    step's deltas come before the update's events, and belong to the attempt whose
    `provider.request` came last."""

    events: Sequence[StepEvent] = ()
    result: StepResult | None = None
    deltas: Sequence[Delta] = ()


class StepFailed(errors.Unavailable):
    """The step produced no result for a reason of the runner's, not a provider's: it is down
    or restarting, it refused the step, or the step overran its deadline."""

    default_reason = "step_failed"


class ProviderSteps(Protocol):
    def run_step(
        self, request: StepRequest, messages: StepMessages, *, timeout: float
    ) -> AsyncGenerator[StepUpdate, None]:
        """The step's updates, the last one with its result; raises StepFailed. Closing the
        generator early stops the step."""
        ...

    async def close(self) -> None: ...


# -- sandboxes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SandboxHandle:
    host: str  # the sandbox host's address, as configured
    sandbox_id: str
    image: str


@dataclass(frozen=True)
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int


class CommandState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"  # ended by itself; see exit_code
    TIMED_OUT = "timed_out"  # killed by the host at its timeout
    KILLED = "killed"  # ended by kill_command
    FAILED = "failed"  # could not be started or followed; see detail


@dataclass(frozen=True)
class CommandStatus:
    """A background command (a subagent) on a sandbox host; its output as the host kept it."""

    state: CommandState
    exit_code: int = 0
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    detail: str = ""


@dataclass(frozen=True)
class HostSandbox:
    sandbox_id: str
    session_id: str
    image: str
    state: str  # the container's state as the host reports it: "running", "exited", ...


@dataclass(frozen=True)
class HostCommand:
    command_id: str
    sandbox_id: str
    running: bool  # False once it ended (the host keeps ended commands until their sandbox stops)


@dataclass(frozen=True)
class HostInventory:
    """What one sandbox host runs: its sandboxes and background commands."""

    host: str
    sandboxes: Sequence[HostSandbox] = ()
    commands: Sequence[HostCommand] = ()


class ImageStatus(TypedDict):
    """One image of a profile on the sandbox hosts (GET /admin/v1/sandbox-status)."""

    name: str
    status: str  # pending | available | error
    detail: NotRequired[str]  # why, for an error


class Sandboxes(Protocol):
    """The sandbox hosts: placement, calls, image provisioning. Failed calls raise a BaeError."""

    async def start(self, session_id: str, image: str) -> SandboxHandle: ...

    async def exec(self, handle: SandboxHandle, command: str) -> ExecResult: ...

    async def stop(self, handle: SandboxHandle) -> None: ...

    async def start_command(
        self, handle: SandboxHandle, command_id: str, command: str, *, stdin: bytes, timeout: float, output_limit: int
    ) -> None: ...

    async def wait_command(self, host: str, command_id: str, wait: float) -> CommandStatus:
        """The command's state once it ended, or after `wait` seconds."""
        ...

    async def kill_command(self, host: str, command_id: str) -> None: ...

    async def inventory(self) -> list[HostInventory]:
        """What each reachable host runs (a host that does not answer is left out)."""
        ...

    def adopt(self, handle: SandboxHandle) -> None:
        """Count a sandbox found running on a host as placed there."""

    def on_new_host(self, callback: Callable[[], None]) -> None:
        """Call `callback` when a host no inventory has covered yet is seen up."""

    def provision(self, profile_id: str, images: Iterable[str]) -> None:
        """Ensure a profile's images on the hosts in the background; [] forgets the profile."""

    def status_for(self, profile_id: str) -> list[ImageStatus]:
        """The profile's images in declared order."""
        ...

    def status_view(self) -> dict[str, Any]:
        """Every profile's image statuses (GET /admin/v1/sandbox-status)."""
        ...

    async def start_watching(self) -> None:
        """Resolve and watch the hosts (called once, at start-up)."""

    async def close(self) -> None: ...


# -- MCP ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class McpTool:
    name: str
    description: str
    input_schema: JsonObject
    server_name: str


@dataclass(frozen=True)
class McpCallResult:
    ok: bool
    result: JsonObject | None = None  # the server's CallToolResult JSON, verbatim
    error: str | None = None  # why the call failed, when it did ("<code>: <message>" for JSON-RPC errors)


class McpSession(Protocol):
    """A session's connections to its profile's MCP servers."""

    @property
    def tools(self) -> Sequence[McpTool]: ...

    def route(self, tool_name: str) -> str | None:
        """The server that listed `tool_name`, or None."""
        ...

    async def call(self, tool_name: str, arguments: dict[str, Any]) -> McpCallResult:
        """`tools/call` on the routed server; never raises for an MCP failure."""
        ...

    async def close(self) -> None: ...


class McpConnector(Protocol):
    async def connect(self, session_id: str, profile: ProfileRecord) -> McpSession:
        """Connect the profile's servers (those that fail are skipped); never raises for MCP."""
        ...


# -- the session log ------------------------------------------------------------------------------

EventItem = tuple[str, JsonObject | RawJson]
# An event to append: (client key it is attributed to, event type, payload).
NewEvent = tuple[str | None, str, JsonObject | RawJson]


class EventStore(Protocol):
    """The store calls the engine makes. Each is one transaction; a database that cannot serve
    now raises errors.Unavailable."""

    async def get_session(self, session_id: str) -> SessionRecord | None: ...

    async def live_state(self, session_id: str) -> LiveState:
        """The session, and what its log says a replica serving it holds in memory."""
    async def session_states(self, session_ids: list[str]) -> dict[str, str]:
        """session id -> state, for those the store knows."""
        ...

    async def session_and_profile(self, session_id: str) -> tuple[SessionRecord | None, ProfileRecord | None]: ...

    async def live_profiles(self) -> list[ProfileRecord]: ...

    async def append_events(
        self, session_id: str, items: list[NewEvent], new_state: str | None = None, charge: Charge | None = None
    ) -> list[EventView]:
        """`charge`: the usage of the provider responses among `items`, added in the same transaction."""
        ...

    async def append_compaction(
        self,
        session_id: str,
        client_key_id: str | None,
        leading: list[NewEvent],
        preamble: JsonObject,
        summary: JsonObject,
        completed: JsonObject,
        charge: Charge | None = None,
    ) -> list[EventView]: ...

    async def message_events(self, session_id: str) -> list[EventView]: ...

    async def server_tool_results(self, session_id: str, tool_use_ids: list[str]) -> dict[str, JsonObject]: ...

    async def subagent_events(self, session_id: str) -> list[EventView]: ...

    async def latest_turn_usage(self, session_id: str) -> JsonObject | None: ...

    async def list_events(self, session_id: str, after_seq: int, limit: int) -> list[tuple[int, EventView]]: ...

    async def event_seq(self, session_id: str, event_id: str) -> int | None: ...

    async def session_usage(self, session_id: str) -> Totals:
        """The session's usage totals, over every day and key."""
        ...

    async def key_usage_today(self, client_key_id: str) -> Totals:
        """The client key's usage totals of the current UTC day, over all its sessions."""
        ...

    async def claim_sandbox(self, session_id: str, client_key_id: str, limit: int) -> None:
        """Count a sandbox of the session against its creator's max_sandboxes_per_key (QuotaExceeded)."""

    async def release_sandbox(self, session_id: str) -> None: ...


# -- other replicas ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClosedSession:
    session_id: str
    event_ids: Sequence[str]  # the close's events, written by the replica that revoked the key


@dataclass
class Revocation:
    """A client key revoked on one replica, for the replica that owns the sessions it touched."""

    key_id: str
    closed: list[ClosedSession] = field(default_factory=list)  # sessions the key alone held
    session_ids: list[str] = field(default_factory=list)  # sessions on which it only loses access


class Peers(Protocol):
    async def apply_revocation(self, address: str, revocation: Revocation) -> None:
        """Best effort: a replica that cannot be reached holds nothing live for long."""

    async def close(self) -> None: ...


# -- webhook deliveries ----------------------------------------------------------------------


class WebhookAnswer(NamedTuple):
    """What a receiver answered: its HTTP status, or None with `error` when there was no answer."""

    status: int | None
    error: str | None = None
    # Not sent at all: the host resolved to an address [webhooks] does not allow.
    refused: bool = False


class WebhookTransport(Protocol):
    """Outbound HTTP for webhook deliveries (remote/webhook_sender.py)."""

    async def resolve(self, host: str, port: int) -> list[str]:
        """Every IP address `host` resolves to now (an IP literal: itself); [] when it does not resolve."""
        ...

    async def post(self, url: str, address: str, headers: dict[str, str], body: bytes) -> WebhookAnswer:
        """POST `body` to `url`, connecting to `address` (already checked) rather than resolving again, and
        following no redirect."""
        ...
