"""The JSON-RPC envelope of one /rpc body: a method call, or the one error frame (§6.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bae.common.errors import echo
from bae.common.jsontext import JsonSyntaxError, dump, strict_load
from bae.common.rpc_codes import RpcCode
from bae.services.gateway.declaration import RPC_METHODS, RpcMethod
from bae.services.gateway.frames import error_frame


@dataclass(frozen=True)
class Call:
    method: RpcMethod
    # The request id as JSON text; None when absent (a notification).
    id_json: str | None
    # The request's `params` as parsed; None when absent.
    params: Any


@dataclass(frozen=True)
class Rejected:
    """An envelope error: `frame` is the whole response body (empty for a notification)."""

    frame: bytes
    # What the access log names the call (docs/observability.md): a fixed word, never the body's text.
    logged_as: str = "invalid"


def parse_envelope(body: bytes) -> Call | Rejected:
    try:
        document = strict_load(body)
    except JsonSyntaxError:
        return Rejected(error_frame("null", RpcCode.PARSE_ERROR, "Parse error"))
    if isinstance(document, list):
        return Rejected(
            error_frame("null", RpcCode.INVALID_REQUEST, "Invalid Request: batch requests are not supported"), "batch"
        )
    if not isinstance(document, dict):
        return Rejected(error_frame("null", RpcCode.INVALID_REQUEST, "Invalid Request"))
    id_json = dump(document["id"]) if "id" in document else None

    def reject(code: int, message: str, logged_as: str = "invalid") -> Rejected:
        # A notification never gets a terminal frame, not even an error.
        return Rejected(b"" if id_json is None else error_frame(id_json, code, message), logged_as)

    if document.get("jsonrpc") != "2.0":
        return reject(RpcCode.INVALID_REQUEST, 'Invalid Request: missing or wrong "jsonrpc" version')
    method = document.get("method")
    if not isinstance(method, str):
        return reject(RpcCode.INVALID_REQUEST, 'Invalid Request: missing "method"')
    if method not in RPC_METHODS:
        return reject(RpcCode.METHOD_NOT_FOUND, f"Method not found: {echo(method)}", "unknown")
    return Call(RPC_METHODS[method], id_json, document.get("params"))
