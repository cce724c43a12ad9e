"""The errors a call can end with: a REST problem document, or a JSON-RPC error frame."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import httpx


class RpcCode(IntEnum):
    """JSON-RPC 2.0 error codes of the client API (SERVER-SPEC §6.5).

    The client library is distributed on its own, so it keeps its own copy of the server's table
    (tests/unit/test_client_package.py checks the two agree).
    """

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    # Application errors: the message says which (session not open, merge invalid, …).
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


class ApiError(Exception):
    """A REST problem document (RFC 7807): `type` is the stable slug, e.g. `session_closed`."""

    def __init__(self, status: int, type: str, detail: str) -> None:
        super().__init__(f"{status} {type}: {detail}")
        self.status, self.type, self.detail = status, type, detail


class RpcError(Exception):
    """A JSON-RPC error frame, e.g. -32001 when the driver was not registered."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.data = code, message, data


def raise_for_problem(response: httpx.Response) -> None:
    """ApiError from a failed response's problem document (its text when the body is not one)."""
    if response.is_success:
        return
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    problem = problem if isinstance(problem, dict) else {}
    raise ApiError(response.status_code, str(problem.get("type", "unknown")), str(problem.get("detail", response.text)))
