"""SessionService's methods as operations, whichever way a call arrives.

A call comes either as a gRPC call of its own (own_calls.py) or among the gateway's calls on
its `Calls` stream (gateway_calls.py). Both serve it with the same operation: a servicer
method named after the gRPC method in snake case, which takes the typed request and what came
with it (`Incoming`), and returns the reply (or yields a streaming method's messages). How it
ended, when it did not end with a reply, is mapped to a gRPC status in one place (`ending_of`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import grpc
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from bae.common import error_codes
from bae.common.errors import BaeError
from bae.common.protos import session_pb2
from bae.common.session_routing import OWNER_KEY, call_field
from bae.services.session.engine.errors import SessionNotOpen
from bae.services.session.engine.ownership import NotOwner

SERVICE = session_pb2.DESCRIPTOR.services_by_name["SessionService"]
# The gateway's stream of calls is served by gateway_calls.py, not as an operation.
CALLS_METHOD = "Calls"
Trailers = list[tuple[str, str | bytes]]


@dataclass(slots=True)
class Incoming:
    """What came with a call besides its request, and the trailing metadata it ends with."""

    # The gateway sent the call on after a replica named this one the session's owner:
    # placement is not redone.
    redirected: bool = False
    trailers: Trailers = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Operation:
    method: str  # the gRPC method's name, "ListEvents"
    name: str  # its field in GatewayCall and GatewayReply, and the servicer method's name: "list_events"
    request: type[Message]
    reply: type[Message]
    streaming: bool
    # `serve(request, incoming)`: awaited for a unary method's reply, iterated for a streaming one's.
    # A client-streaming method's `request` is the async iterator of its messages (a call of its
    # own only: the gateway's `Calls` stream carries one request per call).
    serve: Callable[[Any, Incoming], Any]
    client_streaming: bool = False


def operations(servicer: object) -> dict[str, Operation]:
    """Every SessionService method but `Calls`, by its snake-case name, served by `servicer`.

    Raises TypeError at start-up when the servicer lacks a method the contract declares.
    """
    table: dict[str, Operation] = {}
    for method in SERVICE.methods:
        if method.name == CALLS_METHOD:
            continue
        name = call_field(method.name)
        serve = getattr(servicer, name, None)
        if serve is None:
            raise TypeError(f"{type(servicer).__name__} has no method {name} for SessionService.{method.name}")
        table[name] = Operation(
            method=method.name, name=name, request=GetMessageClass(method.input_type),
            reply=GetMessageClass(method.output_type), streaming=method.server_streaming, serve=serve,
            client_streaming=method.client_streaming,
        )
    return table


@dataclass(frozen=True, slots=True)
class Ending:
    """A call's end other than its reply: a gRPC status, its text and trailing metadata."""

    code: grpc.StatusCode
    details: str
    trailers: Trailers


def ending_of(exc: Exception) -> Ending | None:
    """How a call that raised `exc` ends; None for a failure nothing expects (a bug: log it)."""
    if isinstance(exc, NotOwner):
        # Refused before it had any effect: the gateway sends it to the owner.
        return Ending(
            grpc.StatusCode.UNAVAILABLE, f"served by the session replica at {exc.address}", [(OWNER_KEY, exc.address)]
        )
    if isinstance(exc, SessionNotOpen):
        return Ending(grpc.StatusCode.FAILED_PRECONDITION, "the session is not open", [])
    if isinstance(exc, BaeError):
        return Ending(error_codes.code_of(exc), exc.detail, [error_codes.trailer(exc)])
    return None
