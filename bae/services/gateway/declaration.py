"""What the gateway serves, read from SessionService's descriptor (protos/bae/proto/v1/edge.proto).

Each method with an `http` option is one REST route, each with a `json_rpc` option one method of
`POST /api/v1/sessions/{id}/rpc`. Nothing else in the gateway lists a route or a method: the
router, the translation and the OpenAPI document all read them from here.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from bae.common.protos import edge_pb2, session_pb2

SERVICE = session_pb2.DESCRIPTOR.services_by_name["SessionService"]
CREDENTIAL_TYPE = edge_pb2.Credential.DESCRIPTOR.full_name


class Port(enum.Enum):
    CLIENT = "client"
    ADMIN = "admin"


_PORTS = {edge_pb2.CLIENT: Port.CLIENT, edge_pb2.ADMIN: Port.ADMIN}


@dataclass(frozen=True)
class Route:
    """One REST route and the SessionService call it makes."""

    port: Port
    method: str  # GET, POST, PUT, DELETE
    path: str  # the template as the spec writes it, e.g. "/api/v1/sessions/{id}/events"
    rpc: str  # the SessionService method, e.g. "ListEvents"
    request: type[Message]
    reply: type[Message]
    status: int
    credential: edge_pb2.CredentialKind.ValueType
    credential_field: str
    id_field: str  # the request field `{id}` fills; "" without one
    body_field: str  # the request field the JSON body fills; "" without a body
    query_fields: tuple[str, ...]
    summary: str
    problems: tuple[int, ...]
    # The reply comes as a stream: a page of events, then its last item's payload in pieces (session.proto).
    streaming: bool = False
    # NDJSON through a streaming method (edge.proto, HttpRoute.ndjson): the reply's pieces of text
    # (server streaming) or the body's lines (client streaming).
    ndjson: bool = False
    client_streaming: bool = False
    # Request fields read from headers: (header name, field, description) (edge.proto, HttpRoute.headers).
    headers: tuple[tuple[str, str, str], ...] = ()
    # The query field whose "true" has the route stream a turn, and the answer's field that is the
    # stream's JSON-RPC id (edge.proto, HttpRoute.wait_field); "" for every other route.
    wait_field: str = ""
    turn_id_field: str = ""
    # Other `{name}` segments of the path, each filling the request field of its name (e.g. `{delivery_id}`).
    path_fields: tuple[str, ...] = ()

    @property
    def session_scoped(self) -> bool:
        """Whether the call is about one session, so goes to the replica that owns it: a client
        route that names a session (the admin port's reads serve from any replica)."""
        return self.port is Port.CLIENT and self.id_field == "session_id"


@dataclass(frozen=True)
class RpcMethod:
    """One JSON-RPC method and the SessionService call it makes."""

    name: str  # e.g. "session.sendMessage"
    rpc: str
    request: type[Message]
    params: type[Message]
    reply: type[Message]  # the unary reply, or the stream's frame
    streaming: bool
    unbounded: bool  # the session service bounds it itself: the gateway sets no deadline
    summary: str


def _credential_field(request: Descriptor) -> str:
    for field in request.fields:
        if field.message_type is not None and field.message_type.full_name == CREDENTIAL_TYPE:
            return field.name
    raise ValueError(f"{request.full_name} has no Credential field")


def _route(method: MethodDescriptor, option: Any) -> Route:
    request = method.input_type
    credential_field = _credential_field(request)
    headers = tuple((header.name, header.field, header.description) for header in option.headers)
    path_fields = tuple(name for name in re.findall(r"\{(\w+)\}", option.path) if name != "id")
    taken = {credential_field, option.id_field, option.body, *(field for _, field, _ in headers), *path_fields}
    if ("{id}" in option.path) != bool(option.id_field):
        raise ValueError(f"{method.name}: the path's {{id}} and id_field go together")
    for name in taken - {""}:
        if name not in request.fields_by_name:
            raise ValueError(f"{method.name}: {request.full_name} has no field {name}")
    # A client-streaming route's other fields carry its body, never query parameters.
    query = () if method.client_streaming else tuple(f.name for f in request.fields if f.name not in taken)
    if option.ndjson and not (method.client_streaming or method.server_streaming):
        raise ValueError(f"{method.name}: an NDJSON route is a streaming method")
    if method.client_streaming and not option.ndjson:
        raise ValueError(f"{method.name}: a client-streaming route reads an NDJSON body")
    for name in query:
        if request.fields_by_name[name].type != FieldDescriptor.TYPE_STRING:
            raise ValueError(f"{method.name}: query parameter {name} is not a string field")
    for _, name, _ in headers:
        field = request.fields_by_name[name]
        if field.type != FieldDescriptor.TYPE_STRING or not field.has_presence:
            raise ValueError(f"{method.name}: header field {name} is not an optional string field")
    if option.wait_field:
        kinds = method.output_type.oneofs_by_name.get("kind")
        if option.wait_field not in query or not method.server_streaming or kinds is None or {
                field.name for field in kinds.fields} != {"answer", "turn"}:
            raise ValueError(f"{method.name}: a wait_field route streams a oneof `kind` of answer and turn")
        answer = method.output_type.fields_by_name["answer"].message_type
        if answer is None or option.turn_id_field not in answer.fields_by_name:
            raise ValueError(f"{method.name}: the answer has no field {option.turn_id_field}")
    return Route(
        port=_PORTS[option.port],
        method=option.method,
        path=option.path,
        rpc=method.name,
        request=GetMessageClass(request),
        reply=GetMessageClass(method.output_type),
        status=option.status,
        credential=option.credential,
        credential_field=credential_field,
        id_field=option.id_field,
        body_field=option.body,
        query_fields=query,
        summary=option.summary,
        problems=tuple(option.problems),
        streaming=method.server_streaming,
        ndjson=option.ndjson,
        client_streaming=method.client_streaming,
        headers=headers,
        wait_field=option.wait_field,
        turn_id_field=option.turn_id_field,
        path_fields=path_fields,
    )


def _rpc_method(method: MethodDescriptor, option: Any) -> RpcMethod:
    request = method.input_type
    params = request.fields_by_name["params"].message_type
    if params is None:
        raise ValueError(f"{method.name}: params is not a message")
    return RpcMethod(
        name=option.name,
        rpc=method.name,
        request=GetMessageClass(request),
        params=GetMessageClass(params),
        reply=GetMessageClass(method.output_type),
        streaming=method.server_streaming,
        unbounded=option.unbounded,
        summary=option.summary,
    )


def _read() -> tuple[tuple[Route, ...], dict[str, RpcMethod]]:
    routes: list[Route] = []
    methods: dict[str, RpcMethod] = {}
    for method in SERVICE.methods:
        options = method.GetOptions()
        if options.HasExtension(edge_pb2.http):
            routes.append(_route(method, options.Extensions[edge_pb2.http]))
        if options.HasExtension(edge_pb2.json_rpc):
            rpc = _rpc_method(method, options.Extensions[edge_pb2.json_rpc])
            methods[rpc.name] = rpc
    return tuple(routes), methods


ROUTES, RPC_METHODS = _read()


def routes_of(port: Port) -> list[Route]:
    return [route for route in ROUTES if route.port is port]
