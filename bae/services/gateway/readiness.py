"""GET /readyz on both ports: can this gateway serve requests now?

`/healthz` stays liveness (the process answers). `/readyz` asks the session service and the
runner for their gRPC health: 200 `{"status":"ready"}` when both serve, else 503 with a
problem whose detail says which is unreachable (no session service: nothing works; no
runner: turns cannot run). The detail never holds an internal address (docs/security.md):
the address goes to the gateway's log, once each time readiness changes.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from starlette.requests import Request
from starlette.responses import Response

from bae.common.errors import Unavailable
from bae.common.grpcutil import channel
from bae.common.internal import InternalPlane
from bae.common.jsontext import dump
from bae.services.gateway.problems import JSON, error_response
from bae.services.gateway.upstream import Upstream

log = logging.getLogger("bae.gateway")

READY = dump({"status": "ready"})
SESSIONS_DOWN = "not ready: session service unreachable"
RUNNER_DOWN = "not ready: runner unreachable; turns cannot run"
# A probe must answer quickly even when a dependency hangs.
CHECK_TIMEOUT = 1.0


async def _serving(stub: health_pb2_grpc.HealthStub) -> bool:
    try:
        reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=CHECK_TIMEOUT)
    except grpc.aio.AioRpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


class Readiness:
    def __init__(self, sessions: Upstream, runner_addr: str, plane: InternalPlane) -> None:
        self.sessions = sessions
        self.runner_addr = runner_addr
        self.runner_channel = channel(runner_addr, plane)
        self.runner = health_pb2_grpc.HealthStub(self.runner_channel)
        # The last answer's detail (None: ready), so probes polled every few seconds log a change once.
        self._last: str | None = None

    async def close(self) -> None:
        await self.runner_channel.close()

    async def __call__(self, request: Request) -> Response:
        # Ready while any session replica serves: the others' sessions move to it.
        checks = [_serving(health_pb2_grpc.HealthStub(self.sessions.channel(r))) for r in self.sessions.replicas]
        runner_ok, *sessions_ok = await asyncio.gather(_serving(self.runner), *checks)
        if not any(sessions_ok):
            detail, address = SESSIONS_DOWN, self.sessions.address
        elif not runner_ok:
            detail, address = RUNNER_DOWN, self.runner_addr
        else:
            if self._last is not None:
                log.info("ready again")
            self._last = None
            return Response(READY, media_type=JSON)
        if detail != self._last:
            log.warning("%s (at %s)", detail, address)
        self._last = detail
        return error_response(Unavailable(detail))
