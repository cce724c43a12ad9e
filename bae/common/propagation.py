"""What travels with a call between services in gRPC metadata: the request id of the client's
HTTP request (for log lines) and, when tracing is on, the W3C trace context.

The gateway sets the request id per HTTP request; every internal channel sends it on; every gRPC server binds it (and the trace context) for the handler's task, so tasks the
handler spawns carry it too.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Sequence

from bae.common import telemetry

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


def add_outgoing(metadata: list[tuple[str, str | bytes]]) -> None:
    """Client side: append the current request id and trace context to a call's metadata."""
    current = request_id.get()
    if current is not None:
        metadata.append((REQUEST_ID_KEY, current))
    telemetry.inject(metadata)
