"""The internal gRPC plane: the shared token every internal call carries, and keepalive both ends agree on.

Every service (session, runner, sandbox) refuses a call without the token
(`BAE_INTERNAL_TOKEN`); only the gRPC health service stays open, for probes.
Every internal channel sends it. The token proves "one of our services", not
a user: admin calls still need the admin key, session calls a session key.

Keepalive: a channel pings a quiet connection every `keepalive` seconds so a
dead peer is noticed; servers accept pings that often. Without that a server
keeps gRPC's 5-minute minimum, answers GOAWAY `too_many_pings`, and every
idle stream (a quiet subscription, a long sandbox command) dies.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

import grpc

from bae.common.errors import UsageError
from bae.common.settings import MIN_INTERNAL_TOKEN_CHARS, Settings

TOKEN_METADATA = "bae-internal-token"
HEALTH_METHOD_PREFIX = "/grpc.health.v1.Health/"
# How long a ping may go unanswered before the connection counts as dead.
KEEPALIVE_TIMEOUT_MS = 20_000


@dataclass(frozen=True)
class InternalPlane:
    token: str
    keepalive: float  # seconds between pings on a connection with calls but no data

    @classmethod
    def of(cls, settings: Settings) -> "InternalPlane":
        if settings.internal_token is None:
            raise UsageError(
                "BAE_INTERNAL_TOKEN: not set; every internal gRPC call must carry this shared token "
                f"(at least {MIN_INTERNAL_TOKEN_CHARS} characters, e.g. `openssl rand -hex 32`; `make run` generates one)"
            )
        return cls(settings.internal_token, settings.grpc_keepalive)

    def channel_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.keepalive_time_ms", int(self.keepalive * 1000)),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            # Keep pinging a stream that carries no data (the default stops after two pings).
            ("grpc.http2.max_pings_without_data", 0),
        ]

    def server_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.keepalive_permit_without_calls", 1),
            # Half the interval: a ping that arrives a little early is never a strike.
            ("grpc.http2.min_ping_interval_without_data_ms", int(self.keepalive * 1000) // 2),
            ("grpc.http2.max_ping_strikes", 2),
        ]

    @property
    def token_metadata(self) -> tuple[str, str]:
        """The metadata entry every internal call carries."""
        return (TOKEN_METADATA, self.token)

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [_RequireToken(self.token)]


class _RequireToken(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpcio has no type stubs: Any
    """Refuses every call but a health check unless it carries the token (compared in constant time)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid internal token")

        self._refusal = grpc.unary_unary_rpc_method_handler(refuse)

    def _carries_token(self, metadata: Any) -> bool:
        for key, value in metadata or ():
            if key == TOKEN_METADATA:
                presented = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(presented, self._token)
        return False

    async def intercept_service(self, continuation: Any, handler_call_details: grpc.HandlerCallDetails) -> Any:
        if handler_call_details.method.startswith(HEALTH_METHOD_PREFIX) or self._carries_token(
            handler_call_details.invocation_metadata
        ):
            return await continuation(handler_call_details)
        return self._refusal
