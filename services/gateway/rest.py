"""One endpoint for every REST route the declaration names (services/gateway/declaration.py).

Each request becomes its route's typed request: the credential as it came, the `{id}` segment,
the query fields as given, and the JSON body read into its field. A body that does not read is a
400 with the translator's text, answered after the credential was checked (authentication always
comes first). The reply is written as JSON with the route's status.
"""

from __future__ import annotations

import grpc
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response

from bae.common.errors import BaeError, InvalidInput
from bae.common.protos import session_pb2_grpc
from services.gateway.body import BodyReader
from services.gateway.declaration import Route
from services.gateway.json_to_proto import Unreadable, read_body
from services.gateway.problems import JSON, error_response
from services.gateway.proto_to_json import writer_of
from services.gateway.router import Endpoint
from services.gateway.upstream import Metadata, Upstream, credential_of


class RestEndpoint:
    """Builds the endpoint of each route: it makes the route's one SessionService call."""

    def __init__(self, upstream: Upstream, bodies: BodyReader) -> None:
        self.upstream = upstream
        self.bodies = bodies

    def __call__(self, route: Route) -> Endpoint:
        upstream = self.upstream
        write = writer_of(route.reply.DESCRIPTOR)

        async def handle(request: Request) -> Response:
            try:
                message = await self._request(route, request)
            except BaeError as error:
                return error_response(error)
            session_id = getattr(message, route.id_field) if route.session_scoped else None
            timeout = upstream.timeout

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

    async def _request(self, route: Route, request: Request) -> Message:
        """The route's typed request; raises the refusal to answer instead."""
        path_id = request.path_params.get("id", "")
        body = await self.bodies.read(request, route.credential, path_id)
        message = route.request()
        getattr(message, route.credential_field).CopyFrom(credential_of(request))
        if route.id_field:
            setattr(message, route.id_field, path_id)
        for name in route.query_fields:
            setattr(message, name, request.query_params.get(name, ""))
        if route.body_field:
            try:
                read_body(getattr(message, route.body_field), body, request.headers.get("content-type", ""))
            except Unreadable as failure:
                await self.bodies.check(request, route.credential, path_id)
                raise InvalidInput(failure.text) from None
        return message
