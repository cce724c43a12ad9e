"""The engine's vocabulary: protocol values as enums, and the typed inputs and
outcomes of its entry points (SERVER-SPEC §7, §12, §13)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from bae.common.jsontext import JsonObject
from bae.services.session.store.events import EventView


class SessionState(StrEnum):
    OPEN = "open"
    CLOSED = "closed"
    ERROR = "error"


class Dispatch(StrEnum):
    """How a model's `tool_use` block is answered (§7.5)."""

    CLIENT = "client"
    SANDBOX = "sandbox"
    SUBAGENT = "subagent"
    MCP = "mcp"


class TurnEnd(StrEnum):
    """How a turn's provider loop ended (§7.6)."""

    COMPLETED = "completed"
    PAUSED = "paused"
    # all providers failed, loop limit, or an unresolvable provider: the
    # "provider is currently unavailable" result, session in `error`
    UNAVAILABLE = "unavailable"


class CompactionTrigger(StrEnum):
    AUTO = "auto"
    CLIENT = "client"


class CompactionReason(StrEnum):
    TOKEN_THRESHOLD = "token_threshold"
    RETRY_AFTER_FAILURE = "retry_after_failure"
    MANUAL = "manual"


@dataclass(frozen=True)
class Message:
    role: str
    content: str | list[Any]


@dataclass(frozen=True)
class TurnRequest:
    """One `session.sendMessage`: who acts on which session, with what message."""

    session_id: str
    actor: str  # the acting client key id
    message: Message


@dataclass(frozen=True)
class CompactRequest:
    """One `session.compact`; `prompt` None means the stored or built-in prompt."""

    session_id: str
    actor: str
    prompt: str | None = None


@dataclass
class TurnOutcome:
    end: TurnEnd
    message: JsonObject  # the assistant message of the terminal result
    # Every event this call appended, in order (the terminal result's `events`).
    events: list[EventView] = field(default_factory=list)


@dataclass
class CompactionOutcome:
    completed: EventView  # the `session.compaction.completed` event: the terminal result
    events: list[EventView] = field(default_factory=list)


@dataclass(frozen=True)
class Usage:
    """A provider response's usage: `input_tokens` counts the cached input too, as
    `provider.response` reports it (§8.4); the cache counts are the parts of it the provider
    read from or wrote to its prompt cache."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    @property
    def token_count(self) -> int:
        return self.input_tokens + self.output_tokens
