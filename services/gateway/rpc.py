"""POST /api/v1/sessions/{id}/rpc: JSON-RPC 2.0 in, NDJSON frames out (SERVER-SPEC §6).

Authentication always comes first: an envelope error is only written after
CheckSessionKey passed, and a method call only opens the 200 stream after
the session service accepted it (first `accepted` frame, or a unary reply).
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from bae.errors import internal
from bae.protos import session_pb2
from services.gateway import http
from services.gateway.envelope import (
    STREAMING_METHODS,
    UNARY_METHODS,
    Call,
    Rejected,
    parse_envelope,
)
from services.gateway.frames import event_frame, internal_error_frame, result_frame, rpc_error_frame
from services.gateway.http import NDJSON, Request, Send
from services.gateway.upstream import Upstream

log = logging.getLogger("bae.gateway")

SUBSCRIBE = "session.subscribe"


class LiveStream:
    """A streaming call in flight, and why the gateway ended it (if it did)."""

    __slots__ = ("call", "ended_by")

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        self.call = call
        self.ended_by: str | None = None

    def end(self, reason: str) -> None:
        if self.ended_by is None:
            self.ended_by = reason
            self.call.cancel()


class RpcEndpoint:
    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.subscriptions: set[LiveStream] = set()

    def end_subscriptions(self) -> None:
        """On shutdown: observers' streams never end by themselves, so end them (clean tail)."""
        for stream in list(self.subscriptions):
            stream.end("shutdown")

    async def __call__(self, request: Request, send: Send) -> None:
        authorization = request.header(b"authorization")
        body = await request.body()
        envelope = parse_envelope(body)
        rpc_request = session_pb2.RpcRequest(
            authorization=authorization or "",
            has_authorization=authorization is not None,
            session_id=request.path_id,
            params_json=envelope.params_json if isinstance(envelope, Call) else "{}",
        )
        if isinstance(envelope, Rejected):
            await self._reject(rpc_request, envelope, send)
        elif envelope.method in STREAMING_METHODS:
            await self._stream(STREAMING_METHODS[envelope.method], rpc_request, envelope, request, send)
        else:
            await self._unary(rpc_request, envelope, send)

    async def _reject(self, rpc_request: session_pb2.RpcRequest, rejected: Rejected, send: Send) -> None:
        try:
            await self.upstream.stub.CheckSessionKey(rpc_request, timeout=self.upstream.timeout)
        except grpc.aio.AioRpcError as error:
            await http.respond_problem(send, self.upstream.failure(error))
            return
        await http.respond(send, 200, rejected.frame, NDJSON)

    async def _unary(self, rpc_request: session_pb2.RpcRequest, call: Call, send: Send) -> None:
        method = getattr(self.upstream.stub, UNARY_METHODS[call.method])
        try:
            reply = await method(rpc_request, timeout=self.upstream.timeout)
        except grpc.aio.AioRpcError as error:
            await http.respond_problem(send, self.upstream.failure(error))
            return
        if reply.WhichOneof("kind") == "error":
            frame = rpc_error_frame(call.id_json, reply.error)
        elif call.id_json is not None:
            frame = result_frame(call.id_json, reply.result_json)
        else:
            frame = None
        await http.respond(send, 200, frame or b"", NDJSON)

    async def _stream(
        self,
        rpc_name: str,
        rpc_request: session_pb2.RpcRequest,
        call: Call,
        request: Request,
        send: Send,
    ) -> None:
        # Live calls carry no deadline: a turn or a subscription lasts as long as it lasts.
        grpc_call = getattr(self.upstream.stub, rpc_name)(rpc_request)
        try:
            first = await grpc_call.read()
        except grpc.aio.AioRpcError as error:
            await http.respond_problem(send, self.upstream.failure(error))
            return
        except BaseException:
            grpc_call.cancel()
            raise
        if first is grpc.aio.EOF:
            log.error("session service ended %s before accepting it", rpc_name)
            await http.respond_problem(send, internal())
            return

        # Accepted: open the 200 stream now; frames follow as they arrive.
        await http.start(send, 200, NDJSON)
        stream = LiveStream(grpc_call)
        watcher = asyncio.create_task(request.disconnected())
        # The client went away: stop reading (the session service keeps the turn running).
        watcher.add_done_callback(lambda task: task.cancelled() or stream.end("disconnect"))
        if call.method == SUBSCRIBE:
            self.subscriptions.add(stream)
        try:
            if first.WhichOneof("kind") != "accepted":
                await self._write(send, first, call.id_json)
            while (frame := await grpc_call.read()) is not grpc.aio.EOF:
                await self._write(send, frame, call.id_json)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if stream.ended_by is None or (task is not None and task.cancelling()):
                raise
        except grpc.aio.AioRpcError as error:
            if stream.ended_by is None:
                log.warning("%s stream failed: %s %s", rpc_name, error.code().name, error.details())
                if call.id_json is not None:
                    await http.write(send, internal_error_frame(call.id_json))
        finally:
            watcher.cancel()
            self.subscriptions.discard(stream)
            grpc_call.cancel()
        await http.finish(send)

    @staticmethod
    async def _write(send: Send, frame: session_pb2.RpcFrame, id_json: str | None) -> None:
        kind = frame.WhichOneof("kind")
        if kind == "event_json":
            chunk = event_frame(frame.event_json)
        elif kind == "result_json":
            chunk = None if id_json is None else result_frame(id_json, frame.result_json)
        elif kind == "error":
            chunk = rpc_error_frame(id_json, frame.error)
        else:
            chunk = None
        if chunk:
            await http.write(send, chunk)
