"""The OpenAPI 3.1 document of each HTTP port, served at `/openapi.json`, generated from the same
declaration the gateway serves (bae/services/gateway/declaration.py) and the JSON rules of each field
(edge.proto), plus the routes the gateway answers itself (bae/services/gateway/own_routes.py).

Each port's document holds the paths it serves. Every REST route is one operation (its
operationId is its SessionService method); `POST /api/v1/sessions/{id}/rpc` is one operation whose
request is a oneOf over the JSON-RPC methods and whose NDJSON frames are an anyOf over the event
notification, each method's result frame and the error frame.
"""

from __future__ import annotations

from typing import Any, Callable

from google.protobuf.descriptor import FieldDescriptor

from bae import __version__
from bae.common.jsontext import dump, load
from bae.common.protos import client_api_pb2, edge_pb2
from bae.services.gateway.declaration import RPC_METHODS, Port, Route, routes_of
from bae.services.gateway.own_routes import OWN_ROUTES, OwnRoute
from bae.services.gateway.problems import JSON, TITLES

Schema = dict[str, Any]
# A message's descriptor (the upb and the pure-Python ones are different types to mypy).
Descriptor = Any

NDJSON = "application/x-ndjson"
EXPORT_TEXT = ('NDJSON: the session line {"bae_export":1,"session":{…},"usage":[…]}, then one line per event, '
               "each its wire JSON as GET /admin/v1/sessions/{id}/events shows it, in order (docs/reference/rest.md)")
RPC_PATH = "/api/v1/sessions/{id}/rpc"
JSON_VALUE = edge_pb2.JsonValue.DESCRIPTOR.full_name
SECURITY = {
    edge_pb2.CLIENT_KEY: ("clientKey", "a client key, `bae_…` (admin-issued)"),
    edge_pb2.SESSION_KEY: ("sessionKey", "a session key, `bae_ses_…`, bound to the session in the path"),
    edge_pb2.ADMIN_KEY: ("adminKey", "an admin key, `bae_admin_…`"),
}
PROBLEM_SLUGS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 408: "request_timeout",
                 409: "conflict", 413: "payload_too_large", 422: "unprocessable", 429: "too_many_requests", 500: "internal",
                 503: "service_unavailable", 504: "gateway_timeout"}
_SCALARS: dict[int, Schema] = {
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_DOUBLE: {"type": "number"},
    FieldDescriptor.TYPE_FLOAT: {"type": "number"},
    FieldDescriptor.TYPE_INT64: {"type": "integer"},
    FieldDescriptor.TYPE_INT32: {"type": "integer"},
    FieldDescriptor.TYPE_UINT64: {"type": "integer", "minimum": 0},
    FieldDescriptor.TYPE_UINT32: {"type": "integer", "minimum": 0},
}
# The params of a `session.delta` notification (bae/services/gateway/frames.py writes them), the data of an SSE one.
DELTA_SCHEMA: Schema = {
    "type": "object", "additionalProperties": False,
    "required": ["session_id", "request_event_id", "seq", "index", "kind", "text"],
    "description": "a piece of a provider call's output as it is generated; never stored (docs/reference/rpc.md)",
    "properties": {
        "session_id": {"type": "string"},
        "request_event_id": {"type": "string", "description": "the provider.request event of the call"},
        "seq": {"type": "integer", "minimum": 0, "description": "from 0 per provider call, without gaps"},
        "index": {"type": "integer", "minimum": 0, "description": "the content block index"},
        "kind": {"enum": ["text", "thinking", "tool_input", "reset"]},
        "text": {"type": "string"},
    },
}
_JSON_TYPES = {"string": "string", "array": "array", "object": "object", "number": "number", "boolean": "boolean"}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


