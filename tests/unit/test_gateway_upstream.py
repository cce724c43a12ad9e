"""The gateway's routing over session replicas named by DNS (bae/services/gateway/upstream.py).

Two real replicas on loopback, one of them behind a TCP proxy that can freeze: it stops
moving bytes without closing anything, as a host that vanished does (a killed container on an
overlay network sends no reset, so the gateway's connection to it still looks open). The
name `replicas` resolves, through a scripted resolver, to both; each address is a replica of
its own, health-checked, so the frozen one is routed around instead of holding calls until
their deadline, and a scaled service's addresses come and go.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from bae.common.internal import InternalPlane
from bae.common.protos import admin_api_pb2
from bae.services.gateway.upstream import Upstream
from bae.services.session.api.gateway_calls import GatewayCalls
from bae.services.session.api.operations import Incoming, operations
from bae.services.session.api.own_calls import register

pytestmark = pytest.mark.unit

PLANE = InternalPlane("t" * 32, 30.0)


class Named:
    """A replica's operations: GetProfile answers with the replica's name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, method: str) -> object:
        async def unimplemented(request: object, incoming: Incoming) -> None:
            raise AssertionError(f"{method} is not part of this test")

        return unimplemented

    async def get_profile(self, request: admin_api_pb2.GetProfileRequest, incoming: Incoming) -> admin_api_pb2.Profile:
        return admin_api_pb2.Profile(name=self.name)


async def serve_replica(name: str, address: str) -> grpc.aio.Server:
    """A replica with the `Calls` stream, every operation and the health service, on `address`."""
    server = grpc.aio.server()
    table = operations(Named(name))
    register(table, GatewayCalls(table))(server)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(address)
    await server.start()
    return server


class FreezableProxy:
    """Forwards TCP connections to `backend` until frozen; then no byte moves either way and
    nothing is closed, and new connections are accepted and left silent."""

    def __init__(self, backend: tuple[str, int]) -> None:
        self.backend = backend
        self.frozen = False
        self._transports: list[asyncio.Transport] = []

    async def listen(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._piped, host, port)

    def freeze(self) -> None:
        self.frozen = True
        for transport in self._transports:
            transport.pause_reading()

    async def close(self) -> None:
        for transport in self._transports:
            transport.abort()
        self._server.close()

    async def _piped(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._transports.append(writer.transport)  # type: ignore[arg-type]
        if self.frozen:
            return
        backend_reader, backend_writer = await asyncio.open_connection(*self.backend)
        self._transports.append(backend_writer.transport)  # type: ignore[arg-type]
        await asyncio.gather(self._copy(reader, backend_writer), self._copy(backend_reader, writer))

    @staticmethod
    async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()


def shared_port() -> int:
    """A port free on both 127.0.0.1 and 127.0.0.2 (Linux routes all of 127/8 to loopback)."""
    for _ in range(20):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.2", port))
            except OSError:
                continue
            return int(port)
    raise RuntimeError("no port free on both 127.0.0.1 and 127.0.0.2")


class ScriptedDns:
    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers

    async def __call__(self, host: str, port: int) -> list[str]:
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.answers[host])


async def answered_by(upstream: Upstream, *, deadline: float = 5.0) -> str:
    """Which replica answered a call that belongs to no session."""
    request = admin_api_pb2.GetProfileRequest(profile_id="p")

    def invoke(stub: Any, metadata: Any) -> Any:
        return stub.GetProfile(request, timeout=deadline, metadata=metadata)

    return str((await upstream.call(None, invoke)).name)


async def eventually(condition: Any, what: str, timeout: float = 10.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {timeout:g} s: {what}") from None


async def test_a_replica_that_vanished_while_still_resolved_is_routed_around():
    port = shared_port()
    a_port = shared_port()
    a = await serve_replica("a", f"127.0.0.1:{a_port}")
    proxy = FreezableProxy(("127.0.0.1", a_port))
    await proxy.listen("127.0.0.1", port)
    b = await serve_replica("b", f"127.0.0.2:{port}")
    dns = ScriptedDns({"replicas": ["127.0.0.1", "127.0.0.2"]})
    upstream = Upstream([f"replicas:{port}"], 30.0, PLANE, resolve=dns)
    upstream.start()
    try:
        await eventually(lambda: upstream.replicas == [f"127.0.0.1:{port}", f"127.0.0.2:{port}"], "both resolved")
        # Calls that belong to no session take turns over both replicas: both connections are open.
        assert {await answered_by(upstream) for _ in range(4)} == {"a", "b"}

        proxy.freeze()  # a's host vanishes: its open connection looks fine and answers nothing
        await eventually(lambda: f"127.0.0.1:{port}" in upstream.silent, "the frozen replica found silent")
        # Every call now goes to b and is answered well within its deadline; none waits on a.
        assert [await answered_by(upstream) for _ in range(6)] == ["b"] * 6
        assert upstream.replicas == [f"127.0.0.1:{port}", f"127.0.0.2:{port}"]  # still resolved
    finally:
        await upstream.close()
        await proxy.close()
        await asyncio.gather(a.stop(None), b.stop(None))


async def test_a_scaled_service_gains_and_loses_replicas_as_its_name_resolves():
    port = shared_port()
    a = await serve_replica("a", f"127.0.0.1:{port}")
    b = await serve_replica("b", f"127.0.0.2:{port}")
    dns = ScriptedDns({"replicas": ["127.0.0.2"]})
    upstream = Upstream([f"replicas:{port}"], 30.0, PLANE, resolve=dns)
    upstream.start()
    try:
        await eventually(lambda: upstream.replicas == [f"127.0.0.2:{port}"], "b resolved")
        assert {await answered_by(upstream) for _ in range(4)} == {"b"}

        dns.answers["replicas"] = ["127.0.0.2", "127.0.0.1"]  # scaled up
        await eventually(lambda: len(upstream.replicas) == 2, "a resolved")
        assert {await answered_by(upstream) for _ in range(4)} == {"a", "b"}

        dns.answers["replicas"] = ["127.0.0.2"]  # scaled down: a leaves the name, then stops
        await eventually(lambda: upstream.replicas == [f"127.0.0.2:{port}"], "a no longer resolved")
        assert {await answered_by(upstream) for _ in range(4)} == {"b"}
        await a.stop(None)
        # Once it is also silent its channel and health check are closed: a service scaled up and
        # down for months leaves nothing behind per address it had.
        await eventually(lambda: f"127.0.0.1:{port}" not in upstream._channels, "a's channel closed")
    finally:
        await upstream.close()
        await asyncio.gather(a.stop(None), b.stop(None))

