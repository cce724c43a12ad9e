"""REST routes forwarded 1:1 to a SessionService call (RestRequest -> JsonReply)."""

from __future__ import annotations

import grpc

from bae.protos import session_pb2
from services.gateway import http
from services.gateway.http import Request, Send
from services.gateway.router import Handler
from services.gateway.upstream import Upstream


def forward(upstream: Upstream, rpc_name: str, status: int = 200) -> Handler:
    """A handler that hands the request to `rpc_name` and answers its JSON with `status`."""
    rpc = getattr(upstream.stub, rpc_name)
    timeout = upstream.timeout

    async def handle(request: Request, send: Send) -> None:
        authorization = request.header(b"authorization")
        message = session_pb2.RestRequest(
            authorization=authorization or "",
            has_authorization=authorization is not None,
            path_id=request.path_id,
            body=await request.body(),
            content_type=request.header(b"content-type") or "",
            query=request.query(),
        )
        try:
            reply = await rpc(message, timeout=timeout)
        except grpc.aio.AioRpcError as error:
            await http.respond_problem(send, upstream.failure(error))
            return
        if status == 204:
            await http.respond(send, 204, b"", None)
        else:
            await http.respond(send, status, reply.json.encode())

    return handle
