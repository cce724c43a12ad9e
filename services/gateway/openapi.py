"""The OpenAPI 3.1 document of both HTTP ports, served at `/openapi.json` on each.

One document describes the client and the admin API (tagged `client` and
`admin`); each port serves the subset of paths it routes. The JSON-RPC endpoint
is one POST whose response is NDJSON: one frame per line, described by
`RpcFrame`; docs/reference/rpc.md describes each method.
"""

from __future__ import annotations

from typing import Any

from bae import __version__
from bae.common.jsontext import dump
from services.gateway.declaration import RPC_METHODS

Schema = dict[str, Any]

TS = "2026-07-06T18:26:10.123Z"
PRO, KEY, SES, EVT = "pro_" + "1" * 32, "key_" + "2" * 32, "ses_" + "3" * 32, "evt_" + "4" * 32


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(required: list[str], properties: dict[str, Schema], extra: bool = False) -> Schema:
    return {"type": "object", "required": required, "properties": properties, "additionalProperties": extra}


STR, INT, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
STR_OR_NULL = {"type": ["string", "null"]}
TIMESTAMP = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$"}
TIMESTAMP_OR_NULL = {"anyOf": [TIMESTAMP, {"type": "null"}]}
NAMES = {"type": "array", "items": STR}
REDACTED_MAP = {"type": "object", "additionalProperties": {"const": "••••••••"}}  # names kept, values redacted


def page_of(item: str) -> Schema:
    return obj(["items", "next_cursor"], {"items": {"type": "array", "items": ref(item)}, "next_cursor": STR_OR_NULL})


TOOL_DEF = obj(["name"], {"name": STR, "description": STR_OR_NULL, "input_schema": {"type": "object"}}, extra=True)
PROFILE_EXAMPLE = {
    "id": PRO, "name": "main", "primary_provider": "anthropic-sonnet", "fallback_providers": [],
    "mcp_servers": ["filesystem"], "allowed_tools": ["get_current_time"], "available_sandboxes": ["python:3.12"],
    "created_at": TS, "updated_at": TS,
}
EVENT_EXAMPLE = {"id": EVT, "session_id": SES, "client_key_id": KEY, "event_type": "client.message.send",
                 "payload": {"role": "user", "content": "What time is it?"}, "created_at": TS}
OPENED_EXAMPLE = {"session_id": SES, "session_key": "bae_ses_" + "a" * 48,
                  "profile": {"id": PRO, "name": "main", "allowed_tools": ["get_current_time"],
                              "mcp_servers": [], "provider": {"provider": "anthropic", "model": "claude-sonnet-4-6"}}}

