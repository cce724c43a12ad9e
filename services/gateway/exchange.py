"""A channel to one session replica whose unary calls share one long-lived `Exchange` stream.

A unary call of its own cost the gateway and the session service more CPU than an
authenticated `GET …/events` does in all (its setup and teardown on both ends,
against one message each way on an open stream). So `ExchangeChannel` sends every
unary call on one stream per replica, told apart by call id, and the generated stub
built on it is used as on any channel: a call is awaited for its reply, and a failed
one raises `grpc.aio.AioRpcError` with the status and trailing metadata the replica
answered (its `bae-problem`, its `bae-session-owner`). Streaming calls (turns,
subscriptions, relays) keep calls of their own: their flow control is per call.

The stream is opened on first use and again after it ended. A call whose stream
breaks fails with the stream's status, as a call cut off mid-way does; a call the
replica refused because it is shutting down was never acted on, and is sent once
more on a new stream, which fails to open as a call to a stopped replica does.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
from typing import Any, Callable, Generator

import grpc

from bae import callcontext
from bae.channel_wrapper import ChannelWrapper
from bae.grpcutil import MAX_MESSAGE_BYTES
from bae.protos import session_pb2, session_pb2_grpc
from bae.stream_writer import StreamWriter

log = logging.getLogger("bae.gateway")

# A larger request would fail the shared stream, not just its call.
MAX_REQUEST_BYTES = MAX_MESSAGE_BYTES - 64 * 1024
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_NO_METADATA = grpc.aio.Metadata()
# The methods the replica serves on the stream: its own (health checks keep calls of their own).
_EXCHANGED = f"/{session_pb2.DESCRIPTOR.services_by_name['SessionService'].full_name}/"


class ExchangeChannel(ChannelWrapper):
    """Wraps `channel`: SessionService's unary calls go on the Exchange stream, everything else is the
    channel's own."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel)
        self._open_call = session_pb2_grpc.SessionServiceStub(channel).Exchange
        self._stream: _Exchange | None = None
        self._call_ids = itertools.count(1)
        # How many streams this channel opened: one, unless the replica went away or restarted.
        self.opened_streams = 0

    def unary_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if not method.startswith(_EXCHANGED) or request_serializer is None or response_deserializer is None:
            return self._channel.unary_unary(method, request_serializer, response_deserializer, *args, **kwargs)
        return _UnaryMethod(self, method, request_serializer, response_deserializer)

    async def close(self, grace: float | None = None) -> None:
        if self._stream is not None:
            await self._stream.close()
        await super().close(grace)

    def start(self, start: session_pb2.UnaryStart) -> tuple["_Exchange", int, asyncio.Future]:
        """Send a call on the open stream (opening one if none is); its outcome comes in the future."""
        if self._stream is None or self._stream.ending is not None:
            # Opened outside any request's context: each call sends its own request id and trace.
            # Long-lived, so no deadline: keepalive finds a replica that went away.
            self._stream = _Exchange(contextvars.Context().run(self._open_call))
            self.opened_streams += 1
        call_id = next(self._call_ids)
        return self._stream, call_id, self._stream.send(call_id, start)


class _UnaryMethod:
    """One unary method of the stub: calling it sends a call on the exchange."""

    __slots__ = ("_channel", "_method", "_serialize", "_deserialize")

    def __init__(
        self, channel: ExchangeChannel, method: str, serialize: Callable[[Any], bytes], deserialize: Callable[[bytes], Any]
    ) -> None:
        self._channel = channel
        self._method = method
        self._serialize = serialize
        self._deserialize = deserialize

    def __call__(
        self, request: Any, *, timeout: float | None = None, metadata: Any = None, **kwargs: Any
    ) -> "ExchangedCall":
        sent: list[tuple[str, str | bytes]] = list(metadata or ())
        callcontext.add_outgoing(sent)
        start = session_pb2.UnaryStart(
            method=self._method, request=self._serialize(request), metadata={k: str(v) for k, v in sent}
        )
        return ExchangedCall(self._channel, start, self._deserialize, timeout)


