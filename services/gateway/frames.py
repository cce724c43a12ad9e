"""NDJSON frames of the /rpc response (SERVER-SPEC §6.1), one complete JSON object per line.

Frames are assembled from JSON text the session service already produced,
so event and result bodies pass through verbatim without a decode/encode.
"""

from __future__ import annotations

from bae.common.jsontext import dump
from bae.common.protos import session_pb2
from bae.common.rpc_codes import LAGGED_MESSAGE, RpcCode

RpcError = session_pb2.RpcError

NDJSON = "application/x-ndjson"
INTERNAL_ERROR = RpcCode.INTERNAL_ERROR


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


# A stream that fell too far behind (SERVER-SPEC §6.4): no id, and the stream closes.
LAGGED_FRAME = error_frame(None, RpcCode.APPLICATION_ERROR, LAGGED_MESSAGE)


def internal_error_frame(request_id_json: str) -> bytes:
    return error_frame(request_id_json, INTERNAL_ERROR, "Internal error")


def reply_frame(reply: session_pb2.RpcFrame | session_pb2.RpcReply, request_id_json: str | None) -> bytes | None:
    """The line for a unary reply or one frame of a stream; None when the client gets none."""
    kind = reply.WhichOneof("kind")
    if kind == "events":
        return b"".join(event_frame(event_json) for event_json in reply.events.json)
    if kind == "result_json":
        return None if request_id_json is None else result_frame(request_id_json, reply.result_json)
    if kind == "error":
        return rpc_error_frame(request_id_json, reply.error)
    return None  # `accepted` carries no output of its own
