"""Gateway pieces that need no sockets: envelope parsing, frame bytes, routing and dispatch."""

from __future__ import annotations

import json

import pytest
from starlette.responses import Response
from starlette.routing import Match

from bae.common.internal import InternalPlane
from bae.common.protos import client_api_pb2, edge_pb2
from bae.services.gateway.declaration import RPC_METHODS
from bae.services.gateway.envelope import Call, Rejected, parse_envelope
from bae.services.gateway.frames import error_frame, event_frame, internal_error_frame, result_frame, rpc_error_frame
from bae.services.gateway.router import build_router
from bae.services.gateway.upstream import Upstream

pytestmark = pytest.mark.unit

RpcError = client_api_pb2.RpcError


def test_the_declaration_names_the_twelve_spec_methods_and_cancel_turn():
    assert sorted(RPC_METHODS) == sorted([
        "session.registerDriver", "session.sendMessage", "session.compact", "session.subscribe",
        "session.unsubscribe", "session.startRemoteSandbox", "session.stopRemoteSandbox",
        "session.execRemoteSandbox", "session.reportLocalSandbox", "session.reportLocalSubagent",
        "session.cancelSubagent", "session.updateClientTools", "session.cancelTurn",
    ])
    assert {method.rpc for method in RPC_METHODS.values() if method.streaming} == {"SendMessage", "Compact", "Subscribe"}
    assert {name for name, method in RPC_METHODS.items() if method.unbounded} == {
        "session.startRemoteSandbox", "session.stopRemoteSandbox", "session.execRemoteSandbox"}


def test_call_keeps_id_as_json_text_and_params_as_parsed():
    call = parse_envelope(b'{"jsonrpc":"2.0","id":"x","method":"session.compact","params":{"prompt":"\xc3\xa9"}}')
    assert call == Call(RPC_METHODS["session.compact"], '"x"', {"prompt": "\u00e9"})


@pytest.mark.parametrize("raw_id,id_json", [
    ("null", "null"), ("0", "0"), ("-1.5", "-1.5"), ('"a\\"b"', '"a\\"b"'), ("[1,[]]", "[1,[]]"),
    ("{}", "{}"), ("true", "true"), ("12345678901234567890123", "12345678901234567890123"),
])
def test_any_json_id_is_kept(raw_id, id_json):
    call = parse_envelope(f'{{"jsonrpc":"2.0","id":{raw_id},"method":"session.subscribe"}}'.encode())
    assert isinstance(call, Call)
    assert call.id_json == id_json
    assert json.loads(call.id_json) == json.loads(raw_id)


def test_absent_id_is_a_notification():
    assert parse_envelope(b'{"jsonrpc":"2.0","method":"session.unsubscribe"}') == Call(
        RPC_METHODS["session.unsubscribe"], None, None
    )


@pytest.mark.parametrize("body", [b"\xff\xfe{", b'{"a":1e999}', b"Infinity", b'{"a":-Infinity}', b"{" * 100000])
def test_non_json_bodies_are_parse_errors(body):
    assert parse_envelope(body) == Rejected(
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}\n'
    )


def test_checks_run_in_spec_order():
    # Wrong version wins over a missing method, which wins over an unknown one.
    assert b"jsonrpc" in parse_envelope(b'{"id":1}').frame
    assert b'missing \\"method\\"' in parse_envelope(b'{"jsonrpc":"2.0","id":1,"method":null}').frame
    assert b"-32601" in parse_envelope(b'{"jsonrpc":"2.0","id":1,"method":"sendMessage"}').frame


def test_frames_are_exact_lines():
    event = client_api_pb2.Event(id="evt_1", session_id="s", event_type="x", payload=edge_pb2.JsonValue(json="{}"),
                                 created_at="t")
    assert event_frame(event) == (b'{"jsonrpc":"2.0","method":"session.event","params":{"id":"evt_1","session_id":"s",'
                                  b'"client_key_id":null,"event_type":"x","payload":{},"created_at":"t"}}\n')
    assert result_frame("7", '{"ok":true}') == b'{"jsonrpc":"2.0","id":7,"result":{"ok":true}}\n'
    assert error_frame(None, -32000, "x") == b'{"jsonrpc":"2.0","error":{"code":-32000,"message":"x"}}\n'
    assert error_frame('"a"', -32601, "Method not found: é\n") == (
        '{"jsonrpc":"2.0","id":"a","error":{"code":-32601,"message":"Method not found: é\\n"}}\n'.encode()
    )
    assert internal_error_frame("1") == b'{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"Internal error"}}\n'