class Schemas:
    """The components/schemas of one document: each message read (a request's body or params) or
    written (a reply), by its name."""

    def __init__(self) -> None:
        self.schemas: dict[str, Schema] = {
            "Problem": {"type": "object", "required": ["type", "title", "status", "detail"], "properties": {
                "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
                "detail": {"type": "string"}}, "additionalProperties": False},
            "Meta": {"type": "object", "required": ["version", "api_versions"], "properties": {
                "version": {"type": "string"}, "api_versions": {"type": "array", "items": {"type": "string"}}},
                "additionalProperties": False},
            "Ready": {"type": "object", "required": ["status"], "properties": {"status": {"const": "ready"}},
                      "additionalProperties": False},
        }
        self.examples: dict[str, Any] = {}

    def read(self, message: Descriptor) -> Schema:
        """The schema of a message as a request carries it (edge.proto's reading rules)."""
        return self._named(message, self._read_schema)

    def written(self, message: Descriptor) -> Schema:
        """The schema of a message as a reply writes it (edge.proto's writing rules)."""
        return self._named(message, self._written_schema)

    def _named(self, message: Descriptor, build: Any) -> Schema:
        if message.name not in self.schemas:
            self.schemas[message.name] = {}  # taken first: messages may nest
            self.schemas[message.name] = build(message)
            example = message.GetOptions().Extensions[edge_pb2.json_message].example
            if example:
                self.examples[message.name] = load(example)
        return ref(message.name)

    def _read_schema(self, message: Descriptor) -> Schema:
        options = message.GetOptions().Extensions[edge_pb2.json_message]
        if options.tag:
            return {"oneOf": [
                {"allOf": [{"type": "object", "required": [options.tag], "properties": {options.tag: {"const": field.name}}},
                           self.read(field.message_type)]}
                for field in message.fields
            ]}
        properties: dict[str, Schema] = {}
        required = []
        for field in message.fields:
            json = field.GetOptions().Extensions[edge_pb2.json]
            if json.forbidden:
                continue
            schema = self._value(field, self.read)
            if json.description:
                schema = {**schema, "description": json.description}
            if json.required:
                required.append(field.name)
            elif field.has_presence or field.is_repeated:
                schema = nullable(schema)  # null reads as absent
            properties[field.name] = schema
        forbidden = [field.name for field in message.fields
                     if field.GetOptions().Extensions[edge_pb2.json].forbidden]
        schema = {"type": "object", "required": required, "properties": properties}
        if forbidden:
            schema["not"] = {"anyOf": [{"required": [name]} for name in forbidden]}
        return schema

    def _written_schema(self, message: Descriptor) -> Schema:
        properties: dict[str, Schema] = {}
        required = []
        for field in message.fields:
            json = field.GetOptions().Extensions[edge_pb2.json]
            schema = self._value(field, self.written)
            if json.description:
                schema = {**schema, "description": json.description}
            if not json.omit_unset:
                required.append(field.name)
                if field.has_presence:
                    schema = nullable(schema)
            properties[field.name] = schema
        return {"type": "object", "required": required, "properties": properties, "additionalProperties": False}

    def _value(self, field: FieldDescriptor, message_schema: Callable[[Descriptor], Schema]) -> Schema:
        """The schema of the field's value (its items, for a repeated one)."""
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            return {"type": "object", "additionalProperties": self._one(message.fields_by_name["value"], message_schema)}
        one = self._one(field, message_schema)
        return {"type": "array", "items": one} if field.is_repeated else one

    def _one(self, field: FieldDescriptor, message_schema: Callable[[Descriptor], Schema]) -> Schema:
        json = field.GetOptions().Extensions[edge_pb2.json]
        message = field.message_type
        if message is not None and message.full_name == JSON_VALUE:
            kinds = [_JSON_TYPES[kind] for kind in json.json_types]
            return {"type": kinds[0] if len(kinds) == 1 else kinds} if kinds else {}
        if message is not None:
            return message_schema(message)
        schema = dict(_SCALARS[field.type])
        if json.choices:
            schema["enum"] = list(json.choices)
        if json.below_minimum:
            schema["minimum"] = json.minimum
        return schema


def _problem_responses(statuses: list[int]) -> dict[str, Schema]:
    return {str(status): {"description": TITLES[status], "content": {JSON: {"schema": ref("Problem"), "example": {
        "type": PROBLEM_SLUGS[status], "title": TITLES[status], "status": status, "detail": "…"}}}}
        for status in sorted(set(statuses))}


def _error_statuses(declared: tuple[int, ...]) -> list[int]:
    """A route's problems: its own, and what every authenticated route may answer."""
    # 408: a request head or body that stalls (BAE_HTTP_HEADER_TIMEOUT); 429: the admin port
    # throttles Argon2id checks, the client port has per-key rate limits.
    return [*declared, 401, 408, 413, 429, 500, 503, 504]


