"""The one request middleware of both ports: request id, access log line, and (tracing on) the
`http.request` span (TELEMETRY §3.2, §3.7).

The request id is the client's `x-request-id` when it is a plain token, else a new one. It is
echoed on the response, travels to the internal services in gRPC metadata (bae.common.propagation)
and ends every log line written for the request. The access line is written when the response
has ended (for NDJSON streams, when the stream ends); the span ends when the response head
goes out, so a turn's spans outlive it.

The access line names the client by its address: the socket's peer, or, when that peer is one of
BAE_TRUSTED_PROXIES, the rightmost X-Forwarded-For entry that is not a trusted proxy (the entries
left of it were written by whoever the proxies' client was, and prove nothing).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import time
from typing import Iterator, Sequence

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bae.common import telemetry
from bae.common.propagation import request_id
from bae.common.settings import Network

access_log = logging.getLogger("bae.access")

REQUEST_ID_HEADER = b"x-request-id"
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
# Probes: never spanned, and their access lines are DEBUG so they do not drown the log.
PROBES = frozenset(("/healthz", "/readyz", "/metrics"))
# Route templates under which `{id}` is a session id.
_SESSION_ROUTES = ("/api/v1/sessions/{id}", "/admin/v1/sessions/{id}")
# Where an /rpc call leaves its JSON-RPC method for the access line (`note_rpc_method`).
_RPC_METHOD = "bae.rpc_method"
_FORWARDED_FOR = b"x-forwarded-for"
# X-Forwarded-For entries looked at, from the right: a chain of proxies is short.
MAX_FORWARDED_HOPS = 32
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def note_rpc_method(scope: Scope, method: str) -> None:
    """The /rpc endpoint says what it was asked (a declared method name, or one of the fixed words of
    docs/observability.md), never text of the request it did not recognise."""
    scope[_RPC_METHOD] = method


def _ip(text: str) -> IpAddress | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def client_address(scope: Scope, trusted: Sequence[Network]) -> str:
    """The client's address for the access line: the socket's peer, or behind trusted proxies the
    rightmost untrusted X-Forwarded-For entry. An entry that is not an IP address ends the walk
    at the last hop known; "-" when the socket has no peer address (a Unix socket)."""
    peer = scope.get("client")
    if not peer:
        return "-"
    address = _ip(peer[0])
    if address is None:
        return "-"
    if not trusted or not _is_trusted(address, trusted):
        return str(address)
    for hop in _forwarded_hops(scope["headers"]):
        forwarded = _ip(hop)
        if forwarded is None:
            break
        address = forwarded
        if not _is_trusted(address, trusted):
            break
    return str(address)


def _forwarded_hops(headers: list[tuple[bytes, bytes]]) -> Iterator[str]:
    """The X-Forwarded-For entries from the right (the last header's last entry first), at most
    MAX_FORWARDED_HOPS of them: however long the header, only its tail is split."""
    given = 0
    for name, value in reversed(headers):
        if name != _FORWARDED_FOR:
            continue
        for hop in reversed(value.rsplit(b",", MAX_FORWARDED_HOPS)):
            if given == MAX_FORWARDED_HOPS:
                return
            given += 1
            # An address is at most 45 characters (IPv6 with an IPv4 tail); longer is no address.
            yield hop.strip().decode("latin-1") if len(hop) <= 64 else ""


def _is_trusted(address: IpAddress, trusted: Sequence[Network]) -> bool:
    return any(address.version == network.version and address in network for network in trusted)


def _incoming_request_id(scope: Scope) -> str:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    for name, value in headers:
        if name == REQUEST_ID_HEADER and _REQUEST_ID.fullmatch(value):
            return value.decode("ascii")
    return os.urandom(16).hex()


def route_of(scope: Scope) -> str | None:
    """The matched route template (the router puts its MethodTable in the scope), else None."""
    return getattr(scope.get("endpoint"), "route", None)


class Observed:
    """Wraps one port's app."""

    def __init__(self, app: ASGIApp, trusted_proxies: Sequence[Network] = ()) -> None:
        self.app = app
        self.trusted_proxies = tuple(trusted_proxies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        rid = _incoming_request_id(scope)
        rid_token = request_id.set(rid)
        method, path = scope["method"], scope["path"]
        span = None
        context_token = None
        if telemetry.tracer is not None and path not in PROBES:
            carrier = {
                name.decode("latin-1"): value.decode("latin-1")
                for name, value in scope["headers"]
                if name in (b"traceparent", b"tracestate")
            }
            span = telemetry.tracer.start_span(
                method,
                context=telemetry.extract_headers(carrier),
                kind=SpanKind.SERVER,
                attributes={"http.request.method": method, "url.path": path},
            )
            context_token = otel_context.attach(trace.set_span_in_context(span))
        status = 500
        sent = 0

        async def observed_send(message: Message) -> None:
            nonlocal status, span, sent
            if message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            elif message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (REQUEST_ID_HEADER, rid.encode("ascii"))]
                if span is not None:
                    _end_span(span, scope, method, status)
                    span = None
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            if span is not None:  # no response head went out
                _end_span(span, scope, method, status)
            if context_token is not None:
                otel_context.detach(context_token)
            route = route_of(scope)
            fields = {
                "method": method,
                "route": route or "-",
                "status": status,
                "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                "response_bytes": sent,
                "client_addr": client_address(scope, self.trusted_proxies),
                "rpc_method": scope.get(_RPC_METHOD),
                "session_id": _session_id(scope, route),
                "request_id": rid,
            }
            access_log.log(logging.DEBUG if path in PROBES else logging.INFO, "access", extra={"fields": fields})
            request_id.reset(rid_token)


async def link_session_span(call: grpc.aio.UnaryUnaryCall) -> None:
    """registerDriver: the request span links to the session's span, named in the reply's trailer."""
    for key, value in await call.trailing_metadata() or ():
        if key == telemetry.SESSION_TRACEPARENT_KEY and (link := telemetry.link_to(value, "session")) is not None:
            trace.get_current_span().add_link(link.context, link.attributes)


def _session_id(scope: Scope, route: str | None) -> str | None:
    if route is not None and route.startswith(_SESSION_ROUTES):
        path_params: dict[str, str] = scope.get("path_params", {})
        return path_params.get("id")
    return None


def _end_span(span: trace.Span, scope: Scope, method: str, status: int) -> None:
    route = route_of(scope)
    if route is not None:
        span.update_name(f"{method} {route}")
        span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
    span.end()