SCHEMAS: dict[str, Schema] = {
    "Problem": obj(["type", "title", "status", "detail"], {"type": STR, "title": STR, "status": INT, "detail": STR}),
    "Meta": obj(["version", "api_versions"], {"version": STR, "api_versions": NAMES}),
    "Ready": obj(["status"], {"status": {"const": "ready"}}),
    "ProfileBody": obj(["name", "primary_provider"], {
        "name": STR, "primary_provider": STR, "fallback_providers": NAMES, "mcp_servers": NAMES,
        "allowed_tools": NAMES, "available_sandboxes": NAMES}),
    "ProfileCreated": obj(["id", "name", "created_at"], {"id": STR, "name": STR, "created_at": TIMESTAMP}),
    "Profile": obj(list(PROFILE_EXAMPLE), {
        "id": STR, "name": STR, "primary_provider": STR, "fallback_providers": NAMES, "mcp_servers": NAMES,
        "allowed_tools": NAMES, "available_sandboxes": NAMES, "created_at": TIMESTAMP, "updated_at": TIMESTAMP}),
    "ProfilePage": page_of("Profile"),
    "KeyBody": obj(["name", "profile_id"], {"name": STR, "profile_id": STR}),
    "KeyCreated": obj(["id", "name", "key", "prefix", "profile_id", "created_at"], {
        "id": STR, "name": STR, "key": {"type": "string", "pattern": "^bae_[0-9a-f]{48}$"}, "prefix": STR,
        "profile_id": STR, "created_at": TIMESTAMP}),
    "Key": obj(["id", "name", "prefix", "profile_id", "created_at", "last_used_at"], {
        "id": STR, "name": STR, "prefix": STR, "profile_id": STR, "created_at": TIMESTAMP,
        "last_used_at": TIMESTAMP_OR_NULL}),
    "KeyPage": page_of("Key"),
    "SessionSummary": obj(["id", "profile_id", "state", "client_version", "created_at", "closed_at"], {
        "id": STR, "profile_id": STR, "state": {"enum": ["open", "closed", "error"]},
        "client_version": STR_OR_NULL, "created_at": TIMESTAMP, "closed_at": TIMESTAMP_OR_NULL}),
    "SessionPage": page_of("SessionSummary"),
    "Event": obj(["id", "session_id", "client_key_id", "event_type", "payload", "created_at"], {
        "id": STR, "session_id": STR, "client_key_id": STR_OR_NULL, "event_type": STR,
        "payload": {"type": "object"}, "created_at": TIMESTAMP}),
    "EventPage": page_of("Event"),
    "McpServers": obj(["items"], {"items": {"type": "array", "items": obj(["name", "transport"], {
        "name": STR, "transport": {"enum": ["stdio", "http", "sse"]}})}}),
    "Providers": obj(["items"], {"items": {"type": "array", "items": obj(["name", "provider", "model", "base_url"], {
        "name": STR, "provider": {"enum": ["anthropic", "openai"]}, "model": STR, "base_url": STR})}}),
    "Config": obj(["mcp", "providers", "telemetry"], {
        "mcp": obj(["servers"], {"servers": {"type": "array", "items": obj(
            ["name", "transport", "command", "args", "url", "headers", "env"], {
                "name": STR, "transport": STR, "command": STR_OR_NULL, "args": NAMES, "url": STR_OR_NULL,
                "headers": REDACTED_MAP, "env": REDACTED_MAP})}}),
        "providers": obj(["entries"], {"entries": {"type": "array", "items": obj(
            ["name", "provider", "model", "base_url", "auth_token"], {
                "name": STR, "provider": STR, "model": STR, "base_url": STR_OR_NULL,
                "auth_token": {"const": "••••••••"}})}}),
        "telemetry": obj(
            ["enabled", "otlp_endpoint", "otlp_headers", "sample_ratio", "service_name", "traces", "metrics"], {
                "enabled": BOOL, "otlp_endpoint": STR_OR_NULL, "otlp_headers": REDACTED_MAP,
                "sample_ratio": {"type": "number", "minimum": 0, "maximum": 1}, "service_name": STR,
                "traces": obj(["enabled"], {"enabled": BOOL}),
                "metrics": obj(["enabled", "disabled"], {"enabled": BOOL, "disabled": NAMES})})}),
    "SandboxStatus": obj(["items"], {"items": {"type": "array", "items": obj(["profile_id", "images"], {
        "profile_id": STR, "images": {"type": "array", "items": obj(["name", "status"], {
            "name": STR, "status": {"enum": ["pending", "available", "error"]}, "detail": STR})}})}}),
    "OpenSession": obj([], {
        "client_version": STR_OR_NULL, "tools": {"type": "array", "items": TOOL_DEF},
        "sandbox_tools": {"type": "array", "items": TOOL_DEF}, "subagent_tools": {"type": "array"},
        "compaction": {"anyOf": [{"type": "null"}, obj(["mode"], {
            "mode": {"enum": ["auto", "client"]}, "size": {"type": "integer", "minimum": 1000},
            "prompt": STR_OR_NULL})]}}),
    "JoinSession": obj([], {
        "client_version": STR_OR_NULL, "tools": {"type": "array", "items": TOOL_DEF},
        "sandbox_tools": {"type": "array", "items": TOOL_DEF}, "subagent_tools": {"type": "array"}}),
    "SessionOpened": obj(["session_id", "session_key", "profile"], {
        "session_id": STR, "session_key": {"type": "string", "pattern": "^bae_ses_[0-9a-f]{48}$"},
        "profile": obj(["id", "name", "allowed_tools", "mcp_servers", "provider"], {
            "id": STR, "name": STR, "allowed_tools": NAMES, "mcp_servers": NAMES,
            "provider": obj(["provider", "model"], {"provider": STR, "model": STR})})}),
    "Participants": obj(["drivers"], {"drivers": NAMES}),
    "SessionClosed": obj(["session_id", "state"], {"session_id": STR, "state": {"const": "closed"}}),
    "RpcRequest": obj(["jsonrpc", "method"], {
        "jsonrpc": {"const": "2.0"}, "id": {}, "method": {"enum": list(RPC_METHODS)}, "params": {"type": "object"}}),
    "RpcFrame": {"oneOf": [
        obj(["jsonrpc", "method", "params"], {"jsonrpc": {"const": "2.0"}, "method": {"const": "session.event"},
                                              "params": ref("Event")}),
        obj(["jsonrpc", "id", "result"], {"jsonrpc": {"const": "2.0"}, "id": {}, "result": {}}),
        obj(["jsonrpc", "error"], {"jsonrpc": {"const": "2.0"}, "id": {}, "error": obj(["code", "message"], {
            "code": INT, "message": STR, "data": {}})}),
    ]},
}


