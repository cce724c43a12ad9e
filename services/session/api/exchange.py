"""The calls a gateway sends on its `Exchange` stream, served as calls of their own would be.

Each `ExchangeStart` goes to the same handler its method's call reaches, wrapped as the
server's interceptor wraps it (grpcutil.serve_unary/serve_stream: request id, trace
context, a `Problem` as status and trailer). The handler gets a `CallContext` in place
of gRPC's servicer context, and its last `ExchangeReply` carries what the call would
have ended with. A streaming call sends at most `EXCHANGE_WINDOW` messages ahead of
the gateway's credit: a client that stops reading holds back its own call only, and
its turn's watcher falls behind and is cut off as it would on a call of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, AsyncIterator, Callable, Mapping

import grpc
from google.protobuf.message import DecodeError

from bae.common.call_tasks import CallTasks, serve_until_done
from bae.common.grpcutil import MAX_CARRIED_BYTES, serve_stream, serve_unary
from bae.common.protos import session_pb2

log = logging.getLogger("bae.session.exchange")

SHUTTING_DOWN = "the session service is shutting down"
EXCHANGE_WINDOW = session_pb2.EXCHANGE_WINDOW


class CallContext:
    """What a handler served on the stream has instead of a `grpc.aio.ServicerContext`: the calls
    this service's handlers make on it, with a call's own meaning."""

    __slots__ = ("_metadata", "trailing_metadata", "code", "details")

    def __init__(self, metadata: Mapping[str, str]) -> None:
        self._metadata = tuple(metadata.items())
        self.trailing_metadata: tuple[tuple[str, str | bytes], ...] = ()
        self.code = grpc.StatusCode.OK
        self.details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        self.trailing_metadata = metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.code, self.details = code, details
        raise grpc.aio.AbortError()


def call_handlers(add_to_server: Callable[[Any, Any], None], servicer: object) -> dict[str, grpc.RpcMethodHandler]:
    """The unary and server-streaming handlers a generated `add_…Servicer_to_server` registers,
    by full method name."""
    table: dict[str, grpc.RpcMethodHandler] = {}

    class Recorder:
        def add_generic_rpc_handlers(self, handlers: object) -> None:
            pass

        def add_registered_method_handlers(self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]) -> None:
            for name, handler in handlers.items():
                if handler.unary_unary is not None or handler.unary_stream is not None:
                    table[f"/{service}/{name}"] = handler

    add_to_server(servicer, Recorder())
    return table


class Exchange:
    """Serves `Exchange` streams; `drain` (at shutdown) makes each end once its calls are answered."""

    def __init__(self, handlers: Mapping[str, grpc.RpcMethodHandler]) -> None:
        self._handlers = handlers
        self._draining = asyncio.Event()

    async def serve(self, packs: AsyncIterator[session_pb2.ExchangeCalls], context: grpc.aio.ServicerContext) -> None:
        async with CallTasks(context.write, session_pb2.ExchangeReplies) as running:
            await serve_until_done(self._read(packs, running), running, self._draining)

    async def drain(self, budget: float) -> None:
        self._draining.set()

    async def _read(self, packs: AsyncIterator[session_pb2.ExchangeCalls], running: CallTasks) -> None:
        credits: dict[int, asyncio.Semaphore] = {}
        async for pack in packs:
            for call in pack.calls:
                self._take(call, running, credits)

    def _take(
        self, call: session_pb2.ExchangeCall, running: CallTasks, credits: dict[int, asyncio.Semaphore]
    ) -> None:
        kind = call.WhichOneof("kind")
        if kind == "credit":
            if (credit := credits.get(call.call_id)) is not None:
                for _ in range(min(call.credit, EXCHANGE_WINDOW)):
                    credit.release()
        elif kind == "cancel":
            running.cancel(call.call_id)
        elif kind != "start":
            return
        elif self._draining.is_set():
            running.send(session_pb2.ExchangeReply(
                call_id=call.call_id, code=grpc.StatusCode.UNAVAILABLE.value[0], details=SHUTTING_DOWN,
                not_started=True,
            ))
        elif call.call_id in running:
            running.send(_failed(call.call_id, grpc.StatusCode.ALREADY_EXISTS, f"call {call.call_id} is running"))
        else:
            credits[call.call_id] = asyncio.Semaphore(EXCHANGE_WINDOW)
            running.start(call.call_id, self._serve(call.call_id, call.start, running, credits))

    async def _serve(
        self, call_id: int, start: session_pb2.ExchangeStart, running: CallTasks, credits: dict[int, asyncio.Semaphore]
    ) -> None:
        try:
            await self._answer(call_id, start, running, credits[call_id])
        finally:
            del credits[call_id]

    async def _answer(
        self, call_id: int, start: session_pb2.ExchangeStart, running: CallTasks, credit: asyncio.Semaphore
    ) -> None:
        handler = self._handlers.get(start.method)
        if handler is None:
            running.send(_failed(call_id, grpc.StatusCode.UNIMPLEMENTED, f"no method {start.method!r} on the exchange"))
            return
        context = CallContext(start.metadata)
        metadata = context.invocation_metadata()
        try:
            request = handler.request_deserializer(start.request)
            if handler.unary_unary is not None:
                payload = handler.response_serializer(await serve_unary(handler.unary_unary, request, context, metadata))
                ending = _reply_or_oversized(call_id, start.method, payload)
            else:
                messages = serve_stream(handler.unary_stream, request, context, metadata)
                async with contextlib.aclosing(messages):
                    async for message in messages:
                        await credit.acquire()
                        payload = handler.response_serializer(message)
                        if len(payload) > MAX_CARRIED_BYTES:
                            ending = _reply_or_oversized(call_id, start.method, payload)
                            break
                        running.send(session_pb2.ExchangeReply(call_id=call_id, more=True, message=payload))
                    else:
                        ending = session_pb2.ExchangeReply(call_id=call_id)
            if ending.code == grpc.StatusCode.OK.value[0]:
                ending.trailing_metadata.update(_carried(context.trailing_metadata))
        except grpc.aio.AbortError:
            ending = _failed(call_id, context.code, context.details, context.trailing_metadata)
        except DecodeError:
            ending = _failed(call_id, grpc.StatusCode.INTERNAL, f"the request of {start.method} does not parse")
        except Exception:
            log.exception("%s failed", start.method)
            ending = _failed(call_id, grpc.StatusCode.UNKNOWN, "the session service failed the call (see its log)")
        running.send(ending)


def _reply_or_oversized(call_id: int, method: str, payload: bytes) -> session_pb2.ExchangeReply:
    """The call's end with `payload`, or its failure if that is too large to carry (it would fail
    the shared stream, not just this call)."""
    if len(payload) <= MAX_CARRIED_BYTES:
        return session_pb2.ExchangeReply(call_id=call_id, message=payload)
    return _failed(
        call_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"a reply of {method} is {len(payload)} bytes, over the {MAX_CARRIED_BYTES} a reply may carry",
    )


def _carried(metadata: tuple[tuple[str, str | bytes], ...]) -> dict[str, bytes]:
    """Trailing metadata as the reply carries it: text as UTF-8, a `-bin` value as it is."""
    return {key: value if isinstance(value, bytes) else value.encode() for key, value in metadata}


def _failed(
    call_id: int, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str | bytes], ...] = ()
) -> session_pb2.ExchangeReply:
    return session_pb2.ExchangeReply(
        call_id=call_id, code=code.value[0], details=details, trailing_metadata=_carried(trailing)
    )
