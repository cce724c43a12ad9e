"""POST /api/v1/sessions/{id}/rpc: JSON-RPC 2.0 in, NDJSON frames out (SERVER-SPEC §6).

One endpoint serves every method the declaration names (bae/services/gateway/declaration.py): the
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
from bae.services.gateway.body import BodyReader
from bae.services.gateway.envelope import Call, Rejected, parse_envelope
from bae.services.gateway.fanout import Ending, Fanout, Observer, ReplayedCalls
from bae.services.gateway.frames import (
    LAGGED_FRAME,
    NDJSON,
    NDJSON_WIRE,
    StreamLines,
    Wire,
    internal_error_frame,
    reply_frame,
)
from bae.services.gateway.json_to_proto import read_params
from bae.services.gateway.observe import link_session_span, note_rpc_method
from bae.services.gateway.problems import error_response
from bae.services.gateway.upstream import Metadata, Upstream, credential_of

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
        session_id: str,
        inner: str = "",
    ) -> None:
        self.grpc_call = grpc_call
        self.inner = inner  # the field of each message that holds the frame (a trigger's `turn`); "": the message
        super().__init__(self._frames(rpc_name, first, request_id_json, session_id))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Only the reading stops: the session service keeps a turn running without its client.
            self.grpc_call.cancel()

    async def _frames(
        self, rpc_name: str, first: Message, request_id_json: str | None, session_id: str
    ) -> AsyncIterator[bytes]:
        frame = first
        lines = StreamLines(request_id_json, session_id)
        try:
            while frame is not grpc.aio.EOF:
                if line := lines.frame(getattr(frame, self.inner) if self.inner else frame):
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


# A Server-Sent Events stream says it is alive this often (a comment line) while nothing else comes.
SSE_KEEPALIVE = 15.0


class ObserverStream(StreamingResponse):
    """A `session.subscribe` stream: the replay from its own call, then its share of the session's
    relay (bae/services/gateway/fanout.py). It never ends by itself while the session is live.

    Written as NDJSON lines, or as Server-Sent Events (the events stream route, `wire`), which end
    without an error line when the stream fails or lags: the client reconnects with Last-Event-ID."""

    def __init__(
        self,
        replay_call: grpc.aio.UnaryStreamCall,
        first: Message | None,  # the replay call's frame after `accepted`, when already read
        observer: Observer | None,
        leave: Callable[[], None],
        request_id_json: str | None,
        registry: set[ObserverStream],
        *,
        session_id: str,
        wire: Wire = NDJSON_WIRE,
    ) -> None:
        self.replay_call = replay_call
        self.observer = observer
        self.leave = leave
        self.registry = registry
        self.ended_by_gateway = False
        self.wire = wire
        headers = {"cache-control": "no-cache", "x-accel-buffering": "no"} if wire.sse else None
        lines = StreamLines(request_id_json, session_id, wire)
        super().__init__(self._frames(first, lines), media_type=wire.media_type, headers=headers)

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

    async def _frames(self, first: Message | None, replay: StreamLines) -> AsyncIterator[bytes]:
        observer = self.observer
        replayed: set[str] = set()
        # The calls the replay showed over: their deltas, caught up or live, are stale.
        calls = ReplayedCalls()
        error_lines = not self.wire.sse and replay.request_id_json is not None
        try:
            frame: Any = first if first is not None else await self.replay_call.read()
            while frame is not grpc.aio.EOF:
                kind = frame.WhichOneof("kind")
                if kind == "observer":
                    if observer is not None:
                        observer.admit(frame.observer)
                elif kind == "replayed":
                    # The call stays open (counted by the replica) until this stream ends.
                    break
                elif kind == "deltas":  # the catch-up of the call streaming when the observer joined
                    deltas = [delta for delta in frame.deltas.deltas if not calls.over(delta.request_event_id)]
                    if lines := replay.end().encode() + replay.deltas(deltas):
                        yield lines
                else:
                    for event in frame.events.events:
                        replayed.add(event.id)
                        calls.saw(event)
                    if kind == "error" and self.wire.sse:
                        return  # the replay failed: the stream ends, for the client to reconnect
                    if line := replay.frame(frame):
                        yield line
                    if kind == "error":  # the replay failed: the stream ends with it
                        return
                frame = await self.replay_call.read()
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
                if error_lines:
                    yield internal_error_frame(replay.request_id_json or "null")
            return
        if observer is None:
            return  # not open: the replay was all (O-8)
        keepalive = SSE_KEEPALIVE if self.wire.sse else None
        async for lines in observer.lines(replayed, calls, keepalive=keepalive):
            yield lines
        if observer.ending is Ending.LAGGED and not self.wire.sse:
            yield LAGGED_FRAME
        elif observer.ending is Ending.FAILED and error_lines:
            yield internal_error_frame(replay.request_id_json or "null")


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
            note_rpc_method(request.scope, envelope.logged_as)
            return await self._reject(request, session_id, envelope)
        method = envelope.method
        note_rpc_method(request.scope, method.name)
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
        opened = await self.observe(
            "Subscribe", rpc_request, session_pb2.CredentialCheck(kind=SESSION_KEY, credential=rpc_request.credential),
            deltas=rpc_request.params.deltas, wire=NDJSON_WIRE, request_id_json=call.id_json,
        )
        return opened

    async def check(self, check: session_pb2.CredentialCheck) -> Response | None:
        """The problem response of a credential the session service refuses; None when it passes."""
        timeout = self.upstream.timeout
        try:
            await self.upstream.call(
                check.session_id, lambda stub, metadata: stub.CheckCredential(check, timeout=timeout, metadata=metadata)
            )
        except grpc.aio.AioRpcError as error:
            return error_response(self.upstream.failure(error))
        return None

    async def observe(
        self,
        rpc_name: str,
        rpc_request: Message,
        check: session_pb2.CredentialCheck,
        *,
        deltas: bool,
        wire: Wire,
        request_id_json: str | None,
        refusal: Callable[[client_api_pb2.RpcError], Response] | None = None,
    ) -> ObserverStream | Response:
        """Authenticate, join the session's relay, then ask for the replay: every event published
        after the observer's position is queued for it by then (§6.4: subscribe first, then replay).
        The stream, or the problem response of a refusal. The replay call's first frame after
        `accepted` is read before the response starts: the session service sends it once it has
        fixed the observer's position, so the response's headers tell the client that every event
        recorded from then on reaches it (a client may send its first message as soon as they
        arrive). An error there (a quota) is answered as `refusal` makes it (the events stream's
        HTTP status); without `refusal`, that error is the stream's line."""
        session_id = rpc_request.session_id  # type: ignore[attr-defined]
        check.session_id = session_id
        # A relay is opened for an authenticated observer only.
        if (refused := await self.check(check)) is not None:
            return refused
        try:
            observer = await self.fanout.join(session_id, wire=wire, deltas=deltas)
        except grpc.aio.AioRpcError as error:
            return error_response(self.upstream.failure(error))

        def leave() -> None:
            if observer is not None:
                self.fanout.leave(session_id, observer)

        try:
            opened = await self._open(rpc_name, rpc_request)
            if isinstance(opened, Response):
                leave()
                return opened
            replay_call, _accepted = opened
            first = await replay_call.read()
        except grpc.aio.AioRpcError as error:
            leave()
            return error_response(self.upstream.failure(error))
        except BaseException:
            leave()
            raise
        if refusal is not None and isinstance(first, Message) and first.WhichOneof("kind") == "error":
            leave()
            replay_call.cancel()
            return refusal(first.error)  # type: ignore[attr-defined]
        return ObserverStream(
            replay_call, first, observer, leave, request_id_json, self.subscriptions, session_id=session_id, wire=wire
        )

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
        return LiveStream(rpc_name, *opened, call.id_json, rpc_request.session_id)  # type: ignore[attr-defined]

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