def test_rpc_error_frame_per_id_mode():
    def error(mode):
        return RpcError(code=-32000, message="m", id_mode=mode)

    assert rpc_error_frame("3", error(RpcError.REQUEST_ID)) == error_frame("3", -32000, "m")
    assert rpc_error_frame(None, error(RpcError.REQUEST_ID)) is None
    assert rpc_error_frame("3", error(RpcError.NULL_ID)) == error_frame("null", -32000, "m")
    assert rpc_error_frame(None, error(RpcError.NULL_ID)) == error_frame("null", -32000, "m")
    assert rpc_error_frame("3", error(RpcError.NO_ID)) == error_frame(None, -32000, "m")


def handler(name):
    async def handle(request):
        return name

    handle.route_name = name
    return handle


class RouteTable:
    """The gateway's router for a table, asked which endpoints and `{id}` a path reaches."""

    def __init__(self, table):
        self.routes = build_router(table).routes

    def match(self, path):
        scope = {"type": "http", "method": "GET", "path": path}
        for route in self.routes:
            matched, child_scope = route.matches(scope)
            if matched is Match.FULL:
                return route.app.endpoints, child_scope["path_params"].get("id", "")
        return None


def test_router_matches_static_and_id_routes():
    router = RouteTable({
        "/a": {"GET": handler("a")},
        "/a/{id}": {"DELETE": handler("a-id")},
        "/a/{id}/b": {"GET": handler("a-id-b")},
    })
    methods, path_id = router.match("/a")
    assert (methods["GET"].route_name, path_id) == ("a", "")
    methods, path_id = router.match("/a/ses_1")
    assert (methods["DELETE"].route_name, path_id) == ("a-id", "ses_1")
    methods, path_id = router.match("/a/x%2Fy/b")
    assert (methods["GET"].route_name, path_id) == ("a-id-b", "x%2Fy")
    for path in ("/a/", "/a//b", "/a/x/c", "/b", "/a/x/b/", ""):
        assert router.match(path) is None, path


async def asgi_call(app, method, path):
    """One request through an ASGI app: (status, headers, body)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "headers": [], "root_path": ""}
    await app(scope, receive, send)
    return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


async def test_head_reaches_get_and_a_gateway_bug_is_a_bare_500():
    async def ok(request):
        return Response(b"{}", media_type="application/json")

    async def broken(request):
        raise RuntimeError("secret detail")

    app = build_router({"/ok": {"GET": ok}, "/post": {"POST": ok}, "/broken": {"GET": broken}})
    assert await asgi_call(app, "HEAD", "/ok") == (200, {b"content-length": b"2", b"content-type": b"application/json"}, b"{}")
    status, headers, _ = await asgi_call(app, "HEAD", "/post")
    assert (status, headers[b"allow"]) == (405, b"POST")
    status, headers, body = await asgi_call(app, "GET", "/broken")
    assert (status, headers[b"content-type"]) == (500, b"application/json")
    assert json.loads(body) == {"type": "internal", "title": "Internal Server Error", "status": 500,
                                "detail": "internal server error"}


async def test_a_refusal_is_followed_only_to_a_session_target_or_one_of_its_addresses():
    upstream = Upstream(["10.0.0.7:50051", "[::1]:50052", "localhost:50053"], 1.0, InternalPlane("t" * 32, 30.0))
    for followed in ("10.0.0.7:50051", "[0:0:0:0:0:0:0:1]:50052", "localhost:50053", "LOCALHOST:50053",
                     "127.0.0.1:50053"):
        assert await upstream._is_replica(followed), followed
    for refused in ("10.0.0.7:50052", "10.0.0.8:50051", "127.0.0.1:50051", "evil.example:50051", "junk"):
        assert not await upstream._is_replica(refused), refused
