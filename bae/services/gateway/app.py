"""The two ports' route tables (SERVER-SPEC §1): no route is shared between them.

The API routes come from the declaration (bae/services/gateway/declaration.py), the routes the
gateway answers itself from own_routes.py.
"""

from __future__ import annotations

from typing import Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Router

from bae import API_VERSIONS, __version__
from bae.common.jsontext import dump
from bae.services.gateway.declaration import Port, routes_of
from bae.services.gateway.event_stream import EventStreamEndpoint
from bae.services.gateway.openapi import ADMIN_DOCUMENT, CLIENT_DOCUMENT
from bae.services.gateway.own_routes import OWN_ROUTES
from bae.services.gateway.problems import JSON
from bae.services.gateway.prometheus import MetricsEndpoint
from bae.services.gateway.readiness import Readiness
from bae.services.gateway.rest import RestEndpoint
from bae.services.gateway.router import Endpoint, build_router
from bae.services.gateway.rpc import RpcEndpoint

META = dump({"version": __version__, "api_versions": list(API_VERSIONS)})
RPC_PATH = "/api/v1/sessions/{id}/rpc"


async def healthz(request: Request) -> Response:
    return Response()


async def meta(request: Request) -> Response:
    return Response(META, media_type=JSON)


def openapi(document: str) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        return Response(document, media_type=JSON)

    return endpoint


def own_routes(
    port: Port, readyz: Readiness, metrics: MetricsEndpoint | None, rpc: RpcEndpoint
) -> dict[str, dict[str, Endpoint]]:
    """The endpoints of what the gateway answers itself on `port` (own_routes.py lists them). The
    admin port's event streams share the client port's relays (`rpc`)."""
    document = CLIENT_DOCUMENT if port is Port.CLIENT else ADMIN_DOCUMENT
    endpoints: dict[str, Endpoint | None] = {
        "healthz": healthz, "readyz": readyz, "getMeta": meta, "getOpenApiDocument": openapi(document),
        "getMetrics": metrics, "streamSessionEvents": EventStreamEndpoint(rpc, admin=False),
        "watchSessionEvents": EventStreamEndpoint(rpc, admin=True),
    }
    table: dict[str, dict[str, Endpoint]] = {}
    for route in OWN_ROUTES:
        endpoint = endpoints[route.operation_id]
        if port in route.ports and endpoint is not None:
            table.setdefault(route.path, {})[route.method] = endpoint
    return table


def _api_routes(port: Port, rest: RestEndpoint) -> dict[str, dict[str, Endpoint]]:
    table: dict[str, dict[str, Endpoint]] = {}
    for route in routes_of(port):
        table.setdefault(route.path, {})[route.method] = rest(route)
    return table


def client_app(rest: RestEndpoint, rpc: RpcEndpoint, readyz: Readiness) -> Router:
    # Starlette tries the routes in order (none overlap): the busiest come first.
    return build_router({RPC_PATH: {"POST": rpc}, **_api_routes(Port.CLIENT, rest), **own_routes(Port.CLIENT, readyz, None, rpc)})


def admin_app(
    rest: RestEndpoint, rpc: RpcEndpoint, readyz: Readiness, metrics: MetricsEndpoint, console: Sequence[BaseRoute]
) -> Router:
    """`console`: the web console's routes (bae/services/gateway/console), none when BAE_CONSOLE=0."""
    return build_router({**_api_routes(Port.ADMIN, rest), **own_routes(Port.ADMIN, readyz, metrics, rpc)}, console)
