"""JSON-RPC faults, and the one place any failure of a method becomes an error.

A method raises `RpcFault` for a refusal of its own (bad params, driver gate)
and lets the engine's `EngineError`s through; `rpc_error` maps both, and
anything unexpected becomes `-32603 Internal error` with the detail logged.
"""

from __future__ import annotations

import logging

from bae.common.errors import QuotaExceeded
from bae.common.protos import client_api_pb2
from bae.common.rpc_codes import RpcCode
from bae.services.session.engine.errors import BudgetExhausted, EngineError, LoopFailed, TurnCancelled, TurnInProgress

log = logging.getLogger("bae.session.rpc")

RpcError = client_api_pb2.RpcError


class RpcFault(Exception):
    """A JSON-RPC error a method answers with: its code and message."""

    def __init__(
        self, code: RpcCode, message: str, *, id_mode: client_api_pb2.RpcError.IdMode.ValueType = RpcError.REQUEST_ID
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.id_mode = id_mode


def invalid_params(detail: str) -> RpcFault:
    return RpcFault(RpcCode.INVALID_PARAMS, f"Invalid params: {detail}")


# Engine refusals are application errors (-32000) unless listed here.
ENGINE_CODES: dict[type[EngineError], RpcCode] = {
    TurnInProgress: RpcCode.TURN_IN_PROGRESS,
    TurnCancelled: RpcCode.TURN_CANCELLED,
    BudgetExhausted: RpcCode.BUDGET_EXHAUSTED,
}


def rpc_error(exc: Exception, method: str) -> client_api_pb2.RpcError:
    """The error a method's failure is answered with."""
    if isinstance(exc, RpcFault):
        return RpcError(code=exc.code, message=exc.message, id_mode=exc.id_mode)
    if isinstance(exc, QuotaExceeded):
        return RpcError(code=RpcCode.QUOTA_EXCEEDED, message=exc.detail)
    if isinstance(exc, EngineError):
        if isinstance(exc, LoopFailed):  # the client hears "session loop failed"; the log says why
            log.error("%s failed: %s", method, exc.reason)
        return RpcError(code=ENGINE_CODES.get(type(exc), RpcCode.APPLICATION_ERROR), message=str(exc))
    log.error("%s failed", method, exc_info=exc)
    return RpcError(code=RpcCode.INTERNAL_ERROR, message="Internal error")
