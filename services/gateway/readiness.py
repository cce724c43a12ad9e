"""GET /readyz on both ports: can this gateway serve requests now?

`/healthz` stays liveness (the process answers). `/readyz` asks the session service and the
runner for their gRPC health: 200 `{"status":"ready"}` when both serve, else 503 with a
problem whose detail names what is unreachable (no session service: nothing works; no
runner: turns cannot run).
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from starlette.requests import Request
from starlette.responses import Response

from bae.errors import Problem
from bae.grpcutil import channel
from bae.internal import InternalPlane
from bae.jsontext import dump
from services.gateway.responses import JSON, problem_response
from services.gateway.upstream import Upstream

READY = dump({"status": "ready"})
# A probe must answer quickly even when a dependency hangs.
CHECK_TIMEOUT = 1.0


async def _serving(stub: health_pb2_grpc.HealthStub) -> bool:
    try:
        reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=CHECK_TIMEOUT)
    except grpc.aio.AioRpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


class Readiness:
    def __init__(self, sessions: Upstream, runner_addr: str, plane: InternalPlane) -> None:
        self.sessions = sessions
        self.runner_addr = runner_addr
        self.runner_channel = channel(runner_addr, plane)
        self.runner = health_pb2_grpc.HealthStub(self.runner_channel)

    async def close(self) -> None:
        await self.runner_channel.close()

    async def __call__(self, request: Request) -> Response:
        # Ready while any session replica serves: the others' sessions move to it.
        checks = [_serving(health_pb2_grpc.HealthStub(self.sessions.channel(t))) for t in self.sessions.targets]
        runner_ok, *sessions_ok = await asyncio.gather(_serving(self.runner), *checks)
        if not any(sessions_ok):
            detail = f"not ready: session service unreachable at {self.sessions.address}"
        elif not runner_ok:
            detail = f"not ready: runner unreachable at {self.runner_addr}; turns cannot run"
        else:
            return Response(READY, media_type=JSON)
        return problem_response(Problem(503, "service_unavailable", detail))
