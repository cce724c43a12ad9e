"""Both listeners in one event loop: bind both or neither, stop both within the budget."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

import uvicorn
from starlette.types import ASGIApp

from bae.common import telemetry
from bae.common.config import Config
from bae.common.entry import freeze_startup_heap
from bae.common.internal import InternalPlane
from bae.common.settings import Address, Settings
from services.gateway.app import admin_app, client_app
from services.gateway.body import BodyReader
from services.gateway.observe import Observed
from services.gateway.prometheus import MetricsEndpoint
from services.gateway.readiness import Readiness
from services.gateway.rest import RestEndpoint
from services.gateway.rpc import RpcEndpoint
from services.gateway.upstream import Upstream

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


def _uvicorn(app: ASGIApp, settings: Settings) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        lifespan="off",
        ws="none",
        http="auto",  # httptools when installed, h11 otherwise
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


async def serve(settings: Settings, config: Config) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit code."""
    plane = InternalPlane.of(settings)
    sockets: list[socket.socket] = []
    try:
        for address in (settings.addr, settings.admin_addr):
            sockets.append(bind(address))
    except OSError as exc:
        # Never run with only one listener.
        for sock in sockets:
            sock.close()
        log.error("gateway cannot bind its listeners: %s", exc)
        return 1

    upstream = Upstream(settings.session_targets, settings.rpc_timeout, plane)
    upstream.start()
    bodies = BodyReader(upstream, settings.max_body_bytes)
    rest = RestEndpoint(upstream, bodies)
    rpc = RpcEndpoint(upstream, bodies)
    readyz = Readiness(upstream, settings.runner_grpc_addr, plane)
    metrics = MetricsEndpoint(
        # Summed over the session replicas: each counts its own sessions and turns.
        [*settings.session_targets, settings.runner_grpc_addr],
        plane,
        enabled=config.telemetry.enabled and config.telemetry.metrics_enabled,
        timeout=settings.rpc_timeout,
    )
    client = _uvicorn(Observed(client_app(rest, rpc, readyz)), settings)
    admin = _uvicorn(Observed(admin_app(rest, readyz, metrics)), settings)
    await client.startup(sockets=[sockets[0]])
    await admin.startup(sockets=[sockets[1]])
    freeze_startup_heap()
    log.info(
        "gateway serving client API on http://%s and admin API on http://%s (session service %s)",
        settings.addr,
        settings.admin_addr,
        upstream.address,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ticks = asyncio.create_task(_refresh_date_header(client, admin))
    await stop.wait()

    log.info("gateway shutting down (budget %ss)", settings.shutdown_timeout)
    deadline = loop.time() + settings.shutdown_timeout
    ticks.cancel()
    rpc.end_subscriptions()
    try:
        async with asyncio.timeout(settings.shutdown_timeout):
            await asyncio.gather(client.shutdown(sockets=[sockets[0]]), admin.shutdown(sockets=[sockets[1]]))
            await rpc.fanout.close()
            await asyncio.gather(upstream.close(), readyz.close(), metrics.close())
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