def json_body(schema: str, example: Any) -> Schema:
    return {"content": {"application/json": {"schema": ref(schema), "example": example}}}


def problems(*statuses: int) -> dict[str, Schema]:
    titles = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
              409: "Conflict", 413: "Payload Too Large", 422: "Unprocessable Entity", 429: "Too Many Requests",
              500: "Internal Server Error", 503: "Service Unavailable", 504: "Gateway Timeout"}
    slugs = {400: "bad_request", 401: "unauthorized", 403: "tool_not_allowed", 404: "not_found",
             405: "method_not_allowed", 409: "session_closed", 413: "payload_too_large", 422: "profile_unavailable",
             429: "too_many_requests", 500: "internal", 503: "service_unavailable", 504: "gateway_timeout"}
    return {str(status): {"description": titles[status], "content": {"application/problem+json": {
        "schema": ref("Problem"),
        "example": {"type": slugs[status], "title": titles[status], "status": status, "detail": "…"}}}}
        for status in (*statuses, 500)}


def ok(status: int, description: str, schema: str | None = None, example: Any = None) -> dict[str, Schema]:
    response: Schema = {"description": description}
    if schema is not None:
        response.update(json_body(schema, example))
    return {str(status): response}


def op(tag: str, summary: str, responses: dict[str, Schema], *, body: tuple[str, Any] | None = None,
       auth: str | None = None, params: list[Schema] | None = None) -> Schema:
    operation: Schema = {"tags": [tag], "summary": summary, "responses": responses}
    if body is not None:
        operation["requestBody"] = {"required": True, **json_body(*body)}
    operation["security"] = [{auth: []}] if auth else []
    if auth:
        # Every forwarded route: a busy store or an unreachable session service (503), no answer in time (504),
        # a body over BAE_MAX_BODY_BYTES (413); repeated bad admin keys are throttled (429).
        extra = problems(413, 503, 504, *((429,) if auth == "adminKey" else ()))
        operation["responses"] = {**responses, **{k: v for k, v in extra.items() if k not in responses}}
    if params:
        operation["parameters"] = params
    return operation


ID = {"name": "id", "in": "path", "required": True, "schema": STR}
PAGING = [{"name": "cursor", "in": "query", "schema": STR, "description": "next_cursor of the previous page"},
          {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1},
           "description": "page size, default 50, clamped to 200"}]
STATE = {"name": "state", "in": "query", "schema": {"enum": ["", "open", "closed", "error"]}}
NO_CONTENT = {"204": {"description": "done; no body"}}
PROFILE_BODY = ("ProfileBody", {"name": "main", "primary_provider": "anthropic-sonnet",
                                "allowed_tools": ["get_current_time"]})
HEALTHZ = {"get": op("client", "Liveness: 200, empty body", {"200": {"description": "alive"}})}
READYZ = {"get": op("operations", "Readiness: the session service and the runner answer", {
    **ok(200, "ready", "Ready", {"status": "ready"}), **problems(503)})}
