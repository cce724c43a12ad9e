"""REST routes forwarded 1:1 to a SessionService call (RestRequest -> JsonReply)."""

from __future__ import annotations

import grpc
from starlette.requests import Request
from starlette.responses import Response

from bae.common.errors import Problem
from bae.common.protos import session_pb2, session_pb2_grpc
from services.gateway.body import BodyReader, Credential
from services.gateway.responses import JSON, problem_response
from services.gateway.router import Endpoint
from services.gateway.upstream import Metadata, Upstream, credentials

# Calls about one session: they go to the replica that owns it.
SESSION_RPCS = frozenset({"JoinSession", "ListParticipants", "ListEvents", "CloseSession"})


class Forwarder:
    """Builds the endpoints of one port: each hands its request to one SessionService call."""

    def __init__(self, upstream: Upstream, bodies: BodyReader) -> None:
        self.upstream = upstream
        self.bodies = bodies

    def __call__(self, rpc_name: str, credential: Credential, status: int = 200) -> Endpoint:
        """An endpoint that calls `rpc_name` and answers its JSON with `status`.

        `credential` is what the route takes; it is checked first when the body is large.
        """
        upstream = self.upstream
        bodies = self.bodies
        timeout = upstream.timeout
        session_scoped = rpc_name in SESSION_RPCS

        async def handle(request: Request) -> Response:
            try:
                body = await bodies.read(request, credential)
            except Problem as problem:
                return problem_response(problem)
            message = session_pb2.RestRequest(
                **credentials(request),
                path_id=request.path_params.get("id", ""),
                body=body,
                content_type=request.headers.get("content-type", ""),
                query=request.query_params,
            )


            async def invoke(stub: session_pb2_grpc.SessionServiceStub, metadata: Metadata) -> session_pb2.JsonReply:
                return await getattr(stub, rpc_name)(message, timeout=timeout, metadata=metadata)

            try:
                reply = await upstream.call(message.path_id if session_scoped else None, invoke)
            except grpc.aio.AioRpcError as error:
                return problem_response(upstream.failure(error))
            if status == 204:
                return Response(status_code=204)
            return Response(reply.json, status, media_type=JSON)

        return handle
