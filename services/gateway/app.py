"""The two ports' route tables (SERVER-SPEC §1): no route is shared between them."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Router

from bae import API_VERSIONS, __version__
from bae.jsontext import dump
from services.gateway.responses import JSON
from services.gateway.rest import forward
from services.gateway.router import build_router
from services.gateway.rpc import RpcEndpoint
from services.gateway.upstream import Upstream

META = dump({"version": __version__, "api_versions": list(API_VERSIONS)})


async def healthz(request: Request) -> Response:
    return Response()


async def meta(request: Request) -> Response:
    return Response(META, media_type=JSON)


def client_app(upstream: Upstream, rpc: RpcEndpoint) -> Router:
    # Starlette tries the routes in order (none overlap): the busiest come first.
    return build_router(
        {
            "/api/v1/sessions/{id}/rpc": {"POST": rpc},
            "/api/v1/sessions/{id}/events": {"GET": forward(upstream, "ListEvents")},
            "/api/v1/sessions": {"POST": forward(upstream, "OpenSession", 201)},
            "/api/v1/sessions/{id}": {"DELETE": forward(upstream, "CloseSession")},
            "/api/v1/sessions/{id}/join": {"POST": forward(upstream, "JoinSession", 201)},
            "/api/v1/sessions/{id}/participants": {"GET": forward(upstream, "ListParticipants")},
            "/healthz": {"GET": healthz},
            "/api/v1/meta": {"GET": meta},
        }
    )


def admin_app(upstream: Upstream) -> Router:
    return build_router(
        {
            "/admin/v1/profiles": {
                "POST": forward(upstream, "CreateProfile", 201),
                "GET": forward(upstream, "ListProfiles"),
            },
            "/admin/v1/profiles/{id}": {
                "GET": forward(upstream, "GetProfile"),
                "PUT": forward(upstream, "ReplaceProfile"),
                "DELETE": forward(upstream, "DeleteProfile", 204),
            },
            "/admin/v1/keys": {
                "POST": forward(upstream, "CreateKey", 201),
                "GET": forward(upstream, "ListKeys"),
            },
            "/admin/v1/keys/{id}": {"DELETE": forward(upstream, "RevokeKey", 204)},
            "/admin/v1/sessions": {"GET": forward(upstream, "ListSessions")},
            "/admin/v1/sessions/{id}/events": {"GET": forward(upstream, "ListSessionEvents")},
            "/admin/v1/mcp-servers": {"GET": forward(upstream, "ListMcpServers")},
            "/admin/v1/providers": {"GET": forward(upstream, "ListProviders")},
            "/admin/v1/config": {"GET": forward(upstream, "GetConfig")},
            "/admin/v1/sandbox-status": {"GET": forward(upstream, "GetSandboxStatus")},
        }
    )
