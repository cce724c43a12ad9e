"""A channel to one session replica whose SessionService calls share one long-lived `Calls` stream.

A call of its own costs the gateway and the session service more CPU than an
authenticated `GET …/events` does in all (its setup and teardown on both ends,
against one message each way on an open stream). So `SessionCallsChannel` sends
SessionService's calls on one stream per replica, each a typed GatewayCall told apart
by call id (session.proto), and the generated stub built on it is used as on any
channel: a unary call is awaited for its reply, a streaming one is read to
`grpc.aio.EOF`, and a failed one raises `grpc.aio.AioRpcError` with the status and
trailing metadata the replica answered (its `bae-error-bin`, its `bae-session-owner`).
A streaming call's messages are credited back as they are read, so a client that
stops reading holds back its own call only. Relay, which lasts as long as its
session, stays a call of its own, as does ImportSession (a client-streaming call). A request always fits the stream: the gateway
bounds bodies (BAE_MAX_BODY_BYTES, at most 48 MiB) below what one message carries.

The stream is opened on first use and again after it ended. A call whose stream
breaks fails UNAVAILABLE, as a call cut off mid-way does, whatever status gRPC
gave the stream (logged); a call the replica refused because it is shutting down
was never acted on, and is sent once more on a new stream, which fails to open as
a call to a stopped replica does.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
from typing import Any, Generator

import grpc

from bae.common import propagation
from bae.common.channel_wrapper import ChannelWrapper
from bae.common.protos import session_pb2, session_pb2_grpc
from bae.common.session_routing import call_field
from bae.common.stream_writer import StreamWriter

log = logging.getLogger("bae.gateway")

Queue = asyncio.Queue[Any]  # a call's GatewayReply items; an AioRpcError or _CANCELLED in place of its end

_CODES = {code.value[0]: code for code in grpc.StatusCode}
_NO_METADATA = grpc.aio.Metadata()
# Stands for a cancelled streaming call among its replies.
_CANCELLED = object()
# What the calls on a stream that broke with a status other than UNAVAILABLE fail with (the status is logged).
STREAM_BROKE = "the calls stream to the session service broke"
# A streaming call's reader grants credit back after this many messages: half the replica's window.
_CREDIT_EVERY = session_pb2.GATEWAY_WINDOW // 2
_SERVICE = session_pb2.DESCRIPTOR.services_by_name["SessionService"]
# The methods a GatewayCall can carry, by full method name: the field its request goes in.
_FIELDS = {
    f"/{_SERVICE.full_name}/{method.name}": field.name
    for method in _SERVICE.methods
    for field in session_pb2.GatewayCall.DESCRIPTOR.oneofs_by_name["kind"].fields
    if field.message_type is not None and field.message_type.full_name == method.input_type.full_name
    and field.name == call_field(method.name)
}


class SessionCallsChannel(ChannelWrapper):
    """Wraps `channel`: SessionService's calls go on the `Calls` stream; everything else (health
    checks, Relay, the stream itself) is the channel's own."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel)
        self._open_call = session_pb2_grpc.SessionServiceStub(channel).Calls
        self._stream: _CallStream | None = None
        self._call_ids = itertools.count(1)

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if (name := _FIELDS.get(method)) is None:
            return self._channel.unary_unary(method, *args, **kwargs)
        return _Method(self, name, StreamedCall)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if (name := _FIELDS.get(method)) is None:
            return self._channel.unary_stream(method, *args, **kwargs)
        return _Method(self, name, StreamedStream)

    async def close(self, grace: float | None = None) -> None:
        if self._stream is not None:
            await self._stream.close()
        await super().close(grace)

    def send(self, call: session_pb2.GatewayCall) -> tuple[_CallStream, int, Queue]:
        """Send `call` on the open stream (opening one if none is); its replies come in the queue."""
        if self._stream is None or self._stream.ending is not None:
            # Opened outside any request's context: each call sends its own request id and trace.
            # Long-lived, so no deadline: keepalive finds a replica that went away.
            self._stream = _CallStream(contextvars.Context().run(self._open_call))
        call_id = next(self._call_ids)
        return self._stream, call_id, self._stream.send(call_id, call)


