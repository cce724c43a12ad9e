"""Why the engine refused or could not finish a request.

Each error's text is the client-facing message the spec gives; the API layer
maps the classes to JSON-RPC codes in one place (`api.faults`).
"""

from __future__ import annotations

from bae.common.jsontext import JsonObject


class EngineError(Exception):
    """A request the engine refused or could not finish; `str(error)` is the client text."""


class SessionNotOpen(EngineError):
    """The session is gone or no longer open."""

    @classmethod
    def of(cls, state: str | None) -> "SessionNotOpen":
        if state is None:
            return cls("session no longer exists")
        return cls(f"session is {state}, not open")


class ProfileUnavailable(EngineError):
    def __init__(self) -> None:
        super().__init__("profile_unavailable: the profile bound to this session is no longer available")


class OrphanToolResult(EngineError):
    def __init__(self) -> None:
        super().__init__(
            "tool result merge invalid: no paused turn is awaiting tool results "
            "(it may have timed out and been retired)"
        )


class MergeRefused(EngineError):
    """A paused turn's results did not merge; the session is now in `error` (§7.4)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"tool result merge invalid: {detail}")


class TurnInProgress(EngineError):
    """A live paused turn holds the gate; `session.compact` never waits on one (§12.3)."""

    def __init__(self) -> None:
        super().__init__("turn in progress: resolve the paused turn before compacting")


class TurnCancelled(EngineError):
    """`session.cancelTurn` stopped the turn. Raised inside the turn where it stopped; on its way
    out it picks up what the turn was doing then: the assistant message whose tool calls were
    running (None when it stopped in a provider call) and the results they had already."""

    def __init__(self) -> None:
        super().__init__("turn cancelled")
        self.message: JsonObject | None = None
        self.answered: dict[str, JsonObject] = {}


class BudgetExhausted(EngineError):
    """A budget (bae.common.limits) was used up before a provider call of the turn: the text is
    `budget_exhausted: <budget> <used>/<limit>`, `payload` the `session.error` event's. Like
    TurnCancelled, it picks up the assistant message whose tool calls the turn had answered
    (None before the turn's first call) and their results."""

    def __init__(self, text: str, payload: dict[str, object]) -> None:
        super().__init__(text)
        self.payload = payload
        self.message: JsonObject | None = None
        self.answered: dict[str, JsonObject] = {}


class KeyRevoked(EngineError):
    """The caller's client key was revoked while its call waited for the gate: it records nothing."""

    def __init__(self) -> None:
        super().__init__("invalid or revoked client key")


class LoopFailed(EngineError):
    """The turn loop could not run: runner unreachable, or a store write failed mid-loop."""

    def __init__(self, reason: str) -> None:
        super().__init__("session loop failed")
        self.reason = reason


class CompactionFailed(EngineError):
    def __init__(self, detail: str) -> None:
        super().__init__(f"compaction failed: {detail}")
        self.detail = detail


class ShuttingDown(EngineError):
    """This replica is draining and takes no new turns."""

    def __init__(self) -> None:
        super().__init__("server is shutting down; retry on another replica or after restart")


class SandboxFailed(EngineError):
    """A sandbox host refused or failed a start or an exec; `detail` is what it said (the
    session's `session.sandbox.error` event says it too)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
