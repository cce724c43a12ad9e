"""The stack in this process, for tests that cross no process boundary: the session service as
`python -m bae.services.session` builds it (bae/services/session/wiring.py) and the runner, each on a
grpc.aio server on a loopback port, and the gateway's two ports served by uvicorn, all on one
event loop of their own thread (grpc.aio objects belong to the loop that made them). The sandbox
hosts are left out: a session gets no sandbox.

Tests reach it as they reach a stack of processes (testkit/stack.py): over HTTP on loopback, with
the same `StackClients`. What they may reach past the ports: `session` (the session service's
parts) and `hold`, to pause one call inside the service. `InProcessService` is the session service
alone, as testkit/session_service.py runs it in a process of its own.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, Coroutine, Sequence, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bae.common.config import load_config
from bae.common.grpcutil import channel, internal_server
from bae.common.internal import InternalPlane
from bae.common.protos import session_pb2_grpc
from bae.common.settings import Address, load_settings
from bae.services.gateway.server import Gateway, bind
from bae.services.runner.clients import ProviderClients
from bae.services.runner.server import RunnerService, registrar
from bae.services.session.__main__ import admin_key_options, parse_args
from bae.services.session.wiring import SessionService, session_service
from testkit.processes import TEST_PLANE
from testkit.session_service import CONFIG, Service
from testkit.stack import StackClients, stack_env, with_test_limits

T = TypeVar("T")
LOOPBACK = "127.0.0.1"
START_TIMEOUT = 60.0


class ServiceLoop:
    """An event loop running on a thread of its own; the test's thread hands it coroutines."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = START_TIMEOUT) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class GrpcServer:
    """An internal-plane gRPC server on a loopback port it picks, serving until stopped."""

    def __init__(self, plane: InternalPlane) -> None:
        self.server = internal_server(plane)
        self.address = f"{LOOPBACK}:{self.server.add_insecure_port(f'{LOOPBACK}:0')}"

    async def start(self, register: Callable[[grpc.aio.Server], list[str]]) -> None:
        services = register(self.server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, self.server)
        for service in ["", *services]:
            await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(grace=1)


class Hold:
    """One call of an async method held inside the service: the first whose session is the given
    one waits where it was called until `release`; calls for other sessions pass."""

    def __init__(self, stack: "InProcessStack", owner: object, method: str, session_id: str,
                 session_of: Callable[[Any], str]) -> None:
        self._stack, self._owner, self._method = stack, owner, method
        self._original: Callable[..., Awaitable[Any]] = getattr(owner, method)
        self._session_id, self._session_of = session_id, session_of
        self._reached = threading.Event()
        self._go = asyncio.Event()  # set on the stack's loop only
        self.cancelled = threading.Event()  # the held call was cancelled while it waited
        setattr(owner, method, self._wrapper)

    async def _wrapper(self, *args: Any, **kwargs: Any) -> Any:
        if args and not self._reached.is_set() and self._session_of(args[0]) == self._session_id:
            self._reached.set()
            try:
                await self._go.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return await self._original(*args, **kwargs)

    def wait_held(self, timeout: float = 10) -> None:
        assert self._reached.wait(timeout), f"no {self._method} call for {self._session_id} reached the hold"

    def release(self) -> None:
        """Let the held call go on, and every later call pass untouched."""
        self._stack.loop.loop.call_soon_threadsafe(self._go.set)
        delattr(self._owner, self._method)  # the class's method again


