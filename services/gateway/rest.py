"""REST routes forwarded 1:1 to a SessionService call (RestRequest -> JsonReply)."""

from __future__ import annotations

import grpc
from starlette.requests import Request
from starlette.responses import Response

from bae.protos import session_pb2
from services.gateway.responses import JSON, problem_response
from services.gateway.router import Endpoint
from services.gateway.upstream import Upstream, credentials


def forward(upstream: Upstream, rpc_name: str, status: int = 200) -> Endpoint:
    """An endpoint that hands the request to `rpc_name` and answers its JSON with `status`."""
    rpc = getattr(upstream.stub, rpc_name)
    timeout = upstream.timeout

    async def handle(request: Request) -> Response:
        message = session_pb2.RestRequest(
            **credentials(request),
            path_id=request.path_params.get("id", ""),
            body=await request.body(),
            content_type=request.headers.get("content-type", ""),
            query=request.query_params,
        )
        try:
            reply = await rpc(message, timeout=timeout)
        except grpc.aio.AioRpcError as error:
            return problem_response(upstream.failure(error))
        if status == 204:
            return Response(status_code=204)
        return Response(reply.json, status, media_type=JSON)

    return handle
