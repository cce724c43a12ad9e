"""The routes the gateway answers itself, besides the API routes the declaration names: what each
is, for the router (services/gateway/app.py) and the OpenAPI document (services/gateway/openapi.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.gateway.declaration import Port


@dataclass(frozen=True)
class OwnRoute:
    ports: tuple[Port, ...]
    method: str
    path: str
    operation_id: str
    summary: str
    # The success answer: its media type and schema (a components/schemas name or an inline one); None: no body.
    media_type: str | None
    schema: str | dict[str, Any] | None
    problems: tuple[int, ...] = ()


BOTH = (Port.CLIENT, Port.ADMIN)

OWN_ROUTES = (
    OwnRoute((Port.CLIENT,), "GET", "/healthz", "healthz", "Liveness: 200, empty body", None, None),
    OwnRoute(BOTH, "GET", "/readyz", "readyz", "Readiness: the session service and the runner answer",
             "application/json", "Ready", (503,)),
    OwnRoute((Port.CLIENT,), "GET", "/api/v1/meta", "getMeta", "Server version and API versions",
             "application/json", "Meta"),
    OwnRoute(BOTH, "GET", "/openapi.json", "getOpenApiDocument", "This document (the paths this port serves)",
             "application/json", {"type": "object"}),
    OwnRoute((Port.ADMIN,), "GET", "/metrics", "getMetrics", "Prometheus metrics (text exposition format)",
             "text/plain", {"type": "string"}, (404,)),
)
