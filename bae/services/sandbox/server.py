"""The Sandbox gRPC service and its health reporting, which follows the Docker daemon."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable
from typing import TypeAlias, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2

from bae.common.errors import BaeError, Internal, InvalidInput
from bae.common.grpcutil import serve
from bae.common.internal import InternalPlane
from bae.common.protos import sandbox_pb2, sandbox_pb2_grpc
from bae.services.sandbox.commands import COMMAND_ID_LIMIT, BackgroundCommands, Command
from bae.services.sandbox.config import SandboxConfig
from bae.services.sandbox.driver import Driver
from bae.services.sandbox.images import ImageAllowlist
from bae.services.sandbox.exec_span import end_exec, start_exec
from bae.services.sandbox.warm import WarmPool

log = logging.getLogger("bae.sandbox")

T = TypeVar("T")
Context: TypeAlias = grpc.aio.ServicerContext

SERVICE_NAME = sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"].full_name


def command_status(command: Command, stdout_offset: int = 0, stderr_offset: int = 0,
                   output: bool = True) -> sandbox_pb2.CommandStatus:
    """The command's status; with `output`, its kept output from the offsets."""
    return sandbox_pb2.CommandStatus(
        command_id=command.command_id,
        sandbox_id=command.sandbox_id,
        state=sandbox_pb2.CommandStatus.State.Value(command.state.value),
        exit_code=command.exit_code,
        stdout=command.stdout.read(stdout_offset) if output else b"",
        stderr=command.stderr.read(stderr_offset) if output else b"",
        stdout_truncated=command.stdout.truncated,
        stderr_truncated=command.stderr.truncated,
        detail=command.detail,
    )


class SandboxService(sandbox_pb2_grpc.SandboxServicer):
    def __init__(self, driver: Driver, config: SandboxConfig, warm: WarmPool) -> None:
        self._driver = driver
        self._config = config
        self._warm = warm
        self._images = ImageAllowlist()
        self._commands = BackgroundCommands(driver, config.output_limit)

    # A refusal or failure is raised as a kind of bae.common.errors; the server's ErrorInterceptor
    # ends the call with its status and the `bae-error-bin` trailer (bae.common.error_codes).

    @staticmethod
    async def _call(operation: Awaitable[T]) -> T:
        try:
            return await operation
        except BaeError:
            raise
        except Exception:  # a Docker error no driver path expected: a clear status, the detail in the log
            log.exception("sandbox call failed")
            raise Internal("sandbox host error") from None

    def _allowed(self, image: str) -> None:
        if not image.strip():
            raise InvalidInput("missing image")
        self._images.check(image)

    async def AllowImages(self, request: sandbox_pb2.AllowImagesRequest, context: Context) -> sandbox_pb2.AllowImagesResponse:
        self._images.replace(list(request.images))
        self._warm.allow(frozenset(request.images))
        return sandbox_pb2.AllowImagesResponse()

    async def EnsureImage(self, request: sandbox_pb2.EnsureImageRequest, context: Context) -> sandbox_pb2.EnsureImageResponse:
        self._allowed(request.image)
        if self._warm.has_spare(request.image):  # a container of it runs here: the image is present
            return sandbox_pb2.EnsureImageResponse(pulled=False)
        pulled = await self._call(self._driver.ensure_image(request.image))
        self._warm.ensured(request.image)
        return sandbox_pb2.EnsureImageResponse(pulled=pulled)

    async def Start(self, request: sandbox_pb2.StartRequest, context: Context) -> sandbox_pb2.StartResponse:
        self._allowed(request.image)
        sandbox_id = await self._call(self._warm.take(request.session_id, request.image))
        if sandbox_id is None:
            sandbox_id = await self._call(self._driver.start(request.session_id, request.image))
        return sandbox_pb2.StartResponse(sandbox_id=sandbox_id, host_id=self._config.host_id)

    @staticmethod
    def _seconds(name: str, value: float) -> float:
        if not math.isfinite(value) or value < 0:
            raise InvalidInput(f"{name} must be a non-negative number of seconds")
        return value

    async def Exec(self, request: sandbox_pb2.ExecRequest, context: Context) -> sandbox_pb2.ExecResponse:
        timeout = self._seconds("timeout_seconds", request.timeout_seconds) or self._config.exec_timeout
        span = start_exec()
        try:
            output = await self._call(self._driver.exec(request.sandbox_id, request.command, timeout))
        except BaseException:
            end_exec(span, None)
            raise
        end_exec(span, output.exit_code)
        return sandbox_pb2.ExecResponse(
            stdout=output.stdout,
            stderr=output.stderr,
            exit_code=output.exit_code,
            stdout_truncated=output.stdout_truncated,
            stderr_truncated=output.stderr_truncated,
        )

    async def Stop(self, request: sandbox_pb2.StopRequest, context: Context) -> sandbox_pb2.StopResponse:
        was_running = await self._call(self._commands.stop_sandbox(request.sandbox_id))
        self._warm.released(request.sandbox_id)
        return sandbox_pb2.StopResponse(was_running=was_running)

    async def StartCommand(self, request: sandbox_pb2.StartCommandRequest, context: Context) -> sandbox_pb2.CommandStatus:
        if not request.command_id or len(request.command_id) > COMMAND_ID_LIMIT:
            raise InvalidInput(f"command_id must be 1 to {COMMAND_ID_LIMIT} characters")
        if not request.sandbox_id:
            raise InvalidInput("missing sandbox_id")
        timeout = self._seconds("timeout_seconds", request.timeout_seconds)
        command = await self._call(self._commands.start(
            request.sandbox_id, request.command_id, request.command, request.stdin, timeout,
            request.output_limit_bytes,
        ))
        return command_status(command)

    async def WaitCommand(self, request: sandbox_pb2.WaitCommandRequest, context: Context) -> sandbox_pb2.CommandStatus:
        seconds = self._seconds("wait_seconds", request.wait_seconds)
        command = await self._call(self._commands.wait(request.command_id, seconds))
        return command_status(command, request.stdout_offset, request.stderr_offset)

    async def KillCommand(self, request: sandbox_pb2.KillCommandRequest, context: Context) -> sandbox_pb2.CommandStatus:
        command = await self._call(self._commands.kill(request.command_id))
        return command_status(command)

    async def ListCommands(self, request: sandbox_pb2.ListCommandsRequest, context: Context) -> sandbox_pb2.ListCommandsResponse:
        return sandbox_pb2.ListCommandsResponse(
            commands=[command_status(command, output=False) for command in self._commands.list()]
        )

    async def List(self, request: sandbox_pb2.ListRequest, context: Context) -> sandbox_pb2.ListResponse:
        sandboxes = await self._call(self._driver.list())
        listed = []
        for item in sandboxes:
            session_id = self._warm.holder(item.sandbox_id) if item.spare else item.session_id
            if session_id is None:  # a spare no session holds (yet): nobody's sandbox
                continue
            listed.append(sandbox_pb2.SandboxInfo(
                sandbox_id=item.sandbox_id, session_id=session_id, image=item.image, state=item.state
            ))
        return sandbox_pb2.ListResponse(sandboxes=listed)


