"""One endpoint for every REST route the declaration names (bae/services/gateway/declaration.py).

Each request becomes its route's typed request: the credential as it came, the `{id}` segment,
the query fields as given, and the JSON body read into its field. A body that does not read is a
400 with the translator's text, answered after the credential was checked (authentication always
comes first). The reply is written as JSON with the route's status.

A page of events comes as a stream (session.proto, ListEvents): the page, then, when its last
item is large, the rest of that item's payload in pieces, which are written out as they come
(never joined here), each read within the call's deadline.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Callable, TypeAlias

import grpc
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from bae.common.errors import BaeError, Internal, InvalidInput
from bae.common.jsontext import dump
from bae.common.protos import session_pb2_grpc
from bae.services.gateway.body import BodyReader
from bae.services.gateway.declaration import Route
from bae.services.gateway.json_to_proto import JSON_VALUE, Unreadable, read_body, read_json_value
from bae.services.gateway.ndjson import ndjson_endpoint
from bae.services.gateway.problems import JSON, error_response
from bae.services.gateway.proto_to_json import writer_of
from bae.services.gateway.router import Endpoint
from bae.services.gateway.rpc import LiveStream
from bae.services.gateway.upstream import Metadata, Upstream, credential_of

log = logging.getLogger("bae.gateway")

# Where the last item of a page ends, after its payload (an event's last key).
_CREATED_AT = ',"created_at":'


class RestEndpoint:
    """Builds the endpoint of each route: it makes the route's one SessionService call."""

    def __init__(self, upstream: Upstream, bodies: BodyReader) -> None:
        self.upstream = upstream
        self.bodies = bodies

    def __call__(self, route: Route) -> Endpoint:
        upstream = self.upstream
        if route.ndjson:
            return ndjson_endpoint(route, upstream, self.bodies)
        if route.wait_field:
            return self._answer_or_turn(route)
        write = writer_of(route.reply.DESCRIPTOR)

        async def handle(request: Request) -> Response:
            try:
                message = await self._request(route, request)
            except BaeError as error:
                return error_response(error)
            session_id = getattr(message, route.id_field) if route.session_scoped else None
            timeout = upstream.timeout
            if route.streaming:
                return await self._page(route, message, session_id, write)

            async def invoke(stub: session_pb2_grpc.SessionServiceStub, metadata: Metadata) -> Message:
                reply: Message = await getattr(stub, route.rpc)(message, timeout=timeout, metadata=metadata)
                return reply

            try:
                reply = await upstream.call(session_id, invoke)
            except grpc.aio.AioRpcError as error:
                return error_response(upstream.failure(error))
            if route.status == 204:
                return Response(status_code=204)
            return Response(write(reply), route.status, media_type=JSON)

        return handle

    def _answer_or_turn(self, route: Route) -> Endpoint:
        """A route that answers JSON, or with `?<wait_field>=true` streams the turn it started as
        session.sendMessage's NDJSON (edge.proto, HttpRoute.wait_field)."""
        upstream = self.upstream
        answer_field = route.reply.DESCRIPTOR.fields_by_name["answer"]
        write = writer_of(answer_field.message_type)

        async def handle(request: Request) -> Response:
            try:
                message = await self._request(route, request)
            except BaeError as error:
                return error_response(error)
            waits = getattr(message, route.wait_field) == "true"
            timeout = upstream.timeout

            # The answer (and, waiting, the turn's first frame) within the call's deadline, as a
            # unary route's reply; the turn's frames after them take as long as the turn does.
            async def invoke(stub: session_pb2_grpc.SessionServiceStub, metadata: Metadata) -> tuple[Call, Read, Read]:
                call = getattr(stub, route.rpc)(message, metadata=metadata)
                try:
                    first = await _read(call, timeout)
                    return call, first, await _read(call, timeout) if waits and isinstance(first, Message) else grpc.aio.EOF
                except BaseException:
                    call.cancel()
                    raise

            try:
                call, first, then = await upstream.call(None, invoke)  # any replica: it opens the session
            except grpc.aio.AioRpcError as error:
                return error_response(upstream.failure(error))
            if not isinstance(first, Message) or first.WhichOneof("kind") != "answer":
                call.cancel()
                log.error("session service ended %s without its answer", route.rpc)
                return error_response(Internal("internal server error"))
            answer = first.answer  # type: ignore[attr-defined]
            if then is grpc.aio.EOF:  # not waiting, or nothing to wait for (a repeated call)
                call.cancel()
                return Response(write(answer), route.status, media_type=JSON)
            turn_id = dump(getattr(answer, route.turn_id_field))
            return LiveStream(route.rpc, call, then, turn_id, answer.session_id, inner="turn")  # type: ignore[arg-type]

        return handle

    async def _page(
        self, route: Route, message: Message, session_id: str | None, write: Callable[[Message], str]
    ) -> Response:
        """A page of events: one message, or the page and its last item's payload in pieces."""
        upstream = self.upstream
        timeout = upstream.timeout

        async def invoke(stub: session_pb2_grpc.SessionServiceStub, metadata: Metadata) -> tuple[Call, Read, Read]:
            call = getattr(stub, route.rpc)(message, metadata=metadata)
            try:
                first = await _read(call, timeout)
                return call, first, await _read(call, timeout)
            except BaseException:
                call.cancel()
                raise

        try:
            call, page, then = await upstream.call(session_id, invoke)
        except grpc.aio.AioRpcError as error:
            return error_response(upstream.failure(error))
        if not isinstance(page, Message):  # EOF: ended without its page
            log.error("session service ended %s without a page", route.rpc)
            return error_response(Internal("internal server error"))
        if then is grpc.aio.EOF:
            return Response(write(page), route.status, media_type=JSON)
        return StreamingResponse(_pieces(route.rpc, call, write(page), then, timeout), route.status, media_type=JSON)

    async def _request(self, route: Route, request: Request) -> Message:
        """The route's typed request; raises the refusal to answer instead."""
        path_id = request.path_params.get("id", "")
        body = await self.bodies.read(request, route.credential, path_id)
        message = route.request()
        getattr(message, route.credential_field).CopyFrom(credential_of(request))
        if route.id_field:
            setattr(message, route.id_field, path_id)
        for name in route.path_fields:
            setattr(message, name, request.path_params.get(name, ""))
        for name in route.query_fields:
            setattr(message, name, request.query_params.get(name, ""))
        for header, field, _ in route.headers:
            if (value := request.headers.get(header)) is not None:
                setattr(message, field, value)
        if route.body_field:
            target = getattr(message, route.body_field)
            read = read_json_value if target.DESCRIPTOR.full_name == JSON_VALUE else read_body
            try:
                read(target, body, request.headers.get("content-type", ""))
            except Unreadable as failure:
                await self.bodies.check(request, route.credential, path_id)
                raise InvalidInput(failure.text) from None
        return message


Call: TypeAlias = grpc.aio.UnaryStreamCall
Read: TypeAlias = Message | object  # a message, or grpc.aio.EOF


async def _read(call: Call, timeout: float) -> Read:
    """The call's next message (or EOF), within `timeout`: as a call's deadline would end it."""
    try:
        async with asyncio.timeout(timeout):
            message: Read = await call.read()
            return message
    except TimeoutError:
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "Deadline Exceeded"
        ) from None


async def _pieces(rpc: str, call: Call, page: str, piece: Read, timeout: float) -> AsyncIterator[bytes]:
    """The page's JSON with its last item's payload written piece by piece. A call that fails now
    breaks the response off (no complete body)."""
    cut = page.rindex(_CREATED_AT)
    try:
        yield page[:cut].encode()
        while isinstance(piece, Message):
            yield piece.items[0].payload.json.encode()  # type: ignore[attr-defined]
            piece = await _read(call, timeout)
        yield page[cut:].encode()
    except grpc.aio.AioRpcError as error:
        log.warning("%s stream failed: %s %s", rpc, error.code().name, error.details())
        raise
    finally:
        call.cancel()