OPENAPI = {"get": op("operations", "This document (the paths this port serves)", {
    "200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}}})}

CLIENT_PATHS: dict[str, Schema] = {
    "/healthz": HEALTHZ,
    "/readyz": READYZ,
    "/openapi.json": OPENAPI,
    "/api/v1/meta": {"get": op("client", "Server version and API versions", ok(
        200, "versions", "Meta", {"version": __version__, "api_versions": ["v1"]}))},
    "/api/v1/sessions": {"post": op(
        "client", "Open a session (client key)",
        {**ok(201, "opened", "SessionOpened", OPENED_EXAMPLE), **problems(400, 401, 403, 422)},
        body=("OpenSession", {"client_version": "1.0.0", "tools": [
            {"name": "get_current_time", "description": "The time", "input_schema": {"type": "object"}}]}),
        auth="clientKey")},
    "/api/v1/sessions/{id}/join": {"post": op(
        "client", "Join a session with another client key on the same profile",
        {**ok(201, "joined", "SessionOpened", OPENED_EXAMPLE), **problems(400, 401, 403, 404, 409, 422)},
        body=("JoinSession", {"tools": []}), auth="clientKey", params=[ID])},
    "/api/v1/sessions/{id}/participants": {"get": op(
        "client", "The client key ids registered as drivers", {
            **ok(200, "drivers", "Participants", {"drivers": [KEY]}), **problems(401, 404)},
        auth="sessionKey", params=[ID])},
    "/api/v1/sessions/{id}/events": {"get": op(
        "client", "The session's full event history, oldest first", {
            **ok(200, "a page of events", "EventPage", {"items": [EVENT_EXAMPLE], "next_cursor": None}),
            **problems(400, 401)}, auth="sessionKey", params=[ID, *PAGING])},
    "/api/v1/sessions/{id}": {"delete": op(
        "client", "Close the session", {
            **ok(200, "closed", "SessionClosed", {"session_id": SES, "state": "closed"}), **problems(401, 409)},
        auth="sessionKey", params=[ID])},
    "/api/v1/sessions/{id}/rpc": {"post": op(
        "client", "JSON-RPC 2.0 over NDJSON: one request in, a stream of frames out (docs/reference/rpc.md)",
        {"200": {
            "description": "NDJSON: zero or more `session.event` notifications, then the frame with the request id",
            "content": {"application/x-ndjson": {"schema": ref("RpcFrame"), "example": {
                "jsonrpc": "2.0", "method": "session.event", "params": EVENT_EXAMPLE}}}}, **problems(401)},
        body=("RpcRequest", {"jsonrpc": "2.0", "id": 1, "method": "session.sendMessage",
                             "params": {"message": {"role": "user", "content": "What time is it?"}}}),
        auth="sessionKey", params=[ID])},
}

ADMIN_PATHS: dict[str, Schema] = {
    "/readyz": READYZ,
    "/openapi.json": OPENAPI,
    "/metrics": {"get": op("operations", "Prometheus metrics (text exposition format)", {
        "200": {"description": "metrics", "content": {"text/plain": {"schema": STR}}}})},
    "/admin/v1/profiles": {
        "post": op("admin", "Create a profile", {
            **ok(201, "created", "ProfileCreated", {"id": PRO, "name": "main", "created_at": TS}),
            **problems(400, 401, 409)}, body=PROFILE_BODY, auth="adminKey"),
        "get": op("admin", "List profiles", {
            **ok(200, "a page", "ProfilePage", {"items": [PROFILE_EXAMPLE], "next_cursor": None}),
            **problems(400, 401)}, auth="adminKey", params=PAGING),
    },
    "/admin/v1/profiles/{id}": {
        "get": op("admin", "Get a profile", {**ok(200, "the profile", "Profile", PROFILE_EXAMPLE),
                                             **problems(401, 404)}, auth="adminKey", params=[ID]),
        "put": op("admin", "Replace a profile (omitted lists become [])", {
            **ok(200, "the profile", "Profile", PROFILE_EXAMPLE), **problems(400, 401, 404, 409)},
            body=PROFILE_BODY, auth="adminKey", params=[ID]),
        "delete": op("admin", "Delete a profile (409 profile_in_use while it has active keys)", {
            **NO_CONTENT, **problems(401, 404, 409)}, auth="adminKey", params=[ID]),
    },
    "/admin/v1/keys": {
        "post": op("admin", "Create a client key (the plaintext `key` is shown once)", {
            **ok(201, "created", "KeyCreated", {"id": KEY, "name": "laptop", "key": "bae_" + "b" * 48,
                                                "prefix": "bae_bbbb", "profile_id": PRO, "created_at": TS}),
            **problems(400, 401, 422)}, body=("KeyBody", {"name": "laptop", "profile_id": PRO}), auth="adminKey"),
        "get": op("admin", "List active client keys", {
            **ok(200, "a page", "KeyPage", {"items": [{"id": KEY, "name": "laptop", "prefix": "bae_bbbb",
                                                       "profile_id": PRO, "created_at": TS, "last_used_at": None}],
                                            "next_cursor": None}),
            **problems(400, 401)}, auth="adminKey", params=PAGING),
    },
    "/admin/v1/keys/{id}": {"delete": op(
        "admin", "Revoke a client key, its session keys, and close sessions left without keys",
        {**NO_CONTENT, **problems(401, 404)}, auth="adminKey", params=[ID])},
    "/admin/v1/sessions": {"get": op("admin", "List sessions", {
        **ok(200, "a page", "SessionPage", {"items": [{
            "id": SES, "profile_id": PRO, "state": "open", "client_version": "1.0.0", "created_at": TS,
            "closed_at": None}], "next_cursor": "2"}),
        **problems(400, 401)}, auth="adminKey", params=[*PAGING, STATE])},
    "/admin/v1/sessions/{id}/events": {"get": op("admin", "A session's events (any state)", {
        **ok(200, "a page", "EventPage", {"items": [EVENT_EXAMPLE], "next_cursor": None}),
        **problems(400, 401, 404)}, auth="adminKey", params=[ID, *PAGING])},
    "/admin/v1/mcp-servers": {"get": op("admin", "The MCP registry, sorted by name", {
        **ok(200, "servers", "McpServers", {"items": [{"name": "filesystem", "transport": "stdio"}]}),
        **problems(401)}, auth="adminKey")},
    "/admin/v1/providers": {"get": op("admin", "The provider registry, sorted by name", {
        **ok(200, "providers", "Providers", {"items": [{"name": "anthropic-sonnet", "provider": "anthropic",
                                                       "model": "claude-sonnet-4-6",
                                                       "base_url": "https://api.anthropic.com"}]}),
        **problems(401)}, auth="adminKey")},
    "/admin/v1/config": {"get": op("admin", "The loaded bae-config.toml, every secret redacted", {
        **ok(200, "config", "Config", {
            "mcp": {"servers": [{"name": "filesystem", "transport": "stdio", "command": "npx",
                                 "args": ["-y", "@modelcontextprotocol/server-filesystem", "/data"], "url": None,
                                 "headers": {}, "env": {"NODE_OPTIONS": "••••••••"}}]},
            "providers": {"entries": [{"name": "anthropic-sonnet", "provider": "anthropic",
                                       "model": "claude-sonnet-4-6", "base_url": None, "auth_token": "••••••••"}]},
            "telemetry": {"enabled": False, "otlp_endpoint": None, "otlp_headers": {}, "sample_ratio": 1.0,
                          "service_name": "bae", "traces": {"enabled": True},
                          "metrics": {"enabled": True, "disabled": []}}}),
        **problems(401)}, auth="adminKey")},
    "/admin/v1/sandbox-status": {"get": op("admin", "Sandbox image provisioning, per profile", {
        **ok(200, "status", "SandboxStatus", {"items": [{"profile_id": PRO, "images": [
            {"name": "python:3.12", "status": "available"},
            {"name": "nope:1", "status": "error", "detail": "pull failed"}]}]}),
        **problems(401)}, auth="adminKey")},
}

SECURITY = {
    "clientKey": {"type": "http", "scheme": "bearer", "description": "a client key, `bae_…` (admin-issued)"},
    "sessionKey": {"type": "http", "scheme": "bearer",
                   "description": "a session key, `bae_ses_…`, bound to the session in the path"},
    "adminKey": {"type": "http", "scheme": "bearer", "description": "an admin key, `bae_admin_…`"},
}


def document(paths: dict[str, Schema], port: str) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": f"BAE {port} API", "version": __version__,
                 "description": "BAE, the Better Agent Engine. Reference: docs/reference/."},
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "paths": paths,
        "components": {"schemas": SCHEMAS, "securitySchemes": SECURITY},
    }


CLIENT_DOCUMENT = dump(document(CLIENT_PATHS, "client"))
ADMIN_DOCUMENT = dump(document(ADMIN_PATHS, "admin"))
