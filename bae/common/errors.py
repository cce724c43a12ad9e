"""The errors this project raises on purpose, by kind, the same in every service.

A layer that refuses or fails raises one of the kinds below with a `reason` (the problem
type slug a client sees, e.g. ``profile_in_use``) and a `detail` sentence. It never raises
a transport's error (an HTTP problem, a gRPC status, a JSON-RPC code): each edge maps the
kinds once, in one table of its own:

- the internal plane: ``bae.common.error_codes`` (kind <-> gRPC status code, the rest in
  the ``bae-error-bin`` trailer), so a kind raised in one service is raised again, the same,
  by the caller in another;
- HTTP: the gateway's problem table (bae/services/gateway/problems.py: kind -> status, RFC 7807 body);
- JSON-RPC: the session service's ``api/faults.py`` (kind -> error code).
"""

from __future__ import annotations

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


class QuotaExceeded(TooManyRequests):
    """A quota of bae.common.limits is reached (open sessions, sandboxes, subscribers, commands).

    The detail is the JSON-RPC message too: `quota_exceeded: <key> <limit> reached`."""

    default_reason = "quota_exceeded"

    def __init__(self, key: str, limit: int) -> None:
        super().__init__(f"quota_exceeded: {key} {limit} reached")
        self.key = key
        self.limit = limit


class RateLimited(TooManyRequests):
    """A key's requests per second on one gateway process went over its bucket (Retry-After set)."""

    default_reason = "rate_limited"


class Unavailable(BaeError):
    """A dependency is down or busy; trying again later may succeed (see `retry_after`)."""

    default_reason = "service_unavailable"


class DeadlineExceeded(BaeError):
    default_reason = "gateway_timeout"


class Internal(BaeError):
    """A bug or an unexpected failure; the detail a client sees says nothing of the internals."""

    default_reason = "internal"


class UsageError(BaeError):
    """A startup configuration error: the process exits 2 with this one-line reason."""
