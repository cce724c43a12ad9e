"""The errors this project raises on purpose, by kind, the same in every service.

A layer that refuses or fails raises one of the kinds below with a `reason` (the problem
type slug a client sees, e.g. ``profile_in_use``) and a `detail` sentence. It never raises
a transport's error (an HTTP problem, a gRPC status, a JSON-RPC code): each edge maps the
kinds once, in one table of its own:

- the internal plane: ``bae.common.error_codes`` (kind <-> gRPC status code, the rest in
  the ``bae-error-bin`` trailer), so a kind raised in one service is raised again, the same,
  by the caller in another;
- HTTP: the gateway's problem table (kind -> status, RFC 7807 body);
- JSON-RPC: the session service's ``api/faults.py`` (kind -> error code).
"""

from __future__ import annotations

import json

import grpc

# Longest client-supplied text an error message repeats back.
ECHO_LIMIT = 200
# Longest `detail` any error carries across a service boundary (it travels in metadata).
DETAIL_LIMIT = 2000


def echo(value: str, limit: int = ECHO_LIMIT) -> str:
    """`value` as an error message repeats it: cut to `limit` characters, marked with "…"."""
    return value if len(value) <= limit else value[:limit] + "…"


class BaeError(Exception):
    """Base class of every error this project raises on purpose.

    `reason` names the failure for machines (a problem type slug); `detail` says it for
    people, and what to do next when there is something to do.
    """

    default_reason = "internal"

    def __init__(self, detail: str, *, reason: str | None = None, retry_after: int | None = None) -> None:
        detail = echo(detail, DETAIL_LIMIT)
        super().__init__(detail)
        self.detail = detail
        self.reason = reason or self.default_reason
        # Seconds after which trying again may succeed (HTTP Retry-After), when known.
        self.retry_after = retry_after


class InvalidInput(BaeError):
    """The request is malformed: a body, a parameter or a query value."""

    default_reason = "bad_request"


class Unauthenticated(BaeError):
    """No credential, or not a valid one for what is asked."""

    default_reason = "unauthorized"


class Forbidden(BaeError):
    """A valid credential that may not do this (a tool outside the allowlist, another profile)."""

    default_reason = "forbidden"


class NotFound(BaeError):
    default_reason = "not_found"


class Conflict(BaeError):
    """The target's state forbids it now: a closed session, a name taken, a profile in use."""

    default_reason = "conflict"


class Unprocessable(BaeError):
    """Well-formed, but it cannot be done with what it names (a profile gone, a provider not configured)."""

    default_reason = "unprocessable"


class TooLarge(BaeError):
    """An input over its size bound."""

    default_reason = "payload_too_large"


class TooManyRequests(BaeError):
    default_reason = "too_many_requests"


class Unavailable(BaeError):
    """A dependency is down or busy; trying again later may succeed (see `retry_after`)."""

    default_reason = "service_unavailable"


class DeadlineExceeded(BaeError):
    default_reason = "gateway_timeout"


class Internal(BaeError):
    """A bug or an unexpected failure; the detail a client sees says nothing of the internals."""

    default_reason = "internal"



# HTTP problems as the services raised them before the kinds above; being replaced by the kinds.

PROBLEM_TRAILER = "bae-problem"

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}

_GRPC_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    422: grpc.StatusCode.FAILED_PRECONDITION,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


class Problem(BaeError):
    """An RFC 7807 error: {"type", "title", "status", "detail"}.

    `retry_after` (seconds) becomes the HTTP `Retry-After` header.
    """

    def __init__(self, status: int, type: str, detail: str, *, retry_after: int | None = None) -> None:
        detail = echo(detail, DETAIL_LIMIT)  # it travels in gRPC metadata
        super().__init__(detail)
        self.status = status
        self.type = type
        self.detail = detail
        self.retry_after = retry_after

    def body(self) -> dict:
        return {
            "type": self.type,
            "title": TITLES.get(self.status, "Error"),
            "status": self.status,
            "detail": self.detail,
        }

    def to_json(self) -> str:
        return json.dumps(self.body())

    def trailer(self) -> str:
        """The `bae-problem` trailer: the body plus what the gateway turns into headers."""
        if self.retry_after is None:
            return self.to_json()
        return json.dumps({**self.body(), "retry_after": self.retry_after})

    @property
    def grpc_code(self) -> grpc.StatusCode:
        return _GRPC_CODES.get(self.status, grpc.StatusCode.INTERNAL)

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "Problem | None":
        """The Problem carried by a failed gRPC call, if it carries one."""
        trailers = error.trailing_metadata() or ()
        for key, value in trailers:
            if key == PROBLEM_TRAILER:
                body = json.loads(value)
                return cls(body["status"], body["type"], body["detail"], retry_after=body.get("retry_after"))
        return None


def bad_request(detail: str) -> Problem:
    return Problem(400, "bad_request", detail)


def unauthorized(detail: str) -> Problem:
    return Problem(401, "unauthorized", detail)


def not_found(detail: str) -> Problem:
    return Problem(404, "not_found", detail)


def internal(detail: str = "internal server error") -> Problem:
    return Problem(500, "internal", detail)


def payload_too_large(limit: int) -> Problem:
    return Problem(413, "payload_too_large", f"request body exceeds the limit of {limit} bytes (BAE_MAX_BODY_BYTES)")


class UsageError(BaeError):
    """A startup configuration error: the process exits 2 with this one-line reason."""
