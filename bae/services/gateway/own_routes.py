"""The routes the gateway answers itself, besides the API routes the declaration names: what each
is, for the router (bae/services/gateway/app.py) and the OpenAPI document (bae/services/gateway/openapi.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bae.common.protos import edge_pb2
from bae.services.gateway.declaration import Port


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
    # The credential it takes; None: it takes none.
    credential: edge_pb2.CredentialKind.ValueType | None = None
    # Its OpenAPI parameters (query and header) besides the path's `id`.
    parameters: tuple[dict[str, Any], ...] = ()


BOTH = (Port.CLIENT, Port.ADMIN)

SSE_DESCRIPTION = (
    "Server-Sent Events: each event `id: <event id>`, `event: session.event`, `data: <event JSON as GET .../events "
    "shows it>`; with deltas=true each delta `event: session.delta`, `data: {\"session_id\",\"request_event_id\","
    "\"seq\",\"index\",\"kind\",\"text\"}` (no id); a comment line every 15 s. Ends when the session closes or the key "
    "is revoked (docs/reference/rest.md)"
)
EVENT_STREAM_PARAMETERS = (
    {"name": "since_event_id", "in": "query", "required": False, "schema": {"type": "string", "maxLength": 256},
     "description": "Replay the stored events after this one first"},
    {"name": "deltas", "in": "query", "required": False, "schema": {"type": "string", "enum": ["true", "false"]},
     "description": "Also stream session.delta (provider output as it is generated); default false"},
    {"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "string", "maxLength": 256},
     "description": "Resume after this event (sent by a reconnecting client); wins over since_event_id"},
)

OWN_ROUTES = (
    OwnRoute(BOTH, "GET", "/healthz", "healthz", "Liveness: 200, empty body", None, None),
    OwnRoute(BOTH, "GET", "/readyz", "readyz", "Readiness: the session service and the runner answer",
             "application/json", "Ready", (503,)),
    OwnRoute((Port.CLIENT,), "GET", "/api/v1/meta", "getMeta", "Server version and API versions",
             "application/json", "Meta"),
    OwnRoute(BOTH, "GET", "/openapi.json", "getOpenApiDocument", "This document (the paths this port serves)",
             "application/json", {"type": "object"}),
    OwnRoute((Port.ADMIN,), "GET", "/metrics", "getMetrics", "Prometheus metrics (text exposition format)",
             "text/plain", {"type": "string"}, (404,)),
    OwnRoute((Port.CLIENT,), "GET", "/api/v1/sessions/{id}/events/stream", "streamSessionEvents",
             "The session's events (and deltas) as they happen, as Server-Sent Events (session key)",
             "text/event-stream", {"type": "string", "description": SSE_DESCRIPTION}, (400, 401, 429),
             edge_pb2.SESSION_KEY, EVENT_STREAM_PARAMETERS),
    OwnRoute((Port.ADMIN,), "GET", "/admin/v1/sessions/{id}/events/stream", "watchSessionEvents",
             "A session's events (and deltas) as they happen, as Server-Sent Events (admin token; any state)",
             "text/event-stream", {"type": "string", "description": SSE_DESCRIPTION}, (400, 401, 404),
             edge_pb2.ADMIN_KEY, EVENT_STREAM_PARAMETERS),
)
