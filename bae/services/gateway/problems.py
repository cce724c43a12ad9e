"""The HTTP edge's one table of errors: each kind of bae.common.errors is one status, answered as
the spec's RFC 7807 body ({"type","title","status","detail"}) with Retry-After when it has one."""

from __future__ import annotations

import json
from typing import Mapping

from starlette.responses import Response

from bae.common import errors

JSON = "application/json"

STATUSES: dict[type[errors.BaeError], int] = {
    errors.InvalidInput: 400,
    errors.Unauthenticated: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.TooLarge: 413,
    errors.Unprocessable: 422,
    errors.TooManyRequests: 429,
    errors.Internal: 500,
    errors.Unavailable: 503,
    errors.DeadlineExceeded: 504,
}
TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def status_of(error: errors.BaeError) -> int:
    """The status of `error`'s kind (its nearest listed base class)."""
    for kind in type(error).__mro__:
        if kind in STATUSES:
            return STATUSES[kind]
    return 500


def problem_response(
    status: int, reason: str, detail: str, headers: Mapping[str, str] | None = None
) -> Response:
    # The spec shows RFC 7807 bodies as application/json, not application/problem+json.
    return Response(problem_body(status, reason, detail), status, headers, media_type=JSON)


def problem_body(status: int, reason: str, detail: str) -> str:
    return json.dumps({"type": reason, "title": TITLES.get(status, "Error"), "status": status, "detail": detail})


def error_response(error: errors.BaeError) -> Response:
    headers = {"retry-after": str(error.retry_after)} if error.retry_after is not None else None
    return problem_response(status_of(error), error.reason, error.detail, headers)