class ExchangedCall:
    """A unary call on the exchange: awaiting it (once) sends it and waits for the reply;
    `trailing_metadata()` is what it ended with."""

    __slots__ = ("_channel", "_start", "_deserialize", "_timeout", "_trailing")

    def __init__(
        self,
        channel: ExchangeChannel,
        start: session_pb2.UnaryStart,
        deserialize: Callable[[bytes], Any],
        timeout: float | None,
    ) -> None:
        self._channel = channel
        self._start = start
        self._deserialize = deserialize
        self._timeout = timeout
        self._trailing: grpc.aio.Metadata = _NO_METADATA

    def __await__(self) -> Generator[Any, None, Any]:
        return self._run().__await__()

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        return self._trailing

    async def _run(self) -> Any:
        if (size := self._start.ByteSize()) > MAX_REQUEST_BYTES:
            raise _error(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the request is {size} bytes, over {MAX_REQUEST_BYTES}")
        try:
            async with asyncio.timeout(self._timeout):
                outcome = await self._send()
                if outcome.not_started:  # refused by a replica shutting down: safe to send once more
                    outcome = await self._send()
        except TimeoutError:
            raise _error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        self._trailing = grpc.aio.Metadata(*outcome.trailing_metadata.items())
        if outcome.code != grpc.StatusCode.OK.value[0]:
            raise _error(_CODES.get(outcome.code, grpc.StatusCode.UNKNOWN), outcome.details, self._trailing)
        return self._deserialize(outcome.reply)

    async def _send(self) -> session_pb2.UnaryOutcome:
        stream, call_id, outcome = self._channel.start(self._start)
        answered = False
        try:
            answer = await outcome
            answered = True
            return answer
        finally:
            stream.forget(call_id, cancel=not answered)


class _Exchange:
    """One open `Exchange` call: a reader task hands each outcome to the call it belongs to."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self._call = call
        self._waiting: dict[int, asyncio.Future[session_pb2.UnaryOutcome]] = {}
        self._writer = StreamWriter(call.write, self._write_failed)
        # The status calls waiting when it ended fail with (it takes no new call then); None while open.
        self.ending: grpc.aio.AioRpcError | None = None
        self._ended = False
        self._reader = asyncio.get_running_loop().create_task(self._read(), context=contextvars.Context())

    def send(self, call_id: int, start: session_pb2.UnaryStart) -> asyncio.Future[session_pb2.UnaryOutcome]:
        outcome: asyncio.Future[session_pb2.UnaryOutcome] = asyncio.get_running_loop().create_future()
        if self.ending is not None:
            outcome.set_exception(self.ending)
            return outcome
        self._waiting[call_id] = outcome
        self._writer.send(session_pb2.UnaryCall(call_id=call_id, start=start))
        return outcome

    def forget(self, call_id: int, *, cancel: bool) -> None:
        """The call's caller stopped waiting; `cancel` tells the replica to stop it too."""
        self._waiting.pop(call_id, None)
        if cancel and not self._ended:
            self._writer.send(session_pb2.UnaryCall(call_id=call_id, cancel=True))

    async def close(self) -> None:
        self._end(_error(grpc.StatusCode.CANCELLED, "the gateway is shutting down"))
        self._call.cancel()
        await self._writer.close()

    async def _read(self) -> None:
        try:
            async for outcome in self._call:
                if outcome.not_started and self.ending is None:
                    # The replica is draining: later calls go on a new stream; the calls it took
                    # are still answered on this one.
                    self.ending = _error(grpc.StatusCode.UNAVAILABLE, outcome.details)
                waiting = self._waiting.pop(outcome.call_id, None)
                if waiting is not None and not waiting.done():  # else its caller stopped waiting
                    waiting.set_result(outcome)
            self._end(_error(grpc.StatusCode.UNAVAILABLE, "the session service ended the exchange stream"))
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                log.warning("the exchange stream broke: %s %s", error.code().name, error.details())
            self._end(error)
        finally:
            self._end(_error(grpc.StatusCode.CANCELLED, "the exchange stream was closed"))
            await self._writer.close()

    def _write_failed(self, exc: Exception) -> None:
        # The reader sees the call's end and its status; writing only stops here.
        log.debug("writing to the exchange stream failed: %s", exc)

    def _end(self, error: grpc.aio.AioRpcError) -> None:
        self._ended = True
        if self.ending is None:
            self.ending = error
        waiting, self._waiting = self._waiting, {}
        for outcome in waiting.values():
            if not outcome.done():
                outcome.set_exception(self.ending)


def _error(
    code: grpc.StatusCode, details: str, trailing: grpc.aio.Metadata = _NO_METADATA
) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, _NO_METADATA, trailing, details)
