"""NDJSON frames of the /rpc response (SERVER-SPEC §6.1), one complete JSON object per line.

Frames are assembled from JSON text the session service already produced,
so event and result bodies pass through verbatim without a decode/encode.
"""

from __future__ import annotations

import json

from bae.protos import session_pb2

RpcError = session_pb2.RpcError

INTERNAL_ERROR = -32603


def dump(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def event_frame(event_json: str) -> bytes:
    return f'{{"jsonrpc":"2.0","method":"session.event","params":{event_json}}}\n'.encode()


def result_frame(id_json: str, result_json: str) -> bytes:
    return f'{{"jsonrpc":"2.0","id":{id_json},"result":{result_json}}}\n'.encode()


def error_frame(id_json: str | None, code: int, message: str) -> bytes:
    """An error object; `id_json` None leaves the `id` key out entirely."""
    error = f'"error":{{"code":{code},"message":{dump(message)}}}}}\n'
    if id_json is None:
        return ('{"jsonrpc":"2.0",' + error).encode()
    return f'{{"jsonrpc":"2.0","id":{id_json},{error}'.encode()


def rpc_error_frame(request_id_json: str | None, error: RpcError) -> bytes | None:
    """An RpcError per its id mode; None for a request error on a notification (no id)."""
    if error.id_mode == RpcError.NULL_ID:
        return error_frame("null", error.code, error.message)
    if error.id_mode == RpcError.NO_ID:
        return error_frame(None, error.code, error.message)
    if request_id_json is None:
        return None
    return error_frame(request_id_json, error.code, error.message)


def internal_error_frame(request_id_json: str) -> bytes:
    return error_frame(request_id_json, INTERNAL_ERROR, "Internal error")
