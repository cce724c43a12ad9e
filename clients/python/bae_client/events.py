"""Typed events and deltas (docs/reference/events.md).

`Event.event_type` is an `EventType` (a `str` enum, so it compares equal to the wire string), and
`Event.payload` is the event's payload dict, shaped as the TypedDict `PAYLOAD_TYPES[event_type]` says:
`cast(ToolCallPayload, event.payload)["name"]` when a type checker should know. An event type this
version does not know (a newer server) still parses: its `EventType` member is made on the fly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Mapping, TypedDict


class EventType(str, Enum):
    CLIENT_MESSAGE_SEND = "client.message.send"
    SERVER_MESSAGE_SEND = "server.message.send"
    PROVIDER_REQUEST = "provider.request"
    PROVIDER_RESPONSE = "provider.response"
    TOOL_CALL = "tool.call"
    TOOL_RESULT = "tool.result"
    MCP_REQUEST = "mcp.request"
    MCP_RESPONSE = "mcp.response"
    SANDBOX_REQUEST = "sandbox.request"
    SANDBOX_RESPONSE = "sandbox.response"
    SESSION_OPEN = "session.open"
    SESSION_JOIN = "session.join"
    SESSION_DRIVER_REGISTER = "session.driver.register"
    SESSION_CLOSE = "session.close"
    SESSION_TURN_CANCELLED = "session.turn.cancelled"
    SESSION_ERROR = "session.error"
    SESSION_SANDBOX_AVAILABLE = "session.sandbox.available"
    SESSION_SANDBOX_START = "session.sandbox.start"
    SESSION_SANDBOX_RUNNING = "session.sandbox.running"
    SESSION_SANDBOX_STOP = "session.sandbox.stop"
    SESSION_SANDBOX_STOPPED = "session.sandbox.stopped"
    SESSION_SANDBOX_ERROR = "session.sandbox.error"
    SESSION_SUBAGENT_START = "session.subagent.start"
    SESSION_SUBAGENT_RUNNING = "session.subagent.running"
    SESSION_SUBAGENT_COMPLETED = "session.subagent.completed"
    SESSION_SUBAGENT_FAILED = "session.subagent.failed"
    SESSION_SUBAGENT_CANCELLED = "session.subagent.cancelled"
    SESSION_COMPACTION_STARTED = "session.compaction.started"
    SESSION_COMPACTION_COMPLETED = "session.compaction.completed"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> EventType | None:
        # A type from a newer server: a member of its own, so parsing an event never fails on it.
        if not isinstance(value, str):
            return None
        member = str.__new__(cls, value)
        member._name_ = value.upper().replace(".", "_")
        member._value_ = value
        return member


class MessagePayload(TypedDict, total=False):
    role: str
    content: str | list[dict[str, Any]]
    synthetic: str


class ProviderRequestPayload(TypedDict, total=False):
    attempt: int
    kind: Literal["primary", "fallback"]
    provider: str
    base_url: str
    model: str
    max_tokens: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    normalized: dict[str, Any]
    purpose: str


class ProviderResponsePayload(TypedDict, total=False):
    attempt: int
    kind: Literal["primary", "fallback"]
    provider: str
    ok: bool
    status: int | None
    body: Any
    usage: dict[str, int] | None
    error: str
    retry_after: float
    purpose: str


class ToolCallPayload(TypedDict, total=False):
    id: str
    name: str
    input: dict[str, Any]
    dispatch: Literal["client", "mcp", "sandbox", "subagent"]
    server_name: str | None


class ToolResultPayload(TypedDict, total=False):
    tool_use_id: str
    dispatch: str
    server_name: str | None
    is_error: bool
    content: Any


class McpRequestPayload(TypedDict, total=False):
    method: str
    server_name: str
    tool: str
    input: dict[str, Any]


class McpResponsePayload(TypedDict, total=False):
    server_name: str
    ok: bool
    result: Any
    error: str


class SandboxRequestPayload(TypedDict, total=False):
    tool: str
    input: dict[str, Any]
    command: str


class SandboxResponsePayload(TypedDict, total=False):
    sandbox_id: str
    ok: bool
    result: dict[str, Any]
    error: str


class SessionOpenPayload(TypedDict, total=False):
    client_version: str | None
    tools: list[str]
    sandbox_tools: list[str]
    subagent_tools: list[str]


class EmptyPayload(TypedDict, total=False):
    pass


class SessionClosePayload(TypedDict, total=False):
    reason: str


class TurnCancelledPayload(TypedDict, total=False):
    cancelled_by: str
    tool_use_ids: list[str]


class SessionErrorPayload(TypedDict, total=False):
    reason: str
    detail: str
    provider: str
    attempts: Any
    max_iterations: int
    profile_id: str
    primary_provider: str
    owner_client_key_id: str
    budget: str
    used: float
    limit: float


class SandboxAvailablePayload(TypedDict, total=False):
    images: list[dict[str, Any]]


class SandboxPayload(TypedDict, total=False):
    image: str | None
    sandbox_id: str
    dispatch: Literal["remote", "local"]
    unsandboxed: bool
    container_id: str | None
    reason: str
    phase: str
    detail: str | None


class SubagentPayload(TypedDict, total=False):
    dispatch: Literal["remote", "local"]
    subagent_id: str
    harness: str
    model: str
    detail: str | None
    exit_code: int | None
    reason: str


class CompactionStartedPayload(TypedDict, total=False):
    trigger: Literal["auto", "client"]
    reason: str
    token_count: int
    threshold_tokens: int | None


class CompactionCompletedPayload(TypedDict, total=False):
    preamble_event_id: str
    summary_event_id: str
    compacted_message_count: int
    input_tokens: int
    summary_tokens: int


E = EventType
PAYLOAD_TYPES: Mapping[EventType, type] = {
    E.CLIENT_MESSAGE_SEND: MessagePayload, E.SERVER_MESSAGE_SEND: MessagePayload,
    E.PROVIDER_REQUEST: ProviderRequestPayload, E.PROVIDER_RESPONSE: ProviderResponsePayload,
    E.TOOL_CALL: ToolCallPayload, E.TOOL_RESULT: ToolResultPayload,
    E.MCP_REQUEST: McpRequestPayload, E.MCP_RESPONSE: McpResponsePayload,
    E.SANDBOX_REQUEST: SandboxRequestPayload, E.SANDBOX_RESPONSE: SandboxResponsePayload,
    E.SESSION_OPEN: SessionOpenPayload, E.SESSION_JOIN: SessionOpenPayload,
    E.SESSION_DRIVER_REGISTER: EmptyPayload, E.SESSION_CLOSE: SessionClosePayload,
    E.SESSION_TURN_CANCELLED: TurnCancelledPayload, E.SESSION_ERROR: SessionErrorPayload,
    E.SESSION_SANDBOX_AVAILABLE: SandboxAvailablePayload,
    **{t: SandboxPayload for t in (E.SESSION_SANDBOX_START, E.SESSION_SANDBOX_RUNNING, E.SESSION_SANDBOX_STOP,
                                   E.SESSION_SANDBOX_STOPPED, E.SESSION_SANDBOX_ERROR)},
    **{t: SubagentPayload for t in (E.SESSION_SUBAGENT_START, E.SESSION_SUBAGENT_RUNNING,
                                    E.SESSION_SUBAGENT_COMPLETED, E.SESSION_SUBAGENT_FAILED,
                                    E.SESSION_SUBAGENT_CANCELLED)},
    E.SESSION_COMPACTION_STARTED: CompactionStartedPayload,
    E.SESSION_COMPACTION_COMPLETED: CompactionCompletedPayload,
}
del E


@dataclass(frozen=True)
class Event:
    """One event of a session's log, as `GET …/events`, `session.event` and a turn's result carry it."""

    event_id: str
    event_type: EventType
    session_id: str
    client_key_id: str | None
    created_at: str
    payload: dict[str, Any]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Event:
        payload = raw.get("payload")
        return cls(
            event_id=str(raw.get("id", "")),
            event_type=EventType(str(raw.get("event_type", ""))),
            session_id=str(raw.get("session_id", "")),
            client_key_id=raw.get("client_key_id"),
            created_at=str(raw.get("created_at", "")),
            payload=payload if isinstance(payload, dict) else {},
            raw=dict(raw),
        )


DeltaKind = Literal["text", "thinking", "tool_input", "reset"]


@dataclass(frozen=True)
class Delta:
    """A piece of a provider call's output as it is generated (`session.delta`): never stored; the call's
    `provider.response` event holds the whole response. `kind == "reset"`: discard what this call
    (`request_event_id`) streamed so far."""

    session_id: str
    request_event_id: str
    seq: int
    index: int
    kind: str
    text: str

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Delta:
        return cls(str(raw.get("session_id", "")), str(raw.get("request_event_id", "")), int(raw.get("seq", 0)),
                   int(raw.get("index", 0)), str(raw.get("kind", "")), str(raw.get("text", "")))
