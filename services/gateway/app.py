"""The two ports' route tables (SERVER-SPEC §1): no route is shared between them."""

from __future__ import annotations

from services.gateway import http
from services.gateway.http import Request, Send
from services.gateway.rest import forward
from services.gateway.router import Router
from services.gateway.rpc import RpcEndpoint
from services.gateway.upstream import Upstream

VERSION = "0.1.0"
META = b'{"version":"' + VERSION.encode() + b'","api_versions":["v1"]}'


async def healthz(request: Request, send: Send) -> None:
    await http.respond(send, 200, b"", None)


async def meta(request: Request, send: Send) -> None:
    await http.respond(send, 200, META)


def client_app(upstream: Upstream, rpc: RpcEndpoint) -> Router:
    return Router(
        {
            "/healthz": {"GET": healthz},
            "/api/v1/meta": {"GET": meta},
            "/api/v1/sessions": {"POST": forward(upstream, "OpenSession", 201)},
            "/api/v1/sessions/{id}": {"DELETE": forward(upstream, "CloseSession")},
            "/api/v1/sessions/{id}/join": {"POST": forward(upstream, "JoinSession", 201)},
            "/api/v1/sessions/{id}/participants": {"GET": forward(upstream, "ListParticipants")},
            "/api/v1/sessions/{id}/events": {"GET": forward(upstream, "ListEvents")},
            "/api/v1/sessions/{id}/rpc": {"POST": rpc},
        }
    )


def admin_app(upstream: Upstream) -> Router:
    return Router(
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