def _route_operation(route: Route, schemas: Schemas) -> Schema:
    request = route.request.DESCRIPTOR
    parameters: list[Schema] = []
    if route.id_field:
        named = route.id_field.removesuffix("_id").replace("_", " ")
        described = f"the {named}'s id" if route.id_field.endswith("_id") else f"the {named}"
        parameters.append({"name": "id", "in": "path", "required": True, "schema": {"type": "string"},
                           "description": described})
    for name in route.path_fields:
        parameters.append({"name": name, "in": "path", "required": True, "schema": {"type": "string"},
                           "description": f"the {name.removesuffix('_id')}'s id"})
    for name in route.query_fields:
        json = request.fields_by_name[name].GetOptions().Extensions[edge_pb2.json]
        parameter: Schema = {"name": name, "in": "query", "required": False, "schema": {"type": "string"}}
        if json.description:
            parameter["description"] = json.description
        parameters.append(parameter)
    for header, _, description in route.headers:
        parameters.append({"name": header, "in": "header", "required": False, "schema": {"type": "string"},
                           "description": description})
    reply = route.reply.DESCRIPTOR
    ok: Schema = {"description": route.summary}
    responses: Schema = {}
    if route.wait_field:
        # The JSON answer; a call that waits streams the turn instead.
        reply = reply.fields_by_name["answer"].message_type or reply
        responses["200"] = {
            "description": f"with ?{route.wait_field}=true: the turn as session.sendMessage streams it (NDJSON), "
                           f"its result frame's id the answer's {route.turn_id_field}",
            "content": {NDJSON: {"schema": ref("RpcFrame")}}}
    if route.ndjson and not route.client_streaming:
        ok["content"] = {NDJSON: {"schema": {"type": "string", "description": EXPORT_TEXT}}}
    elif route.status != 204:
        ok["content"] = {JSON: _media(schemas.written(reply), schemas, reply.name)}
    operation: Schema = {
        "operationId": route.rpc,
        "tags": [route.port.value],
        "summary": route.summary,
        "security": [{SECURITY[route.credential][0]: []}],
        "responses": {str(route.status): ok, **responses, **_problem_responses(_error_statuses(route.problems))},
    }
    if parameters:
        operation["parameters"] = parameters
    if route.client_streaming:
        operation["requestBody"] = {"required": True, "content": {NDJSON: {"schema": {
            "type": "string", "description": EXPORT_TEXT}}}}
    elif route.body_field:
        body: Descriptor = request.fields_by_name[route.body_field].message_type
        if body.full_name == JSON_VALUE:
            schema: Schema = {"description": "any JSON value, as the route's own rules read it"}
            operation["requestBody"] = {"required": True, "content": {JSON: {"schema": schema}}}
        else:
            operation["requestBody"] = {"required": True, "content": {JSON: _media(schemas.read(body), schemas, body.name)}}
    return operation


def _media(schema: Schema, schemas: Schemas, name: str) -> Schema:
    media: Schema = {"schema": schema}
    if name in schemas.examples:
        media["example"] = schemas.examples[name]
    return media


