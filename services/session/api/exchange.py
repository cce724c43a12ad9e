"""The unary calls a gateway sends on its `Exchange` stream, served as calls of their own would be.

Each `UnaryStart` goes to the same handler its method's call reaches, wrapped as the
server's interceptor wraps it (grpcutil.serve_unary: request id, trace context, a
`Problem` as status and trailer). The handler gets a `CallContext` in place of gRPC's
servicer context, and its `UnaryOutcome` carries what the call would have ended with.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable, Mapping

import grpc
from google.protobuf.message import DecodeError

from bae.call_tasks import CallTasks, serve_until_done
from bae.grpcutil import MAX_MESSAGE_BYTES, serve_unary
from bae.protos import session_pb2

log = logging.getLogger("bae.session.exchange")

SHUTTING_DOWN = "the session service is shutting down"
# An outcome larger than a message may be would fail the shared stream, not just its call.
MAX_OUTCOME_BYTES = MAX_MESSAGE_BYTES - 64 * 1024


class CallContext:
    """What a handler served on the stream has instead of a `grpc.aio.ServicerContext`: the calls
    this service's handlers make on it, with a call's own meaning."""

    __slots__ = ("_metadata", "trailing_metadata", "code", "details")

    def __init__(self, metadata: Mapping[str, str]) -> None:
        self._metadata = tuple(metadata.items())
        self.trailing_metadata: tuple[tuple[str, str], ...] = ()
        self.code = grpc.StatusCode.OK
        self.details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing_metadata = metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.code, self.details = code, details
        raise grpc.aio.AbortError()


def unary_handlers(add_to_server: Callable[[Any, Any], None], servicer: object) -> dict[str, grpc.RpcMethodHandler]:
    """The unary method handlers a generated `add_…Servicer_to_server` registers, by full method name."""
    table: dict[str, grpc.RpcMethodHandler] = {}

    class Recorder:
        def add_generic_rpc_handlers(self, handlers: object) -> None:
            pass

        def add_registered_method_handlers(self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]) -> None:
            for name, handler in handlers.items():
                if handler.unary_unary is not None:
                    table[f"/{service}/{name}"] = handler

    add_to_server(servicer, Recorder())
    return table


class UnaryExchange:
    """Serves `Exchange` streams; `drain` (at shutdown) makes each end once its calls are answered."""

    def __init__(self, handlers: Mapping[str, grpc.RpcMethodHandler]) -> None:
        self._handlers = handlers
        self._draining = asyncio.Event()

    async def serve(self, calls: AsyncIterator[session_pb2.UnaryCall], context: grpc.aio.ServicerContext) -> None:
        async with CallTasks(context.write) as running:
            await serve_until_done(self._read(calls, running), running, self._draining)

    async def drain(self, budget: float) -> None:
        self._draining.set()

    async def _read(self, calls: AsyncIterator[session_pb2.UnaryCall], running: CallTasks) -> None:
        async for call in calls:
            kind = call.WhichOneof("kind")
            if kind == "cancel":
                running.cancel(call.call_id)
            elif kind != "start":
                continue
            elif self._draining.is_set():
                running.send(session_pb2.UnaryOutcome(
                    call_id=call.call_id, code=grpc.StatusCode.UNAVAILABLE.value[0], details=SHUTTING_DOWN,
                    not_started=True,
                ))
            elif call.call_id in running:
                running.send(_failed(call.call_id, grpc.StatusCode.ALREADY_EXISTS, f"call {call.call_id} is running"))
            else:
                running.start(call.call_id, self._serve(call.call_id, call.start, running))

    async def _serve(self, call_id: int, start: session_pb2.UnaryStart, running: CallTasks) -> None:
        handler = self._handlers.get(start.method)
        if handler is None:
            running.send(_failed(call_id, grpc.StatusCode.UNIMPLEMENTED, f"no unary method {start.method!r}"))
            return
        context = CallContext(start.metadata)
        try:
            request = handler.request_deserializer(start.request)
            reply = await serve_unary(handler.unary_unary, request, context, context.invocation_metadata())
            outcome = session_pb2.UnaryOutcome(
                call_id=call_id, reply=handler.response_serializer(reply),
                trailing_metadata=dict(context.trailing_metadata),
            )
        except grpc.aio.AbortError:
            outcome = _failed(call_id, context.code, context.details, context.trailing_metadata)
        except DecodeError:
            outcome = _failed(call_id, grpc.StatusCode.INTERNAL, f"the request of {start.method} does not parse")
        except Exception:
            log.exception("%s failed", start.method)
            outcome = _failed(call_id, grpc.StatusCode.UNKNOWN, "the session service failed the call (see its log)")
        if (size := outcome.ByteSize()) > MAX_OUTCOME_BYTES:
            outcome = _failed(
                call_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the reply of {start.method} is {size} bytes, over the {MAX_OUTCOME_BYTES} a reply may carry",
            )
        running.send(outcome)


def _failed(
    call_id: int, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...] = ()
) -> session_pb2.UnaryOutcome:
    return session_pb2.UnaryOutcome(
        call_id=call_id, code=code.value[0], details=details, trailing_metadata=dict(trailing)
    )
