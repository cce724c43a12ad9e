"""What travels with a call between services in gRPC metadata: the request id of the client's
HTTP request (for log lines) and, when tracing is on, the W3C trace context.

The gateway sets the request id per HTTP request; every internal channel's interceptor sends
it on; every gRPC server binds it (and the trace context) for the handler's task, so tasks the
handler spawns carry it too.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Sequence

import grpc

from bae import telemetry
from bae.call_metadata import metadata_interceptors

REQUEST_ID_KEY = "bae-request-id"

request_id: ContextVar[str | None] = ContextVar("bae_request_id", default=None)


def bind_incoming(metadata: Sequence[tuple[str, str | bytes]] | None) -> None:
    """Server side, at the start of a handler: adopt the caller's request id and trace context."""
    if not metadata:
        return
    for key, value in metadata:
        if key == REQUEST_ID_KEY and isinstance(value, str):
            request_id.set(value)
            break
    telemetry.attach_incoming(metadata)


def _with_context(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    metadata = list(details.metadata or ())
    current = request_id.get()
    if current is not None:
        metadata.append((REQUEST_ID_KEY, current))
    telemetry.inject(metadata)
    if not metadata:
        return details
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, grpc.aio.Metadata(*metadata), details.credentials, details.wait_for_ready
    )


def outgoing_context() -> list[grpc.aio.ClientInterceptor]:
    """Client side: interceptors that add the request id and trace context to every call of a channel."""
    return metadata_interceptors(_with_context)
