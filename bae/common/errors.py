"""Errors that cross service boundaries.

`Problem` is an RFC 7807 REST error. A service raises it; `bae.common.grpcutil`
turns it into a gRPC status with a `bae-problem` trailer, and the gateway
turns that back into the HTTP response.
"""

from __future__ import annotations

import json

import grpc

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


class BaeError(Exception):
    """Base class of every error this project raises on purpose."""


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


# Longest client-supplied text an error message repeats back: problems travel
# in gRPC metadata, which has a size limit of its own.
ECHO_LIMIT = 200
# Longest `detail` any problem carries across a service boundary.
DETAIL_LIMIT = 2000


def echo(value: str, limit: int = ECHO_LIMIT) -> str:
    """`value` as an error message repeats it: cut to `limit` characters, marked with "…"."""
    return value if len(value) <= limit else value[:limit] + "…"


class UsageError(BaeError):
    """A startup configuration error: the process exits 2 with this one-line reason."""