class _Method:
    """One method of the stub: calling it makes a call on the stream."""

    __slots__ = ("_channel", "_name", "_kind")

    def __init__(self, channel: SessionCallsChannel, name: str, kind: type[_Call]) -> None:
        self._channel = channel
        self._name = name
        self._kind = kind

    def __call__(self, request: Any, *, timeout: float | None = None, metadata: Any = None, **kwargs: Any) -> Any:
        sent: list[tuple[str, str | bytes]] = list(metadata or ())
        propagation.add_outgoing(sent)
        call = session_pb2.GatewayCall(metadata={key: str(value) for key, value in sent})
        getattr(call, self._name).CopyFrom(request)
        return self._kind(self._channel, call, self._name, timeout)


class _Call:
    """What every call on the stream is made with (`_Method.__call__`)."""

    __slots__ = ("_channel", "_call", "_name", "_timeout")

    def __init__(self, channel: SessionCallsChannel, call: session_pb2.GatewayCall, name: str, timeout: float | None) -> None:
        self._channel = channel
        self._call = call
        self._name = name
        self._timeout = timeout


class StreamedCall(_Call):
    """A unary call on the stream: awaiting it (once) sends it and waits for the reply;
    `trailing_metadata()` is what it ended with."""

    __slots__ = ("_trailing",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._trailing: grpc.aio.Metadata = _NO_METADATA

    def __await__(self) -> Generator[Any, None, Any]:
        return self._run().__await__()

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        return self._trailing

    async def _run(self) -> Any:
        try:
            async with asyncio.timeout(self._timeout):
                ending = await self._send()
                if ending.not_started:  # refused by a replica shutting down: safe to send once more
                    ending = await self._send()
        except TimeoutError:
            raise _error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        self._trailing = _trailing(ending)
        _raise_failure(ending, self._trailing)
        return getattr(ending, self._name)

    async def _send(self) -> session_pb2.GatewayReply:
        stream, call_id, replies = self._channel.send(self._call)
        answered = False
        try:
            reply = await replies.get()
            answered = True
        finally:
            stream.forget(call_id, cancel=not answered)
        if isinstance(reply, grpc.aio.AioRpcError):
            raise reply
        assert isinstance(reply, session_pb2.GatewayReply)
        return reply


class StreamedStream(_Call):
    """A server-streaming call on the stream, read as grpc.aio's is: `read()` gives each message,
    then `grpc.aio.EOF`, or raises the call's failure; after `cancel()` a read raises CancelledError.
    Sent when made; live calls carry no deadline."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._stream, self._call_id, self._replies = self._channel.send(self._call)
        self._resent = False
        self._uncredited = 0  # messages read since the last credit
        self._ended: grpc.aio.AioRpcError | object | None = None  # EOF, the failure, or _CANCELLED

    async def read(self) -> Any:
        while self._ended is None:
            reply = await self._replies.get()
            if reply is _CANCELLED:
                break
            if isinstance(reply, grpc.aio.AioRpcError):
                self._ended = reply
            elif reply.more:
                self._uncredited += 1
                if self._uncredited >= _CREDIT_EVERY:
                    self._stream.grant(self._call_id, self._uncredited)
                    self._uncredited = 0
                return getattr(reply, self._name)
            elif reply.not_started and not self._resent:  # as StreamedCall: sent once more
                self._resent = True
                self._stream, self._call_id, self._replies = self._channel.send(self._call)
            else:
                try:
                    _raise_failure(reply, _trailing(reply))
                    self._ended = grpc.aio.EOF
                except grpc.aio.AioRpcError as failure:
                    self._ended = failure
        if self._ended is _CANCELLED:
            raise asyncio.CancelledError()
        if isinstance(self._ended, grpc.aio.AioRpcError):
            raise self._ended
        return grpc.aio.EOF

    def cancel(self) -> bool:
        if self._ended is not None:
            return False
        self._ended = _CANCELLED
        self._stream.forget(self._call_id, cancel=True)
        self._replies.put_nowait(_CANCELLED)  # a read waiting now raises CancelledError
        return True


class _CallStream:
    """One open `Calls` call: a reader task hands each reply to the call it belongs to."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self._call = call
        # Each call's replies; an AioRpcError in place of its end when the stream ended under it.
        self._waiting: dict[int, Queue] = {}
        self._writer: StreamWriter[session_pb2.GatewayCall] = StreamWriter(
            call.write, self._write_failed, session_pb2.GatewayCalls
        )
        # What calls sent from now on fail with (they go on a new stream); None while open.
        self.ending: grpc.aio.AioRpcError | None = None
        self._ended = False
        self._reader = asyncio.get_running_loop().create_task(self._read(), context=contextvars.Context())

    def send(self, call_id: int, call: session_pb2.GatewayCall) -> Queue:
        replies: Queue = asyncio.Queue()
        if self.ending is not None:
            replies.put_nowait(self.ending)
            return replies
        self._waiting[call_id] = replies
        call.call_id = call_id  # the writer copies it into its pack; a resend gets a new id
        self._writer.send(call)
        return replies

    def grant(self, call_id: int, credit: int) -> None:
        """The call's reader took `credit` more messages: the replica may send as many more."""
        if not self._ended:
            self._writer.send(session_pb2.GatewayCall(call_id=call_id, credit=credit))

    def forget(self, call_id: int, *, cancel: bool) -> None:
        """The call ended or its caller stopped waiting; `cancel` tells the replica to stop it too."""
        self._waiting.pop(call_id, None)
        if cancel and not self._ended:
            self._writer.send(session_pb2.GatewayCall(call_id=call_id, cancel=True))

    async def close(self) -> None:
        self._end(_error(grpc.StatusCode.CANCELLED, "the gateway is shutting down"))
        self._call.cancel()
        await self._writer.close()

    async def _read(self) -> None:
        try:
            async for pack in self._call:
                for index, reply in enumerate(pack.replies):
                    if index:
                        # Each reply's reader runs before the next is handed over, as when each came
                        # alone: a relay's 100 observers are woken before the driver's stream sent next.
                        await asyncio.sleep(0)
                    self._deliver(reply)
            self._end(_error(grpc.StatusCode.UNAVAILABLE, "the session service ended the calls stream"))
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                self._end(error)
            else:
                # The stream's status is the connection's, not a call's (each call's comes in its last
                # reply): a replica killed under it can end it INTERNAL "Internal error from Core",
                # grpc.aio's status for a write that failed on the broken connection. Its calls were
                # cut off by an outage, as on a connection of their own: UNAVAILABLE (503), not 500.
                log.warning("the calls stream broke: %s %s", error.code().name, error.details())
                self._end(_error(grpc.StatusCode.UNAVAILABLE, STREAM_BROKE))
        finally:
            self._end(_error(grpc.StatusCode.CANCELLED, "the calls stream was closed"))
            await self._writer.close()

    def _deliver(self, reply: session_pb2.GatewayReply) -> None:
        if reply.not_started and self.ending is None:
            # The replica is draining: later calls go on a new stream; the calls it took
            # are still answered on this one.
            self.ending = _error(grpc.StatusCode.UNAVAILABLE, reply.details)
        replies = self._waiting.get(reply.call_id) if reply.more else self._waiting.pop(reply.call_id, None)
        if replies is not None:  # else its caller stopped waiting
            replies.put_nowait(reply)

    def _write_failed(self, exc: Exception) -> None:
        # The reader sees the call's end and its status; writing only stops here.
        log.debug("writing to the calls stream failed: %s", exc)

    def _end(self, error: grpc.aio.AioRpcError) -> None:
        self._ended = True
        if self.ending is None:
            self.ending = error
        waiting, self._waiting = self._waiting, {}
        for replies in waiting.values():
            replies.put_nowait(self.ending)


def _trailing(reply: session_pb2.GatewayReply) -> grpc.aio.Metadata:
    if not reply.trailing_metadata:
        return _NO_METADATA
    return grpc.aio.Metadata(*(
        (key, value if key.endswith("-bin") else value.decode()) for key, value in reply.trailing_metadata.items()
    ))


def _raise_failure(reply: session_pb2.GatewayReply, trailing: grpc.aio.Metadata) -> None:
    if reply.code != grpc.StatusCode.OK.value[0]:
        raise _error(_CODES.get(reply.code, grpc.StatusCode.UNKNOWN), reply.details, trailing)


def _error(
    code: grpc.StatusCode, details: str, trailing: grpc.aio.Metadata = _NO_METADATA
) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, _NO_METADATA, trailing, details)
