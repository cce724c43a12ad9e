"""POST /api/v1/sessions/{id}/rpc: JSON-RPC 2.0 in, NDJSON frames out (SERVER-SPEC §6).

One endpoint serves every method the declaration names (services/gateway/declaration.py): the
params are read into the method's typed request (or the text of why they did not fit travels
with it, for the method to answer at its place). Authentication always comes first: an envelope
error is only written after the session key was checked, and a method call only opens the 200
stream after the session service accepted it (first `accepted` frame, or a unary reply).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable

import grpc
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from google.protobuf.message import Message

from bae.common import telemetry
from bae.common.errors import BaeError, Internal
from bae.common.protos import client_api_pb2, edge_pb2, session_pb2, session_pb2_grpc
from services.gateway.body import BodyReader
from services.gateway.envelope import Call, Rejected, parse_envelope
from services.gateway.fanout import Ending, Fanout, Observer
from services.gateway.frames import LAGGED_FRAME, NDJSON, StreamLines, internal_error_frame, reply_frame
from services.gateway.json_to_proto import read_params
from services.gateway.observe import link_session_span
from services.gateway.problems import error_response
from services.gateway.upstream import Metadata, Upstream, credential_of

log = logging.getLogger("bae.gateway")

SUBSCRIBE = "session.subscribe"
REGISTER_DRIVER = "session.registerDriver"
SESSION_KEY = edge_pb2.SESSION_KEY


class LiveStream(StreamingResponse):
    """A streaming call the session service accepted, answered as a 200 NDJSON stream.

    Headers go out at once and each frame as it arrives. StreamingResponse also
    listens for the client going away (uvicorn's HTTP protocols speak ASGI 2.3)
    and then cancels the frame loop; however the response ends, the call ends too.
    """

    media_type = NDJSON

    def __init__(
        self,
        rpc_name: str,
        grpc_call: grpc.aio.UnaryStreamCall,
        first: Message,
        request_id_json: str | None,
    ) -> None:
        self.grpc_call = grpc_call
        super().__init__(self._frames(rpc_name, first, request_id_json))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Only the reading stops: the session service keeps a turn running without its client.
            self.grpc_call.cancel()

    async def _frames(self, rpc_name: str, first: Message, request_id_json: str | None) -> AsyncIterator[bytes]:
        frame = first
        lines = StreamLines(request_id_json)
        try:
            while frame is not grpc.aio.EOF:
                if line := lines.frame(frame):
                    yield line
                frame = await self.grpc_call.read()
            if closing := lines.end():
                yield closing.encode()
        except grpc.aio.AioRpcError as error:
            log.warning("%s stream failed: %s %s", rpc_name, error.code().name, error.details())
            if cut := lines.broken():
                yield cut
            if request_id_json is not None:
                yield internal_error_frame(request_id_json)


class ObserverStream(StreamingResponse):
    """A `session.subscribe` stream: the replay from its own call, then its share of the session's
    relay (services/gateway/fanout.py). It never ends by itself while the session is live."""

    media_type = NDJSON

    def __init__(
        self,
        replay_call: grpc.aio.UnaryStreamCall,
        observer: Observer | None,
        leave: Callable[[], None],
        request_id_json: str | None,
        registry: set[ObserverStream],
    ) -> None:
        self.replay_call = replay_call
        self.observer = observer
        self.leave = leave
        self.registry = registry
        self.ended_by_gateway = False
        super().__init__(self._frames(request_id_json))

    def end(self) -> None:
        """Stop; the response ends cleanly, without a terminal frame."""
        self.ended_by_gateway = True
        self.replay_call.cancel()
        if self.observer is not None:
            self.observer.finish(Ending.CLEAN)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.registry.add(self)
        try:
            # Starlette ends the response when the client leaves (uvicorn speaks ASGI 2.3), idle or not:
            # the replay call, which the replica counts against max_subscribers_per_session, ends then.
            await super().__call__(scope, receive, send)
        finally:
            self.registry.discard(self)
            self.replay_call.cancel()
            self.leave()

    async def _frames(self, request_id_json: str | None) -> AsyncIterator[bytes]:
        observer = self.observer
        replayed: set[str] = set()
        replay = StreamLines(request_id_json)
        try:
            while (frame := await self.replay_call.read()) is not grpc.aio.EOF:
                kind = frame.WhichOneof("kind")
                if kind == "observer":
                    if observer is not None:
                        observer.admit(frame.observer)
                    continue
                if kind == "replayed":
                    # The call stays open (counted by the replica) until this stream ends.
                    break
                replayed.update(event.id for event in frame.events.events)
                if line := replay.frame(frame):
                    yield line
                if kind == "error":  # the replay failed: the stream ends with it
                    return
        except asyncio.CancelledError:
            # The cancelled call raises this too; only a cancelled task goes on cancelling.
            task = asyncio.current_task()
            if not self.ended_by_gateway or (task is not None and task.cancelling()):
                raise
            return
        except grpc.aio.AioRpcError as error:
            if not self.ended_by_gateway:
                log.warning("Subscribe stream failed: %s %s", error.code().name, error.details())
                if cut := replay.broken():
                    yield cut
                if request_id_json is not None:
                    yield internal_error_frame(request_id_json)
            return
        if observer is None:
            return  # not open: the replay was all (O-8)
        async for lines in observer.lines(replayed):
            yield lines
        if observer.ending is Ending.LAGGED:
            yield LAGGED_FRAME
        elif observer.ending is Ending.FAILED and request_id_json is not None:
            yield internal_error_frame(request_id_json)


class RpcEndpoint:
    def __init__(self, upstream: Upstream, bodies: BodyReader) -> None:
        self.upstream = upstream
        self.bodies = bodies
        self.fanout = Fanout(upstream)
        self.subscriptions: set[ObserverStream] = set()

    def end_subscriptions(self) -> None:
        """On shutdown: observers' streams never end by themselves, so end them (clean tail)."""
        for stream in list(self.subscriptions):
            stream.end()

    async def __call__(self, request: Request) -> Response:
        session_id = request.path_params["id"]
        try:
            body = await self.bodies.read(request, SESSION_KEY, session_id)
        except BaeError as error:
            return error_response(error)
        envelope = parse_envelope(body)
        if isinstance(envelope, Rejected):
            return await self._reject(request, session_id, envelope)
        method = envelope.method
        # The method's own request type (client_api.proto): every one has these four fields.
        rpc_request: Any = method.request()
        rpc_request.credential.CopyFrom(credential_of(request))
        rpc_request.session_id = session_id
        rpc_request.invalid_params = read_params(rpc_request.params, envelope.params)
        if method.name == SUBSCRIBE:
            return await self._subscribe(rpc_request, envelope)
        if method.streaming:
            return await self._stream(method.rpc, rpc_request, envelope)
        return await self._unary(rpc_request, envelope)

    async def _reject(self, request: Request, session_id: str, rejected: Rejected) -> Response:
        try:
            await self.bodies.check(request, SESSION_KEY, session_id)
        except BaeError as error:
            return error_response(error)
        return Response(rejected.frame, media_type=NDJSON)

    async def _subscribe(self, rpc_request: client_api_pb2.SubscribeRequest, call: Call) -> Response:
        """Authenticate, join the session's relay, then ask for the replay: every event published
        after the observer's position is queued for it by then (§6.4: subscribe first, then replay)."""
        session_id = rpc_request.session_id
        check = session_pb2.CredentialCheck(kind=SESSION_KEY, credential=rpc_request.credential, session_id=session_id)
        timeout = self.upstream.timeout
        try:
            # A relay is opened for an authenticated observer only.
            await self.upstream.call(
                session_id, lambda stub, metadata: stub.CheckCredential(check, timeout=timeout, metadata=metadata)
            )
            observer = await self.fanout.join(session_id)
        except grpc.aio.AioRpcError as error:
            return error_response(self.upstream.failure(error))

        def leave() -> None:
            if observer is not None:
                self.fanout.leave(session_id, observer)

        try:
            opened = await self._open(call.method.rpc, rpc_request)
        except BaseException:
            leave()
            raise
        if isinstance(opened, Response):
            leave()
            return opened
        replay_call, _accepted = opened
        return ObserverStream(replay_call, observer, leave, call.id_json, self.subscriptions)

    async def _unary(self, rpc_request: Message, call: Call) -> Response:
        method = call.method
        timeout = None if method.unbounded else self.upstream.timeout

        async def invoke(stub: session_pb2_grpc.SessionServiceStub, metadata: Metadata) -> tuple[Any, Any]:
            grpc_call = getattr(stub, method.rpc)(rpc_request, timeout=timeout, metadata=metadata)
            return grpc_call, await grpc_call

        try:
            grpc_call, reply = await self.upstream.call(rpc_request.session_id, invoke)  # type: ignore[attr-defined]
        except grpc.aio.AioRpcError as error:
            return error_response(self.upstream.failure(error))
        if telemetry.tracer is not None and method.name == REGISTER_DRIVER:
            await link_session_span(grpc_call)
        return Response(reply_frame(reply, call.id_json), media_type=NDJSON)

    async def _stream(self, rpc_name: str, rpc_request: Message, call: Call) -> Response:
        opened = await self._open(rpc_name, rpc_request)
        if isinstance(opened, Response):
            return opened
        return LiveStream(rpc_name, *opened, call.id_json)

    async def _open(self, rpc_name: str, rpc_request: Message) -> tuple[grpc.aio.UnaryStreamCall, Message] | Response:
        """A live call the session service accepted and its first frame, or the problem response
        for its refusal."""
        session_id = rpc_request.session_id  # type: ignore[attr-defined]
        try:
            grpc_call, first = await self.upstream.open_stream(session_id, rpc_name, rpc_request)
        except grpc.aio.AioRpcError as error:
            return error_response(self.upstream.failure(error))
        if not isinstance(first, Message):  # EOF
            log.error("session service ended %s before accepting it", rpc_name)
            return error_response(Internal("internal server error"))
        return grpc_call, first
