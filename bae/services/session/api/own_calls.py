"""SessionService on the gRPC server: each method a call of its own, and the gateway's `Calls` stream.

A call of its own is served by its operation (operations.py): what came with it read from its
metadata, and how it ended other than with a reply written as its status and trailing metadata.
The server's ErrorInterceptor binds the caller's request id and trace context.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Callable, NoReturn

import grpc

from bae.common.protos import session_pb2
from bae.common.session_routing import was_redirected
from bae.services.session.api.gateway_calls import GatewayCalls
from bae.services.session.api.operations import CALLS_METHOD, SERVICE, Incoming, Operation, ending_of

log = logging.getLogger("bae.session.server")

SERVICE_NAME = SERVICE.full_name


def register(
    operations: dict[str, Operation], gateway_calls: GatewayCalls
) -> Callable[[grpc.aio.Server], list[str]]:
    """Registers every operation and the `Calls` stream; returns the service name to report healthy."""
    handlers: dict[str, grpc.RpcMethodHandler] = {
        operation.method: _handler(operation) for operation in operations.values()
    }
    handlers[CALLS_METHOD] = grpc.stream_stream_rpc_method_handler(
        gateway_calls.serve,
        request_deserializer=session_pb2.GatewayCalls.FromString,
        response_serializer=session_pb2.GatewayReplies.SerializeToString,
    )

    def _register(server: grpc.aio.Server) -> list[str]:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        server.add_registered_method_handlers(SERVICE_NAME, handlers)
        return [SERVICE_NAME]

    return _register


def _handler(operation: Operation) -> grpc.RpcMethodHandler:
    serve = operation.serve
    deserialize, serialize = operation.request.FromString, operation.reply.SerializeToString

    if operation.streaming:

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            incoming = Incoming(redirected=was_redirected(context))
            try:
                async for message in serve(request, incoming):
                    yield message
            except Exception as exc:
                await _end(context, exc)
            if incoming.trailers:
                context.set_trailing_metadata(tuple(incoming.trailers))

        return grpc.unary_stream_rpc_method_handler(stream, deserialize, serialize)

    if operation.client_streaming:

        async def collect(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            incoming = Incoming(redirected=was_redirected(context))
            try:
                reply = await serve(requests, incoming)
            except Exception as exc:
                await _end(context, exc)
            return reply

        return grpc.stream_unary_rpc_method_handler(collect, deserialize, serialize)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        incoming = Incoming(redirected=was_redirected(context))
        try:
            reply = await serve(request, incoming)
        except Exception as exc:
            await _end(context, exc)
        if incoming.trailers:
            context.set_trailing_metadata(tuple(incoming.trailers))
        return reply

    return grpc.unary_unary_rpc_method_handler(unary, deserialize, serialize)


async def _end(context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
    """End the call as `exc` says (operations.ending_of); anything else is re-raised, for gRPC
    to log and end the call UNKNOWN."""
    ending = ending_of(exc)
    if ending is None:
        raise exc
    context.set_trailing_metadata(tuple(ending.trailers))
    await context.abort(ending.code, ending.details)
    raise AssertionError("context.abort raises")
