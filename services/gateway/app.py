"""The two ports' route tables (SERVER-SPEC §1): no route is shared between them."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Router

from bae import API_VERSIONS, __version__
from bae.common.jsontext import dump
from services.gateway.body import ADMIN_KEY, CLIENT_KEY, SESSION_KEY
from services.gateway.openapi import ADMIN_DOCUMENT, CLIENT_DOCUMENT
from services.gateway.responses import JSON
from services.gateway.prometheus import MetricsEndpoint
from services.gateway.readiness import Readiness
from services.gateway.rest import Forwarder
from services.gateway.router import Endpoint, build_router
from services.gateway.rpc import RpcEndpoint

META = dump({"version": __version__, "api_versions": list(API_VERSIONS)})


async def healthz(request: Request) -> Response:
    return Response()


async def meta(request: Request) -> Response:
    return Response(META, media_type=JSON)


def openapi(document: str) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        return Response(document, media_type=JSON)

    return endpoint


def client_app(forward: Forwarder, rpc: RpcEndpoint, readyz: Readiness) -> Router:
    # Starlette tries the routes in order (none overlap): the busiest come first.
    return build_router(
        {
            "/api/v1/sessions/{id}/rpc": {"POST": rpc},
            "/api/v1/sessions/{id}/events": {"GET": forward("ListEvents", SESSION_KEY)},
            "/api/v1/sessions": {"POST": forward("OpenSession", CLIENT_KEY, 201)},
            "/api/v1/sessions/{id}": {"DELETE": forward("CloseSession", SESSION_KEY)},
            "/api/v1/sessions/{id}/join": {"POST": forward("JoinSession", CLIENT_KEY, 201)},
            "/api/v1/sessions/{id}/participants": {"GET": forward("ListParticipants", SESSION_KEY)},
            "/healthz": {"GET": healthz},
            "/readyz": {"GET": readyz},
            "/api/v1/meta": {"GET": meta},
            "/openapi.json": {"GET": openapi(CLIENT_DOCUMENT)},
        }
    )


def admin_app(forward: Forwarder, readyz: Readiness, metrics: MetricsEndpoint) -> Router:
    return build_router(
        {
            "/admin/v1/profiles": {
                "POST": forward("CreateProfile", ADMIN_KEY, 201),
                "GET": forward("ListProfiles", ADMIN_KEY),
            },
            "/admin/v1/profiles/{id}": {
                "GET": forward("GetProfile", ADMIN_KEY),
                "PUT": forward("ReplaceProfile", ADMIN_KEY),
                "DELETE": forward("DeleteProfile", ADMIN_KEY, 204),
            },
            "/admin/v1/keys": {
                "POST": forward("CreateKey", ADMIN_KEY, 201),
                "GET": forward("ListKeys", ADMIN_KEY),
            },
            "/admin/v1/keys/{id}": {"DELETE": forward("RevokeKey", ADMIN_KEY, 204)},
            "/admin/v1/sessions": {"GET": forward("ListSessions", ADMIN_KEY)},
            "/admin/v1/sessions/{id}/events": {"GET": forward("ListSessionEvents", ADMIN_KEY)},
            "/admin/v1/mcp-servers": {"GET": forward("ListMcpServers", ADMIN_KEY)},
            "/admin/v1/providers": {"GET": forward("ListProviders", ADMIN_KEY)},
            "/admin/v1/config": {"GET": forward("GetConfig", ADMIN_KEY)},
            "/admin/v1/sandbox-status": {"GET": forward("GetSandboxStatus", ADMIN_KEY)},
            "/readyz": {"GET": readyz},
            "/metrics": {"GET": metrics},
            "/openapi.json": {"GET": openapi(ADMIN_DOCUMENT)},
        }
    )