def _rpc_operation(schemas: Schemas) -> Schema:
    """POST /api/v1/sessions/{id}/rpc: a oneOf over the methods in, an anyOf over the frames out."""
    requests, frames = [], [ref("EventFrame"), ref("DeltaFrame"), ref("ErrorFrame")]
    for name, method in RPC_METHODS.items():
        params = schemas.read(method.params.DESCRIPTOR)
        schema_name = method.rpc + "Call"
        schemas.schemas[schema_name] = {"type": "object", "required": ["jsonrpc", "method"], "properties": {
            "jsonrpc": {"const": "2.0"}, "id": {"description": "any JSON value; absent: a notification"},
            "method": {"const": name}, "params": nullable(params)}}
        requests.append(ref(schema_name))
        result_field = method.reply.DESCRIPTOR.fields_by_name.get("result")
        if result_field is not None:
            result_name = method.rpc + "ResultFrame"
            schemas.schemas[result_name] = {"type": "object", "required": ["jsonrpc", "id", "result"], "properties": {
                "jsonrpc": {"const": "2.0"}, "id": {}, "result": schemas.written(result_field.message_type)},
                "additionalProperties": False, "description": f"the result of {name}"}
            frames.append(ref(result_name))
    event = schemas.written(client_api_pb2.Event.DESCRIPTOR)
    schemas.schemas["EventFrame"] = {"type": "object", "required": ["jsonrpc", "method", "params"], "properties": {
        "jsonrpc": {"const": "2.0"}, "method": {"const": "session.event"}, "params": event},
        "additionalProperties": False}
    schemas.schemas["Delta"] = DELTA_SCHEMA
    schemas.schemas["DeltaFrame"] = {
        "type": "object", "required": ["jsonrpc", "method", "params"], "additionalProperties": False,
        "description": "only to a caller that asked: stream_deltas (sendMessage), deltas (subscribe)",
        "properties": {"jsonrpc": {"const": "2.0"}, "method": {"const": "session.delta"}, "params": ref("Delta")},
    }
    schemas.schemas["ErrorFrame"] = {"type": "object", "required": ["jsonrpc", "error"], "properties": {
        "jsonrpc": {"const": "2.0"}, "id": {}, "error": {"type": "object", "required": ["code", "message"],
                                                         "properties": {"code": {"type": "integer"},
                                                                        "message": {"type": "string"}}}},
        "additionalProperties": False}
    schemas.schemas["RpcCall"] = {"oneOf": requests}
    # anyOf: a result frame names no method, and two methods may answer the same shape.
    schemas.schemas["RpcFrame"] = {"anyOf": frames}
    send = RPC_METHODS["session.sendMessage"].params.DESCRIPTOR
    example = {"jsonrpc": "2.0", "id": 1, "method": "session.sendMessage",
               "params": load(send.GetOptions().Extensions[edge_pb2.json_message].example)}
    return {
        "operationId": "rpc",
        "tags": ["client"],
        "summary": "JSON-RPC 2.0 over NDJSON: one request in, a stream of frames out (docs/reference/rpc.md)",
        "security": [{SECURITY[edge_pb2.SESSION_KEY][0]: []}],
        "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"},
                        "description": "the session's id"}],
        "requestBody": {"required": True, "content": {JSON: {"schema": ref("RpcCall"), "example": example}}},
        "responses": {"200": {
            "description": "NDJSON: zero or more `session.event` notifications, then the frame with the request id",
            "content": {NDJSON: {"schema": ref("RpcFrame")}}}, **_problem_responses([401, 408, 413, 429, 500, 503, 504])},
    }


def _own_operation(route: OwnRoute, schemas: Schemas) -> Schema:
    ok: Schema = {"description": route.summary}
    if route.media_type is not None and route.schema is not None:
        ok["content"] = {route.media_type: {"schema": ref(route.schema) if isinstance(route.schema, str) else route.schema}}
    operation: Schema = {
        "operationId": route.operation_id, "tags": ["operations" if route.credential is None else "sessions"],
        "summary": route.summary,
        "security": [] if route.credential is None else [{SECURITY[route.credential][0]: []}],
        "responses": {"200": ok, **_problem_responses([*route.problems, 500])},
    }
    if "{id}" in route.path or route.parameters:
        path_id = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}] if "{id}" in route.path else []
        operation["parameters"] = [*path_id, *route.parameters]
    return operation


def document(port: Port) -> dict[str, Any]:
    schemas = Schemas()
    paths: dict[str, dict[str, Schema]] = {}
    for own in OWN_ROUTES:
        if port in own.ports:
            paths.setdefault(own.path, {})[own.method.lower()] = _own_operation(own, schemas)
    if port is Port.CLIENT:
        paths[RPC_PATH] = {"post": _rpc_operation(schemas)}
    for route in routes_of(port):
        paths.setdefault(route.path, {})[route.method.lower()] = _route_operation(route, schemas)
    used = {SECURITY[route.credential][0] for route in routes_of(port)}
    used |= {SECURITY[own.credential][0] for own in OWN_ROUTES if port in own.ports and own.credential is not None}
    if port is Port.CLIENT:
        used.add(SECURITY[edge_pb2.SESSION_KEY][0])
    return {
        "openapi": "3.1.0",
        "info": {"title": f"BAE {port.value} API", "version": __version__,
                 "description": "BAE, the Better Agent Engine. Reference: docs/reference/."},
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "paths": paths,
        "components": {
            "schemas": schemas.schemas,
            "securitySchemes": {name: {"type": "http", "scheme": "bearer", "description": text}
                                for name, text in SECURITY.values() if name in used},
        },
    }


CLIENT_DOCUMENT = dump(document(Port.CLIENT))
ADMIN_DOCUMENT = dump(document(Port.ADMIN))
