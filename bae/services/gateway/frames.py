"""NDJSON frames of the /rpc response (SERVER-SPEC §6.1), one complete JSON object per line, and
the Server-Sent Events of the events stream route.

Frames are written from the session service's typed replies (bae/services/gateway/proto_to_json.py);
an event's payload is spliced in as the stored text. A stream's frames go through its own
`StreamLines`, which writes an event in pieces (client_api.proto, EventBatch) as its pieces come,
and a turn's result whose events go on in `result_events` frames as those come: nothing is joined.
An event and a delta are written the same way in both wires (`Wire`); only what wraps them differs.
"""

from __future__ import annotations

from typing import Iterable

from google.protobuf.message import Message

from bae.common.jsontext import dump
from bae.common.protos import client_api_pb2
from bae.common.rpc_codes import LAGGED_MESSAGE, RpcCode
from bae.services.gateway.proto_to_json import to_json, writer_of

RpcError = client_api_pb2.RpcError

NDJSON = "application/x-ndjson"
INTERNAL_ERROR = RpcCode.INTERNAL_ERROR

SSE = "text/event-stream"

_event_json = writer_of(client_api_pb2.Event.DESCRIPTOR)
_NOTIFICATION = '{"jsonrpc":"2.0","method":"session.event","params":'
_DELTA_NOTIFICATION = '{"jsonrpc":"2.0","method":"session.delta","params":'
# An event's last key, after its payload: where an event in pieces is cut until its last piece.
_CREATED_AT = ',"created_at":'
_DELTA_KINDS = {
    client_api_pb2.DELTA_TEXT: "text",
    client_api_pb2.DELTA_THINKING: "thinking",
    client_api_pb2.DELTA_TOOL_INPUT: "tool_input",
    client_api_pb2.DELTA_RESET: "reset",
}


def delta_json(session_id_json: str, delta: client_api_pb2.Delta) -> str:
    """A `session.delta`'s params: {"session_id","request_event_id","seq","index","kind","text"}."""
    return (
        f'{{"session_id":{session_id_json},"request_event_id":{dump(delta.request_event_id)},"seq":{delta.seq},'
        f'"index":{delta.index},"kind":"{_DELTA_KINDS.get(delta.kind, "text")}","text":{dump(delta.text)}}}'
    )


class Wire:
    """How a stream writes an event and a delta: as JSON-RPC notifications on NDJSON lines (the
    /rpc streams), or as Server-Sent Events (`id:` the event's id, `event:`, `data:` the JSON,
    which never holds a line break)."""

    def __init__(self, media_type: str) -> None:
        self.media_type = media_type
        self.sse = media_type == SSE

    def event_head(self, event: client_api_pb2.Event) -> str:
        """What comes before an event's JSON; `end` after it."""
        return f"id: {event.id}\nevent: session.event\ndata: " if self.sse else _NOTIFICATION

    @property
    def end(self) -> str:
        return "\n\n" if self.sse else "}\n"

    def event(self, event: client_api_pb2.Event) -> bytes:
        return (self.event_head(event) + _event_json(event) + self.end).encode()

    def delta(self, session_id_json: str, delta: client_api_pb2.Delta) -> bytes:
        head = "event: session.delta\ndata: " if self.sse else _DELTA_NOTIFICATION
        return (head + delta_json(session_id_json, delta) + self.end).encode()


NDJSON_WIRE = Wire(NDJSON)
SSE_WIRE = Wire(SSE)


def event_frame(event: client_api_pb2.Event) -> bytes:
    return NDJSON_WIRE.event(event)


def event_lines(batch: client_api_pb2.EventBatch) -> list[bytes]:
    return [event_frame(event) for event in batch.events]


def whole(batches: list[client_api_pb2.EventBatch]) -> client_api_pb2.EventBatch:
    """The batches of an event in pieces as one batch that holds it whole."""
    first = batches[0]
    event = first.events[-1]
    event.payload.json = "".join([event.payload.json, *(batch.events[0].payload.json for batch in batches[1:])])
    first.continued = False
    return first


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


class StreamLines:
    """The lines of one stream's frames, in order (a stream has one). An event in pieces is written
    piece by piece, its line ended by its last; a turn's result is ended by whatever follows it
    (more of its events in `result_events` frames, the stream's end), as only then is it whole."""

    def __init__(self, request_id_json: str | None, session_id: str = "", wire: Wire = NDJSON_WIRE) -> None:
        self.request_id_json = request_id_json
        self.session_id_json = dump(session_id)
        self.wire = wire
        self._event_end: str | None = None  # what ends the event whose payload goes on
        # What ends the open result; None when none is (or it is not written: no id), and then
        # its `result_events` are not written either.
        self._result_end: str | None = None
        self._result_items = 0  # events written in the open result

    def frame(self, reply: Message) -> bytes | None:
        """The bytes of one frame, None when the client gets none."""
        kind = reply.WhichOneof("kind")
        if kind == "result_events":
            return self._events(reply.result_events, in_result=True).encode() if self._result_end else None  # type: ignore[attr-defined]
        closing = self.end()
        if kind == "events":
            return (closing + self._events(reply.events, in_result=False)).encode()  # type: ignore[attr-defined]
        if kind == "deltas":
            return closing.encode() + self.deltas(reply.deltas.deltas)  # type: ignore[attr-defined]
        if kind == "result" and "result_events" in reply.DESCRIPTOR.fields_by_name:
            result = reply.result  # type: ignore[attr-defined]
            if self.request_id_json is None:
                return closing.encode() or None
            text = to_json(result)  # {"message":…,"events":[…]}
            if not reply.result_continues:  # type: ignore[attr-defined]  # whole: one line, written now
                return (closing + f'{{"jsonrpc":"2.0","id":{self.request_id_json},"result":' + text + "}\n").encode()
            # More of its events follow: it stays open until they are in.
            self._result_end, self._result_items = text[-2:] + "}\n", len(result.events)
            return (closing + f'{{"jsonrpc":"2.0","id":{self.request_id_json},"result":' + text[:-2]).encode()
        line = reply_frame(reply, self.request_id_json)
        return closing.encode() + line if line else closing.encode() or None

    def deltas(self, deltas: Iterable[client_api_pb2.Delta]) -> bytes:
        return b"".join(self.wire.delta(self.session_id_json, delta) for delta in deltas)

    def end(self) -> str:
        """What ends the open result, if any (an event in pieces is ended by its last piece)."""
        closing, self._result_end = self._result_end or "", None
        return closing

    def broken(self) -> bytes:
        """The stream failed: a line left open is ended as it is, so the error frame has a line of its own."""
        open_line = self._event_end is not None or self._result_end is not None
        self._event_end = self._result_end = None
        return b"\n" if open_line else b""

    def _events(self, batch: client_api_pb2.EventBatch, *, in_result: bool) -> str:
        events = batch.events
        if self._event_end is not None:  # the next piece of an event's payload
            text = events[0].payload.json
            if batch.continued:
                return text
            end, self._event_end = self._event_end, None
            return text + end
        parts = []
        last = len(events) - 1
        for index, event in enumerate(events):
            if in_result:
                head, end = ("," if self._result_items else ""), ""
                self._result_items += 1
            else:
                head, end = self.wire.event_head(event), self.wire.end
            text = _event_json(event)
            if index == last and batch.continued:
                cut = text.rindex(_CREATED_AT)
                parts.append(head + text[:cut])
                self._event_end = text[cut:] + end
            else:
                parts.append(head + text + end)
        return "".join(parts)
