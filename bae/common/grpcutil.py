"""Running a gRPC service: health checking, error translation, clean shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bae.common import telemetry
from bae.common.metadata_channel import Metadata, MetadataChannel
from bae.common.propagation import add_outgoing, bind_incoming
from bae.common.entry import freeze_startup_heap
from bae.common import error_codes
from bae.common.errors import BaeError
from bae.common.internal import HEALTH_METHOD_PREFIX, InternalPlane
from bae.common.logs import install_handler

log = logging.getLogger("bae")

# Registers servicers on a server; returns the service names to report healthy.
Registrar = Callable[[grpc.aio.Server], Iterable[str]]
# Takes over health reporting from serve(): sets the first statuses before the server
# starts, and may keep reporting in a task of its own.
HealthReporter = Callable[[health.aio.HealthServicer], Awaitable[None]]


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpcio ships no stubs
    """Ends a call whose handler raised one of our errors with its status (bae.common.error_codes).

    Also binds the caller's request id and trace context for the handler (bae.common.propagation).
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(HEALTH_METHOD_PREFIX):
            # Health's Watch writes with context.write(), not as a generator; it raises none of our errors.
            return handler
        metadata = handler_call_details.invocation_metadata
        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                return await serve_unary(inner, request, context, metadata)

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                async for item in serve_stream(inner_stream, request, context, metadata):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )
        return handler


async def serve_unary(
    inner: Callable[[Any, Any], Awaitable[Any]], request: Any, context: Any, metadata: Metadata | None
) -> Any:
    """A unary handler's call, as ErrorInterceptor serves it: with the caller's request id and
    trace context bound, and a raised error of ours ending it with its status and trailer."""
    bind_incoming(metadata)
    try:
        return await inner(request, context)
    except BaeError as error:
        await error_codes.abort(context, error)


async def serve_stream(
    inner: Callable[[Any, Any], AsyncIterator[Any]], request: Any, context: Any, metadata: Metadata | None
) -> AsyncGenerator[Any, None]:
    """A server-streaming handler's call, served as `serve_unary` serves a unary one."""
    bind_incoming(metadata)
    try:
        async for item in inner(request, context):
            yield item
    except BaeError as error:
        await error_codes.abort(context, error)


# Client libraries whose debug output carries request headers (provider tokens)
# or whole tool payloads; they stay at WARNING whatever BAE_LOG says.
NOISY_LIBRARY_LOGGERS = ("anthropic", "openai", "mcp", "httpx", "httpx2", "httpcore", "httpcore2")


def configure_logging(level: str = "info", log_format: str = "text") -> None:
    """stderr at BAE_LOG's level, as text lines or (BAE_LOG_FORMAT=json) JSON objects."""
    levels = {"trace": logging.DEBUG, "debug": logging.DEBUG, "warn": logging.WARNING}
    install_handler(levels.get(level, getattr(logging, level.upper(), logging.INFO)), log_format)
    for name in NOISY_LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


# Conversations (so step requests, events and /rpc params) can exceed gRPC's
# 4 MB default; servers and channels must both accept them.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# A message carried inside another on a shared stream (session.proto, Calls) leaves room for its frame.
MAX_CARRIED_BYTES = MAX_MESSAGE_BYTES - 64 * 1024
MESSAGE_SIZE_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


def internal_server(plane: InternalPlane) -> grpc.aio.Server:
    """A gRPC server of the internal plane: its token checked, our errors mapped, messages bounded."""
    return grpc.aio.server(
        interceptors=[*plane.server_interceptors(), ErrorInterceptor()],
        # gRPC shares a port with another process that binds it too (SO_REUSEPORT) and splits the
        # connections between them; a port already in use must fail the start instead.
        options=[*MESSAGE_SIZE_OPTIONS, *plane.server_options(), ("grpc.so_reuseport", 0)],
    )


async def serve(
    name: str,
    address: str,
    register: Registrar,
    shutdown_timeout: float,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
    report_health: HealthReporter | None = None,
    *,
    plane: InternalPlane,
    drain: Callable[[float], Awaitable[None]] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, then shut down within `shutdown_timeout` seconds, in phases:

    1. stop accepting calls (and, through `drain`, new work of the service's own);
    2. let running calls and `drain(budget)` finish within the budget;
    3. `on_shutdown`: tear down what the service holds.

    Without `report_health`, every registered service reports SERVING from the start.
    Every call but a health check must carry the internal plane's token.
    """
    server = internal_server(plane)
    services = list(register(server))
    server.add_generic_rpc_handlers((telemetry.metrics_rpc_handler(),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:  # what grpcio raises when the address is in use
        bound = 0
    if bound == 0:
        raise OSError(f"{name}: cannot bind gRPC address {address}")
    if report_health is None:
        for service in ["", *services]:
            await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    else:
        await report_health(health_servicer)
    await server.start()
    freeze_startup_heap()
    log.info("%s serving gRPC on %s", name, address)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()

    log.info("%s shutting down (budget %ss)", name, shutdown_timeout)
    deadline = loop.time() + shutdown_timeout
    await health_servicer.enter_graceful_shutdown()
    try:
        async with asyncio.timeout(shutdown_timeout):
            grace = max(shutdown_timeout - 1, 0)
            await asyncio.gather(server.stop(grace=grace), drain(grace) if drain is not None else asyncio.sleep(0))
            if on_shutdown is not None:
                await on_shutdown()
    except TimeoutError:
        log.warning("%s: shutdown budget exhausted; exiting anyway", name)
    # Telemetry flushes last, in what remains of the one budget.
    await asyncio.to_thread(telemetry.shutdown, deadline - loop.time())
    log.info("%s stopped", name)


def channel(target: str, plane: InternalPlane) -> grpc.aio.Channel:
    """An internal channel; callers always pass a deadline (`timeout=`).

    Its calls carry the internal token, the request id and trace context (bae.common.propagation).
    """
    token = plane.token_metadata

    def add(metadata: Metadata | None) -> Metadata:
        outgoing = [*(metadata or ()), token]
        add_outgoing(outgoing)
        return outgoing

    inner = grpc.aio.insecure_channel(
        target,
        options=[
            *plane.channel_options(),
            ("grpc.max_reconnect_backoff_ms", 2_000),
            *MESSAGE_SIZE_OPTIONS,
        ],
    )
    return MetadataChannel(inner, add)
