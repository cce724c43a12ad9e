"""The calls a gateway sends on its `Calls` stream, each served as a call of its own would be.

A call names its method by the field its typed request is in (session.proto, GatewayCall);
the operation of that name serves it (operations.py) with the caller's request id and trace
context bound, and its last GatewayReply carries what a call of its own would have ended
with. A streaming call sends at most GATEWAY_WINDOW messages ahead of the gateway's credit:
a client that stops reading holds back its own call only, and its turn's watcher falls
behind and is cut off as it would be on a call of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator, Mapping

import grpc

from bae.common.call_tasks import CallTasks, serve_until_done
from bae.common.grpcutil import MAX_CARRIED_BYTES
from bae.common.propagation import bind_incoming
from bae.common.protos import session_pb2
from bae.common.session_routing import REDIRECTED_KEY
from bae.services.session.api.operations import Incoming, Operation, Trailers, ending_of

log = logging.getLogger("bae.session.gateway_calls")

SHUTTING_DOWN = "the session service is shutting down"
GATEWAY_WINDOW = session_pb2.GATEWAY_WINDOW


class GatewayCalls:
    """Serves `Calls` streams; once `drain()` was called (at shutdown) each stream refuses new
    calls and ends when the calls it took are answered."""

    def __init__(self, operations: Mapping[str, Operation]) -> None:
        self._operations = operations
        self._draining = asyncio.Event()

    async def serve(
        self, packs: AsyncIterator[session_pb2.GatewayCalls], context: grpc.aio.ServicerContext
    ) -> None:
        async with CallTasks(context.write, session_pb2.GatewayReplies) as running:
            await serve_until_done(self._read(packs, running), running, self._draining)

    def drain(self) -> None:
        self._draining.set()

    async def _read(self, packs: AsyncIterator[session_pb2.GatewayCalls], running: CallTasks) -> None:
        credits: dict[int, asyncio.Semaphore] = {}
        async for pack in packs:
            for call in pack.calls:
                self._take(call, running, credits)

    def _take(self, call: session_pb2.GatewayCall, running: CallTasks, credits: dict[int, asyncio.Semaphore]) -> None:
        kind = call.WhichOneof("kind")
        call_id = call.call_id
        if kind == "credit":
            if (credit := credits.get(call_id)) is not None:
                for _ in range(min(call.credit, GATEWAY_WINDOW)):
                    credit.release()
        elif kind == "cancel":
            running.cancel(call_id)
        elif kind is None or (operation := self._operations.get(kind)) is None:
            running.send(_failed(call_id, grpc.StatusCode.UNIMPLEMENTED, "the call names no method served here"))
        elif self._draining.is_set():
            reply = _failed(call_id, grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
            reply.not_started = True
            running.send(reply)
        elif call_id in running:
            running.send(_failed(call_id, grpc.StatusCode.ALREADY_EXISTS, f"call {call_id} is running"))
        else:
            credit = credits[call_id] = asyncio.Semaphore(GATEWAY_WINDOW)
            running.start(call_id, self._serve(call, operation, running, credit, credits))

    async def _serve(
        self,
        call: session_pb2.GatewayCall,
        operation: Operation,
        running: CallTasks,
        credit: asyncio.Semaphore,
        credits: dict[int, asyncio.Semaphore],
    ) -> None:
        call_id = call.call_id
        metadata = call.metadata
        bind_incoming(tuple(metadata.items()))
        incoming = Incoming(redirected=REDIRECTED_KEY in metadata)
        request = getattr(call, operation.name)
        try:
            if operation.streaming:
                ending = await self._stream(call_id, operation, request, incoming, running, credit)
            else:
                ending = _reply(call_id, operation, await operation.serve(request, incoming))
            if ending.code == grpc.StatusCode.OK.value[0]:
                ending.trailing_metadata.update(_carried(incoming.trailers))
        except Exception as exc:
            end = ending_of(exc)
            if end is None:
                log.exception("%s failed", operation.method)
                ending = _failed(call_id, grpc.StatusCode.UNKNOWN, "the session service failed the call (see its log)")
            else:
                ending = _failed(call_id, end.code, end.details, end.trailers)
        finally:
            del credits[call_id]
        running.send(ending)

    async def _stream(
        self,
        call_id: int,
        operation: Operation,
        request: object,
        incoming: Incoming,
        running: CallTasks,
        credit: asyncio.Semaphore,
    ) -> session_pb2.GatewayReply:
        messages = operation.serve(request, incoming)
        async with contextlib.aclosing(messages):
            async for message in messages:
                await credit.acquire()
                reply = _reply(call_id, operation, message)
                if reply.code != grpc.StatusCode.OK.value[0]:
                    return reply
                reply.more = True
                running.send(reply)
        return session_pb2.GatewayReply(call_id=call_id)


def _reply(call_id: int, operation: Operation, message: object) -> session_pb2.GatewayReply:
    """`message` in the operation's field, or the call's failure if it is too large to carry (it
    would fail the shared stream, not just this call)."""
    reply = session_pb2.GatewayReply(call_id=call_id)
    getattr(reply, operation.name).CopyFrom(message)
    if (size := reply.ByteSize()) <= MAX_CARRIED_BYTES:
        return reply
    return _failed(
        call_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"a reply of {operation.method} is {size} bytes, over the {MAX_CARRIED_BYTES} a reply may carry",
    )


def _carried(trailers: Trailers) -> dict[str, bytes]:
    """Trailing metadata as the reply carries it: text as UTF-8, a `-bin` value as it is."""
    return {key: value if isinstance(value, bytes) else value.encode() for key, value in trailers}


def _failed(
    call_id: int, code: grpc.StatusCode, details: str, trailers: Trailers | None = None
) -> session_pb2.GatewayReply:
    return session_pb2.GatewayReply(
        call_id=call_id, code=code.value[0], details=details, trailing_metadata=_carried(trailers or [])
    )