class DockerMonitor:
    """Reports SERVING only while the Docker daemon answers and this host's orphans are gone."""

    def __init__(self, driver: Driver, interval: float) -> None:
        self._driver = driver
        self._interval = interval
        self._serving: bool | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, health_servicer: health.aio.HealthServicer) -> None:
        """serve()'s health reporter: checks once before the server starts, then every interval."""
        # Orphans go before the first request can start a container of ours.
        await self._check(health_servicer)
        self._task = asyncio.create_task(self._run(health_servicer))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _check(self, health_servicer: health.aio.HealthServicer) -> None:
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
                "Docker daemon %s", "reachable: serving" if serving else "unreachable: NOT_SERVING",
            )
            self._serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SERVICE_NAME):
            await health_servicer.set(service, status)

    async def _run(self, health_servicer: health.aio.HealthServicer) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self._check(health_servicer)


async def serve_sandbox(config: SandboxConfig, driver: Driver, shutdown_timeout: float, plane: InternalPlane) -> None:
    """Serve until SIGTERM/SIGINT, with health following the Docker daemon."""
    monitor = DockerMonitor(driver, config.health_interval)
    # Fills once the session service sends the allowed images; its spares go with the host's others below.
    warm = WarmPool(driver, config.warm)

    def register(server: grpc.aio.Server) -> list[str]:
        sandbox_pb2_grpc.add_SandboxServicer_to_server(SandboxService(driver, config, warm), server)
        return [SERVICE_NAME]

    async def shut_down() -> None:
        monitor.stop()
        await warm.close()
        # In-flight calls have drained; a later start would remove these as orphans anyway.
        try:
            removed = await driver.remove_all()
        except Exception as exc:  # the Docker daemon went away: the next start removes them
            log.warning("could not remove this host's sandboxes at shutdown: %s", exc)
        else:
            if removed:
                log.info("removed %d sandbox container(s) at shutdown", removed)
        await driver.close()

    await serve(
        f"sandbox host {config.host_id} (driver {config.driver})",
        config.listen_addr,
        register,
        shutdown_timeout,
        on_shutdown=shut_down,
        report_health=monitor.start,
        plane=plane,
    )
