"""The Sandbox gRPC service, its engine health reporting, and the serving loop."""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bae.protos import sandbox_pb2, sandbox_pb2_grpc
from services.sandbox.config import SandboxConfig
from services.sandbox.driver import Driver, SandboxFailure

log = logging.getLogger("bae.sandbox")

SERVICE_NAME = "baeproto.v1.Sandbox"


class SandboxService(sandbox_pb2_grpc.SandboxServicer):
    def __init__(self, driver: Driver, config: SandboxConfig) -> None:
        self._driver = driver
        self._config = config

    async def _call(self, context: grpc.aio.ServicerContext, operation):
        try:
            return await operation
        except SandboxFailure as failure:
            await context.abort(failure.code, failure.detail)
        except Exception as exc:  # an engine error no driver path expected: still a clear status
            log.exception("sandbox call failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"sandbox host error: {exc}")

    async def EnsureImage(self, request, context):
        if not request.image.strip():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing image")
        pulled = await self._call(context, self._driver.ensure_image(request.image))
        return sandbox_pb2.EnsureImageResponse(pulled=pulled)

    async def Start(self, request, context):
        if not request.image.strip():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing image")
        sandbox_id = await self._call(context, self._driver.start(request.session_id, request.image))
        return sandbox_pb2.StartResponse(sandbox_id=sandbox_id, host_id=self._config.host_id)

    async def Exec(self, request, context):
        if request.timeout_seconds < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "timeout_seconds must not be negative")
        timeout = request.timeout_seconds or self._config.exec_timeout
        output = await self._call(context, self._driver.exec(request.sandbox_id, request.command, timeout))
        return sandbox_pb2.ExecResponse(stdout=output.stdout, stderr=output.stderr, exit_code=output.exit_code)

    async def Stop(self, request, context):
        was_running = await self._call(context, self._driver.stop(request.sandbox_id))
        return sandbox_pb2.StopResponse(was_running=was_running)

    async def List(self, request, context):
        sandboxes = await self._call(context, self._driver.list())
        return sandbox_pb2.ListResponse(
            sandboxes=[
                sandbox_pb2.SandboxInfo(
                    sandbox_id=item.sandbox_id, session_id=item.session_id, image=item.image, state=item.state
                )
                for item in sandboxes
            ]
        )


class EngineMonitor:
    """Reports SERVING only while the engine answers and this host's orphans are gone."""

    def __init__(self, driver: Driver, health_servicer: health.aio.HealthServicer, interval: float) -> None:
        self._driver = driver
        self._health = health_servicer
        self._interval = interval
        self._serving: bool | None = None

    async def check(self) -> None:
        serving = await self._driver.ping()
        if serving:
            try:
                await self._driver.prepare()
            except Exception as exc:  # keeps the monitor alive; retried at the next check
                log.warning("orphan cleanup failed: %s", exc)
                serving = False
        if serving != self._serving:
            log.log(
                logging.INFO if serving else logging.WARNING,
                "container engine %s", "reachable: serving" if serving else "unreachable: NOT_SERVING",
            )
            self._serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SERVICE_NAME):
            await self._health.set(service, status)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.check()


async def serve_sandbox(config: SandboxConfig, driver: Driver, shutdown_timeout: float) -> None:
    """Serve until SIGTERM/SIGINT. Like bae.grpcutil.serve, but health follows the engine."""
    server = grpc.aio.server()
    sandbox_pb2_grpc.add_SandboxServicer_to_server(SandboxService(driver, config), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(config.listen_addr) == 0:
        raise OSError(f"sandbox: cannot bind gRPC address {config.listen_addr}")
    monitor = EngineMonitor(driver, health_servicer, config.health_interval)
    # Orphans go before the first request can start a container of ours.
    await monitor.check()
    await server.start()
    monitor_task = asyncio.create_task(monitor.run())
    log.info("sandbox host %s (driver %s) serving gRPC on %s", config.host_id, config.driver, config.listen_addr)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()

    log.info("sandbox shutting down (budget %ss)", shutdown_timeout)
    monitor_task.cancel()
    await health_servicer.enter_graceful_shutdown()
    try:
        async with asyncio.timeout(shutdown_timeout):
            await server.stop(grace=max(shutdown_timeout - 1, 0))
    except TimeoutError:
        log.warning("sandbox: shutdown budget exhausted; exiting anyway")
    await driver.close()
    log.info("sandbox stopped")