class InProcessStack(StackClients):
    """The session service, runner and gateway in this process (see the module's docstring)."""

    def __init__(self, tmp: Path, config_toml: str | None = None, **env: str) -> None:
        self.tmp = tmp
        self._set_env = {name: value for name, value in env.items() if not name.startswith("BAE_")}
        self._saved_env = {name: os.environ.get(name) for name in self._set_env}
        # Provider tokens and MCP variables are read from this process's environment (${NAME}).
        os.environ.update(self._set_env)
        if "BAE_CONFIG" not in env:
            (tmp / "bae-config.toml").write_text(with_test_limits(config_toml))
            env["BAE_CONFIG"] = str(tmp / "bae-config.toml")
        service_env = stack_env(tmp, BAE_SANDBOX_GRPC_ADDRS="", **env)
        self.loop = ServiceLoop(f"stack-{tmp.name}")
        try:
            self.loop.run(self._start(service_env))
        except BaseException:
            self.close()
            raise
        admin_key = Path(self.settings.admin_key_file)
        super().__init__(
            client_url=f"http://{self.settings.addr}",
            admin_url=f"http://{self.settings.admin_addr}",
            admin_key=admin_key.read_text().strip() if admin_key.exists() else "",
        )

    async def _start(self, env: dict[str, str]) -> None:
        self._stops: list[Callable[[], Awaitable[None]]] = []  # run last first
        plane = InternalPlane.of(load_settings(env))
        session_server, runner_server = GrpcServer(plane), GrpcServer(plane)
        client_socket, admin_socket = bind(Address(LOOPBACK, 0)), bind(Address(LOOPBACK, 0))
        self.settings = load_settings({
            **env,
            "BAE_ADDR": f"{LOOPBACK}:{client_socket.getsockname()[1]}",
            "BAE_ADMIN_ADDR": f"{LOOPBACK}:{admin_socket.getsockname()[1]}",
            "BAE_SESSION_GRPC_ADDR": session_server.address,
            "BAE_RUNNER_GRPC_ADDR": runner_server.address,
        })
        config = load_config(self.settings.config_path)

        clients = ProviderClients(self.settings.provider_timeout)
        self._stops += [clients.close, runner_server.stop]
        await runner_server.start(registrar(RunnerService(config, clients, self.settings.rpc_timeout)))

        options = admin_key_options(parse_args(["serve"]), self.settings)
        self.session: SessionService = await session_service(self.settings, config, options)
        self._stops.append(self.session.stop)
        await self.session.start()
        self._stops.append(session_server.stop)
        await session_server.start(self.session.registrar())

        gateway = Gateway(self.settings, config)
        self._stops.append(gateway.stop)
        await gateway.start(client_socket=client_socket, admin_socket=admin_socket)

    async def _stop(self) -> None:
        for stop in reversed(getattr(self, "_stops", [])):
            await stop()

    def hold(self, owner: object, method: str, session_id: str,
             session_of: Callable[[Any], str] = str) -> Hold:
        """Hold the next call of `owner.method` (on the stack's loop) whose first argument is for
        `session_id` (`session_of` reads the session id from it)."""
        return Hold(self, owner, method, session_id, session_of)

    def close(self) -> None:
        if hasattr(self, "client"):
            super().close()
        try:
            self.loop.run(self._stop())
        finally:
            self.loop.close()
            for name, value in self._saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def launch_inprocess_stack(tmp: Path, config_toml: str | None = None, **env: str) -> InProcessStack:
    """As testkit.stack.launch_stack, in this process."""
    return InProcessStack(tmp, config_toml, **env)


class InProcessService(Service):
    """testkit.session_service.Service in this process: the session service alone, as
    `python -m bae.services.session serve <args>` builds it, on a loopback port, called over real gRPC."""

    def __init__(self, tmp: Path, args: Sequence[str] = (), **env: str) -> None:
        config = tmp / "bae-config.toml"
        if not config.exists():
            config.write_text(CONFIG)
        self.env = stack_env(tmp, BAE_CONFIG=str(config), **env)
        self.loop = ServiceLoop(f"session-{tmp.name}")
        try:
            self.loop.run(self._start(list(args)))
        except BaseException:
            self.loop.close()
            raise
        self.channel = channel(self.env["BAE_SESSION_GRPC_ADDR"], TEST_PLANE)
        self.stub = session_pb2_grpc.SessionServiceStub(self.channel)
        key_file = Path(self.env["BAE_ADMIN_KEY_FILE"])
        self.admin_key = key_file.read_text().strip() if key_file.exists() else ""

    async def _start(self, args: list[str]) -> None:
        self.server = GrpcServer(InternalPlane.of(load_settings(self.env)))
        self.env["BAE_SESSION_GRPC_ADDR"] = self.server.address
        settings = load_settings(self.env)
        options = admin_key_options(parse_args(["serve", *args]), settings)
        self.session = await session_service(settings, load_config(settings.config_path), options)
        await self.session.start()
        await self.server.start(self.session.registrar())

    async def _stop(self) -> None:
        await self.server.stop()
        await self.session.stop()

    async def stop(self) -> int:
        await self.channel.close()
        try:
            self.loop.run(self._stop())
        finally:
            self.loop.close()
        return 0
