"""Everything the client raises derives from BaeError.

- TransportError: the server could not be reached, or the connection broke (the message names the URL).
- ApiError: a REST call answered with an RFC 7807 problem document (`type` is the stable slug).
- RpcError: a JSON-RPC error frame on the /rpc stream; one subclass per code of the client API.
- ProvidersFailedError: a turn ended with every provider failing (the session is now `error`).
- HookError, ToolError, UnknownToolError: the harness loop stopped on the client side.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bae_client.events import Event


class RpcCode(IntEnum):
    """JSON-RPC 2.0 error codes of the client API (docs/reference/rpc.md).

    The client is distributed on its own, so it keeps its own copy of the server's table
    (tests/unit/test_client_package.py checks the two agree).
    """

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    # Application errors: the message says which (session not open, merge invalid, lagged, …).
    APPLICATION_ERROR = -32000
    DRIVER_NOT_REGISTERED = -32001
    SANDBOX_IMAGE_NOT_ALLOWED = -32011
    SANDBOX_START_FAILED = -32012
    SANDBOX_NOT_RUNNING = -32013
    SUBAGENT_NOT_FOUND = -32014
    TOOL_NOT_ALLOWED = -32015
    TURN_IN_PROGRESS = -32020
    QUOTA_EXCEEDED = -32050
    BUDGET_EXHAUSTED = -32051
    TURN_CANCELLED = -32052


# The message of the error a subscription that fell too far behind ends with.
LAGGED_MESSAGE = "lagged; reconnect with since_event_id"


class BaeError(Exception):
    """Base class of every error this package raises."""


class TransportError(BaeError):
    """The server was not reached, or the connection broke: no HTTP answer to read.

    `url` is what was called, `cause` the underlying httpx exception.
    """

    def __init__(self, url: str, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.url, self.cause = url, cause


class ApiError(BaeError):
    """A non-2xx REST answer (RFC 7807): `type` is the stable slug, e.g. `session_closed`."""

    def __init__(self, status: int, type: str, title: str = "", detail: str | None = None) -> None:
        message = f"{status} {type}: {detail or title}"
        super().__init__(message)
        self.status, self.type, self.title, self.detail = status, type, title, detail

    @classmethod
    def from_body(cls, status: int, body: Any, text: str = "") -> ApiError:
        if not isinstance(body, dict):
            return cls(status, "unknown", "request failed", text or None)
        detail = body.get("detail")
        return cls(int(body.get("status", status)), str(body.get("type", "unknown")), str(body.get("title", "")),
                   None if detail is None else str(detail))


class RpcError(BaeError):
    """A JSON-RPC error frame (the HTTP answer itself was 200). `RpcError.of` picks the subclass of the code,
    so `except TurnCancelledError` and `except RpcError` both work."""

    code: int = 0

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"JSON-RPC error {code}: {message}")
        self.code, self.message, self.data = code, message, data

    @staticmethod
    def of(code: int, message: str, data: Any = None) -> RpcError:
        if code == RpcCode.APPLICATION_ERROR and message == LAGGED_MESSAGE:
            return LaggedError(code, message, data)
        return _BY_CODE.get(code, RpcError)(code, message, data)

    @staticmethod
    def from_frame(error: Any) -> RpcError:
        if not isinstance(error, dict):
            return RpcError(RpcCode.INTERNAL_ERROR, f"malformed error frame: {error!r}"[:200])
        code = error.get("code")
        return RpcError.of(code if isinstance(code, int) else RpcCode.INTERNAL_ERROR, str(error.get("message", "")),
                           error.get("data"))


class ParseError(RpcError):
    code = RpcCode.PARSE_ERROR


class InvalidRequestError(RpcError):
    code = RpcCode.INVALID_REQUEST


class MethodNotFoundError(RpcError):
    code = RpcCode.METHOD_NOT_FOUND


class InvalidParamsError(RpcError):
    code = RpcCode.INVALID_PARAMS


class InternalError(RpcError):
    code = RpcCode.INTERNAL_ERROR


class ApplicationError(RpcError):
    """-32000: session not open, profile deleted, tool-result merge invalid, compaction failed, …"""

    code = RpcCode.APPLICATION_ERROR


class LaggedError(ApplicationError):
    """A subscription fell too far behind and was ended. `Subscription` resumes by itself on it (resume=True)."""


class DriverNotRegisteredError(RpcError):
    code = RpcCode.DRIVER_NOT_REGISTERED


class SandboxImageNotAllowedError(RpcError):
    code = RpcCode.SANDBOX_IMAGE_NOT_ALLOWED


class SandboxStartFailedError(RpcError):
    code = RpcCode.SANDBOX_START_FAILED


class SandboxNotRunningError(RpcError):
    code = RpcCode.SANDBOX_NOT_RUNNING


class SubagentNotFoundError(RpcError):
    code = RpcCode.SUBAGENT_NOT_FOUND


class ToolNotAllowedError(RpcError):
    code = RpcCode.TOOL_NOT_ALLOWED


class TurnInProgressError(RpcError):
    code = RpcCode.TURN_IN_PROGRESS


class QuotaExceededError(RpcError):
    code = RpcCode.QUOTA_EXCEEDED


class BudgetExhaustedError(RpcError):
    code = RpcCode.BUDGET_EXHAUSTED


class TurnCancelledError(RpcError):
    code = RpcCode.TURN_CANCELLED


_BY_CODE: dict[int, type[RpcError]] = {
    cls.code: cls for cls in (
        ParseError, InvalidRequestError, MethodNotFoundError, InvalidParamsError, InternalError, ApplicationError,
        DriverNotRegisteredError, SandboxImageNotAllowedError, SandboxStartFailedError, SandboxNotRunningError,
        SubagentNotFoundError, ToolNotAllowedError, TurnInProgressError, QuotaExceededError, BudgetExhaustedError,
        TurnCancelledError,
    )
}


class ProvidersFailedError(BaeError):
    """Every provider failed during a turn: the server answered with its fallback assistant message and a
    `session.error` (`all_providers_failed`) event, and the session is now `error`. `events` holds the
    turn's events (the failed `provider.response` events say why)."""

    def __init__(self, message: dict[str, Any], events: list[Event]) -> None:
        super().__init__("all providers failed")
        self.assistant_message, self.events = message, events


class HookError(BaeError):
    """A hook raised: the loop stopped. `hook` is its name, `cause` what it raised."""

    def __init__(self, hook: str, cause: BaseException) -> None:
        super().__init__(f"hook {hook!r} failed: {cause}")
        self.hook, self.cause = hook, cause


class UnknownToolError(BaeError):
    """The model called a client tool this session has no handler for."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no handler registered for tool {name!r}")
        self.name = name


class ToolError(BaeError):
    """A tool's handler raised: the loop stopped (the turn stays paused on the server until it is answered,
    cancelled or reclaimed). `cause` is what the handler raised."""

    def __init__(self, name: str, cause: BaseException) -> None:
        super().__init__(f"tool {name!r} handler failed: {cause}")
        self.name, self.cause = name, cause
