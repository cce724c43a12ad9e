"""JSON-RPC 2.0 error codes of the client API (SERVER-SPEC §6.5)."""

from __future__ import annotations

from enum import IntEnum


# The error a stream that fell too far behind ends with (SERVER-SPEC §6.4).
LAGGED_MESSAGE = "lagged; reconnect with since_event_id"


class RpcCode(IntEnum):
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
    # Limits: a quota reached (`quota_exceeded: <key> <limit> reached`), a budget used up.
    QUOTA_EXCEEDED = -32050
    BUDGET_EXHAUSTED = -32051
    # session.cancelTurn stopped the turn this sendMessage ran (`turn cancelled`).
    TURN_CANCELLED = -32052
