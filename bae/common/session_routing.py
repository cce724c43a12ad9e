"""How a call finds the replica that owns its session (gateway <-> session service).

A replica refuses a call for a session another replica owns with UNAVAILABLE
and the owner's address in the trailing metadata; the gateway sends the call
there instead, marked as redirected. The refusal happens before the call has
any effect, so following it never serves a call twice.
"""

from __future__ import annotations

import re

import grpc

# Trailing metadata of a refused call: the owner's host:port.
OWNER_KEY = "bae-session-owner"
# Request metadata of a call the gateway sent on after a refusal: placement is not redone.
REDIRECTED_KEY = "bae-redirected"


def owner_of(error: grpc.aio.AioRpcError) -> str | None:
    """The address a refused call should go to instead, if that is why it failed."""
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    for key, value in error.trailing_metadata() or ():
        if key == OWNER_KEY and isinstance(value, str) and value:
            return value
    return None


def was_redirected(context: grpc.aio.ServicerContext) -> bool:
    return any(key == REDIRECTED_KEY for key, _ in context.invocation_metadata() or ())


def call_field(method: str) -> str:
    """The field of GatewayCall and GatewayReply that carries `method`'s request and reply on the
    gateway's `Calls` stream (session.proto): the method's name in snake case, "ListEvents" -> "list_events"."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", method).lower()
