"""NDJSON frames of the /rpc response (SERVER-SPEC §6.1), one complete JSON object per line.

Frames are written from the session service's typed replies (services/gateway/proto_to_json.py);
an event's payload is spliced in as the stored text.
"""

from __future__ import annotations

from google.protobuf.message import Message

from bae.common.jsontext import dump
from bae.common.protos import client_api_pb2
from bae.common.rpc_codes import LAGGED_MESSAGE, RpcCode
from services.gateway.proto_to_json import to_json, writer_of

RpcError = client_api_pb2.RpcError

NDJSON = "application/x-ndjson"
INTERNAL_ERROR = RpcCode.INTERNAL_ERROR

_event_json = writer_of(client_api_pb2.Event.DESCRIPTOR)


def event_frame(event: client_api_pb2.Event) -> bytes:
    return ('{"jsonrpc":"2.0","method":"session.event","params":' + _event_json(event) + "}\n").encode()


def event_lines(batch: client_api_pb2.EventBatch) -> list[bytes]:
    return [event_frame(event) for event in batch.events]


def result_frame(id_json: str, result_json: str) -> bytes:
    return f'{{"jsonrpc":"2.0","id":{id_json},"result":{result_json}}}\n'.encode()


def error_frame(id_json: str | None, code: int, message: str) -> bytes:
    """An error object; `id_json` None leaves the `id` key out entirely."""
    error = f'"error":{{"code":{code},"message":{dump(message)}}}}}\n'
    if id_json is None:
        return ('{"jsonrpc":"2.0",' + error).encode()
    return f'{{"jsonrpc":"2.0","id":{id_json},{error}'.encode()


def rpc_error_frame(request_id_json: str | None, error: client_api_pb2.RpcError) -> bytes | None:
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


def reply_frame(reply: Message, request_id_json: str | None) -> bytes | None:
    """The lines of a unary reply (`outcome`) or of one frame of a stream (`kind`); None when the
    client gets none (`accepted`, the observer, a notification's result)."""
    kind = reply.WhichOneof("kind" if "kind" in reply.DESCRIPTOR.oneofs_by_name else "outcome")
    if kind == "events":
        return b"".join(event_lines(reply.events))  # type: ignore[attr-defined]
    if kind == "result":
        return None if request_id_json is None else result_frame(request_id_json, to_json(reply.result))  # type: ignore[attr-defined]
    if kind == "error":
        return rpc_error_frame(request_id_json, reply.error)  # type: ignore[attr-defined]
    return None
