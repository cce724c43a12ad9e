"""Both listeners in one event loop: bind both or neither, stop both within the budget."""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import socket

import uvicorn
from starlette.types import ASGIApp

from bae.common import telemetry
from bae.common.config import Config
from bae.common.entry import freeze_startup_heap
from bae.common.internal import InternalPlane
from bae.common.protos import edge_pb2, session_pb2
from bae.common.settings import Address, Settings
from bae.services.gateway.app import admin_app, client_app
from bae.services.gateway.console.app import console_routes
from bae.services.gateway.console.session import ConsoleCookie
from bae.services.gateway.body import BodyReader
from bae.services.gateway.connections import PortLimits, protocol_for
from bae.services.gateway.cors import with_cors
from bae.services.gateway.observe import Observed
from bae.services.gateway.rate_limit import RateLimit
from bae.services.gateway.prometheus import MetricsEndpoint
from bae.services.gateway.readiness import Readiness
from bae.services.gateway.rest import RestEndpoint
from bae.services.gateway.rpc import RpcEndpoint
from bae.services.gateway.upstream import Upstream

log = logging.getLogger("bae.gateway")


def bind(address: Address) -> socket.socket:
    """A listening socket; raises OSError when the port cannot be had."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on accepted sockets whose
    # proto says TCP, and without it every response waits ~40 ms on delayed ACKs.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address.host, address.port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _uvicorn(app: ASGIApp, settings: Settings, port: str) -> uvicorn.Server:
    limits = PortLimits(
        port,
        header_timeout=settings.http_header_timeout,
        keepalive_timeout=settings.http_keepalive_timeout,
        max_connections=settings.http_max_connections,
    )
    config = uvicorn.Config(
        app,
        lifespan="off",
        ws="none",
        http=protocol_for(limits),  # httptools, with the waits it leaves open bounded
        timeout_keep_alive=int(settings.http_keepalive_timeout),
        access_log=False,
        server_header=False,
        proxy_headers=False,  # nothing reads the client address or scheme: skip the per-request rewrite
        log_config=None,  # keep the process-wide logging set up from BAE_LOG
        # In-flight requests may drain for the budget less a second kept for the teardown.
        timeout_graceful_shutdown=max(settings.shutdown_timeout - 1, 0),
    )
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    return server


class Gateway:
    """The gateway's two ports: the endpoints behind them, built from the settings and config;
    started on sockets already bound, stopped in phases (end the streams, stop listening, close
    the links to the session service)."""

    def __init__(self, settings: Settings, config: Config) -> None:
        plane = InternalPlane.of(settings)
        self.upstream = Upstream(settings.session_targets, settings.rpc_timeout, plane)
        bodies = BodyReader(self.upstream, settings.max_body_bytes)
        rest = RestEndpoint(self.upstream, bodies)
        self.rpc = RpcEndpoint(self.upstream, bodies)
        self.readyz = Readiness(self.upstream, settings.runner_grpc_addr, plane)
        self.metrics = MetricsEndpoint(
            # Summed over the session replicas: each counts its own sessions and turns.
            [*settings.session_targets, settings.runner_grpc_addr],
            plane,
            enabled=config.telemetry.enabled and config.telemetry.metrics_enabled,
            timeout=settings.rpc_timeout,
        )
        client_router = client_app(rest, self.rpc, self.readyz)
        self.rate_limit = RateLimit(client_router, config.limits, self._ask_rate_policy)
        # CORS outside the rate limit: a 429 must reach a page's script readable, with its Retry-After.
        client = with_cors(client_router, self.rate_limit, settings.cors_origins)
        self.client = _uvicorn(Observed(client, settings.trusted_proxies), settings, "client")
        admin: ASGIApp
        if settings.console_enabled:
            console = console_routes(settings.console_prefix, self.upstream)
            admin = ConsoleCookie(admin_app(rest, self.rpc, self.readyz, self.metrics, console), self.upstream)
        else:
            admin = admin_app(rest, self.rpc, self.readyz, self.metrics, [])
        self.admin = _uvicorn(Observed(admin, settings.trusted_proxies), settings, "admin")
        self._sockets: list[socket.socket] = []

    async def _ask_rate_policy(self, authorization: str) -> session_pb2.RatePolicy:
        request = session_pb2.RatePolicyRequest(credential=edge_pb2.Credential(authorization=authorization, present=True))
        timeout = self.upstream.timeout
        return await self.upstream.call(
            None, lambda stub, metadata: stub.GetRatePolicy(request, timeout=timeout, metadata=metadata)
        )

    async def start(self, *, client_socket: socket.socket, admin_socket: socket.socket) -> None:
        self.upstream.start()
        self._sockets = [client_socket, admin_socket]
        await self.client.startup(sockets=[client_socket])
        await self.admin.startup(sockets=[admin_socket])

    async def stop(self) -> None:
        self.rpc.end_subscriptions()
        client_socket, admin_socket = self._sockets
        await asyncio.gather(self.client.shutdown(sockets=[client_socket]), self.admin.shutdown(sockets=[admin_socket]))
        await self.rpc.fanout.close()
        await self.rate_limit.close()
        await asyncio.gather(self.upstream.close(), self.readyz.close(), self.metrics.close())


# Descriptors the gateway needs besides its HTTP connections: its listeners, gRPC channels, logs.
SPARE_DESCRIPTORS = 1024


def _make_room_for_connections(max_connections: int) -> None:
    """Raise the soft descriptor limit (often 1024; the hard one is far more) to what both ports'
    connections need, so that the connection limit is reached before the descriptors run out."""
    needed = 2 * max_connections + SPARE_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    room = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if room > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))
    if room < needed:
        log.warning(
            "gateway: %d file descriptors allowed, %d needed for BAE_HTTP_MAX_CONNECTIONS=%d on both ports; "
            "raise the limit (ulimit -n) or lower the setting",
            room, needed, max_connections,
        )


async def serve(settings: Settings, config: Config) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit code."""
    _make_room_for_connections(settings.http_max_connections)
    sockets: list[socket.socket] = []
    for address, variable in ((settings.addr, "BAE_ADDR"), (settings.admin_addr, "BAE_ADMIN_ADDR")):
        try:
            sockets.append(bind(address))
        except OSError as exc:
            # Never run with only one listener.
            for sock in sockets:
                sock.close()
            log.error("gateway cannot bind %s (%s): %s", address, variable, exc.strerror or exc)
            return 1

    gateway = Gateway(settings, config)
    await gateway.start(client_socket=sockets[0], admin_socket=sockets[1])
    freeze_startup_heap()
    log.info(
        "gateway serving client API on http://%s and admin API on http://%s (session service %s)",
        settings.addr,
        settings.admin_addr,
        gateway.upstream.address,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ticks = asyncio.create_task(_refresh_date_header(gateway.client, gateway.admin))
    await stop.wait()

    log.info("gateway shutting down (budget %ss)", settings.shutdown_timeout)
    deadline = loop.time() + settings.shutdown_timeout
    ticks.cancel()
    try:
        async with asyncio.timeout(settings.shutdown_timeout):
            await gateway.stop()
    except TimeoutError:
        log.warning("gateway: shutdown budget exhausted; exiting anyway")
    # Telemetry flushes last, in what remains of the one budget.
    await asyncio.to_thread(telemetry.shutdown, deadline - loop.time())
    log.info("gateway stopped")
    return 0


async def _refresh_date_header(*servers: uvicorn.Server) -> None:
    # What uvicorn's own main loop would do once a second (we run startup/shutdown ourselves).
    while True:
        for server in servers:
            await server.on_tick(0)
        await asyncio.sleep(1)
