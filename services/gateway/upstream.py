"""The one connection to the session service and how its failures read over HTTP."""

from __future__ import annotations

from typing import TypedDict

import logging
from dataclasses import dataclass

import grpc
from starlette.requests import Request

from bae.errors import Problem, internal
from bae.grpcutil import channel
from bae.internal import InternalPlane
from bae.protos import session_pb2_grpc

log = logging.getLogger("bae.gateway")


class Credentials(TypedDict):
    authorization: str
    has_authorization: bool


def credentials(request: Request) -> Credentials:
    """The request's credentials as RestRequest/RpcRequest fields: the session service authenticates."""
    authorization = request.headers.get("authorization")
    return {"authorization": authorization or "", "has_authorization": authorization is not None}


@dataclass
class Upstream:
    """A shared channel and stub; every request of both ports goes through it."""

    address: str
    timeout: float
    channel: grpc.aio.Channel
    stub: session_pb2_grpc.SessionServiceStub

    @classmethod
    def connect(cls, address: str, timeout: float, plane: InternalPlane) -> "Upstream":
        # Must run inside the event loop that will use the channel (grpc.aio binds to it).
        chan = channel(address, plane)
        return cls(address, timeout, chan, session_pb2_grpc.SessionServiceStub(chan))

    async def close(self) -> None:
        await self.channel.close()

    def failure(self, error: grpc.aio.AioRpcError) -> Problem:
        """The HTTP problem for a failed call: the service's own, or a generic one that names the outage.

        Addresses and gRPC's own texts go to the log only, never to the client.
        """
        try:
            problem = Problem.from_rpc_error(error)
        except (ValueError, KeyError, TypeError):
            log.error("session service sent a malformed problem trailer: %s", error.details())
            return internal()
        if problem is not None:
            return problem
        code = error.code()
        log.error("session service at %s: call failed: %s %s", self.address, code.name, error.details())
        if code == grpc.StatusCode.UNAVAILABLE:
            return Problem(503, "service_unavailable", "the session service is unavailable; try again shortly")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Problem(504, "gateway_timeout", f"the session service did not answer within {self.timeout:g}s")
        return internal()
