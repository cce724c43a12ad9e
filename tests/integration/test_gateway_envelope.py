"""The gateway as a process, in front of a scripted SessionService double.

The double is a real gRPC server (threads, so tests can use plain blocking
httpx); the gateway is the real `python -m bae.services.gateway` subprocess.
"""

from __future__ import annotations

import json
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import grpc
import httpx
import pytest
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from bae.common import error_codes
from bae.common.errors import BaeError, Conflict, Unauthenticated
from bae.common.protos import client_api_pb2, edge_pb2, session_pb2, session_pb2_grpc
from bae.common.session_routing import OWNER_KEY, call_field
from bae.services.gateway.declaration import ROUTES, RPC_METHODS
from bae.services.gateway.proto_to_json import to_json
from testkit import ROOT
from testkit.ports import free_port
from testkit.processes import ServiceProcess, service_env

pytestmark = pytest.mark.stack

GOOD = "Bearer good"
RpcError = client_api_pb2.RpcError


def abort_with(context: grpc.ServicerContext, error: BaeError) -> None:
    context.set_trailing_metadata((error_codes.trailer(error),))
    context.abort(error_codes.code_of(error), error.detail)


def event(event_id: str = "evt_1", **payload) -> client_api_pb2.Event:
    return client_api_pb2.Event(id=event_id, session_id="ses_1", event_type="provider.request",
                                payload=edge_pb2.JsonValue(json=json.dumps(payload or {"n": 1})),
                                created_at="2026-01-01T00:00:00.000Z")


class StreamedContext:
    """The servicer context of a call served on the `Calls` stream: what the double's handlers use."""

    class Aborted(Exception):
        pass

    def __init__(self) -> None:
        self.trailing: tuple = ()
        self.code = grpc.StatusCode.OK
        self.details = ""
        self.active = True

    def is_active(self) -> bool:
        return self.active

    def set_trailing_metadata(self, metadata) -> None:
        self.trailing = metadata

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise self.Aborted()


def carried(trailing) -> dict[str, bytes]:
    return {key: value if isinstance(value, bytes) else value.encode() for key, value in trailing}


SERVICE = session_pb2.DESCRIPTOR.services_by_name["SessionService"]
# A GatewayCall's field -> its SessionService method.
METHOD_OF_FIELD = {
    call_field(method.name): method.name
    for method in SERVICE.methods
    if call_field(method.name) in {field.name for field in session_pb2.GatewayCall.DESCRIPTOR.oneofs_by_name["kind"].fields}
}


class SessionDouble(session_pb2_grpc.SessionServiceServicer):
    """Records every request; answers by convention, by a per-test `rest_replies` entry, or by the
    script a test set for the call's session (`scripts`).

    REST: "Bearer bad" -> 401; `{id}` "slow" -> answers too late; "crash" -> an unexpected
    exception; "closed" -> 409; otherwise the route's reply, empty unless `rest_replies` has one.
    RPC: anything but "Bearer good" -> 401; `scripts[session_id]` drives streams (steps) and
    unary replies ({"result": message} or {"error": {...}}).
    """

    def __init__(self, slow_seconds: float) -> None:
        self.slow_seconds = slow_seconds
        self.requests: list[tuple[str, object]] = []
        self.rest_replies: dict[str, object] = {}
        self.scripts: dict[str, object] = {}
        self.stream_cancelled = threading.Event()
        self.moved: dict[str, str] = {}  # session id -> the owner a replica's refusal names
        for route in ROUTES:
            setattr(self, route.rpc, self._rest_handler(route))
        for method in RPC_METHODS.values():
            handler = self._stream_handler if method.streaming else self._unary_handler
            setattr(self, method.rpc, handler(method))

    def Calls(self, packs, context):
        """The gateway's calls on one stream, each in a thread of its own as its call would be."""
        replies: queue.Queue = queue.Queue()
        calls = (call for pack in packs for call in pack.calls)
        contexts: dict[int, StreamedContext] = {}

        def serve(call: session_pb2.GatewayCall, name: str) -> None:
            for reply in self._streamed(call, name, contexts[call.call_id]):
                replies.put(reply)

        def read() -> None:
            serving = []
            try:
                for call in calls:
                    kind = call.WhichOneof("kind")
                    if kind in METHOD_OF_FIELD:
                        contexts[call.call_id] = StreamedContext()
                        serving.append(threading.Thread(target=serve, args=(call, kind)))
                        serving[-1].start()
                    elif kind == "cancel" and call.call_id in contexts:
                        contexts[call.call_id].active = False
            except grpc.RpcError:
                pass  # the gateway went away
            for call_context in contexts.values():
                call_context.active = False  # the stream ended, and with it its calls
            for thread in serving:
                thread.join()
            replies.put(None)

        threading.Thread(target=read, daemon=True).start()
        while (reply := replies.get()) is not None:
            yield session_pb2.GatewayReplies(replies=[reply])

    def _streamed(self, call: session_pb2.GatewayCall, name: str, context: StreamedContext):
        method = SERVICE.methods_by_name[METHOD_OF_FIELD[name]]
        request = getattr(call, name)
        try:
            answer = getattr(self, method.name)(request, context)
            if method.server_streaming:
                for message in answer:
                    reply = session_pb2.GatewayReply(call_id=call.call_id, more=True)
                    getattr(reply, name).CopyFrom(message)
                    yield reply
                yield session_pb2.GatewayReply(call_id=call.call_id, trailing_metadata=carried(context.trailing))
            else:
                reply = session_pb2.GatewayReply(call_id=call.call_id, trailing_metadata=carried(context.trailing))
                getattr(reply, name).CopyFrom(answer)
                yield reply
        except StreamedContext.Aborted:
            yield session_pb2.GatewayReply(call_id=call.call_id, code=context.code.value[0],
                                           details=context.details, trailing_metadata=carried(context.trailing))
        except Exception:
            yield session_pb2.GatewayReply(call_id=call.call_id, code=grpc.StatusCode.UNKNOWN.value[0],
                                           details="Exception calling application")

    def last(self, rpc: str):
        return [request for name, request in self.requests if name == rpc][-1]

    def _rest_handler(self, route):
        def handle(request, context: grpc.ServicerContext):
            if route.client_streaming:  # the credential's message, then the body's lines
                first, *lines = list(request)
                request = type(first)(credential=first.credential, lines=[line for m in lines for line in m.lines])
            self.requests.append((route.rpc, request))
            credential = getattr(request, route.credential_field)
            path_id = getattr(request, route.id_field) if route.id_field else ""
            if credential.authorization == "Bearer bad":
                abort_with(context, Unauthenticated("invalid admin key"))
            self._refuse_if_moved(path_id, context)
            if path_id == "slow":
                time.sleep(self.slow_seconds)
            if path_id == "crash":
                raise RuntimeError("boom: secret stack detail")
            if path_id == "closed":
                abort_with(context, Conflict("session is already closed", reason="session_closed"))
            reply = self.rest_replies.get(route.rpc) or default_reply(route)
            return iter([reply]) if route.streaming else reply  # a page of events is a stream

        return handle

    def _refuse_if_moved(self, session_id: str, context: grpc.ServicerContext) -> None:
        """As a replica refuses a call for a session another one owns."""
        if session_id in self.moved:
            context.set_trailing_metadata(((OWNER_KEY, self.moved[session_id]),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "session owned by another replica")

    def _authenticate(self, request, context: grpc.ServicerContext) -> None:
        if not request.credential.present:
            abort_with(context, Unauthenticated("missing Authorization header"))
        if request.credential.authorization != GOOD:
            abort_with(context, Unauthenticated("invalid session key"))

    def CheckCredential(self, request, context):
        self.requests.append(("CheckCredential", request))
        if request.kind == edge_pb2.SESSION_KEY:
            self._authenticate(request, context)
        elif request.credential.authorization == "Bearer bad":
            abort_with(context, Unauthenticated("invalid admin key"))
        return session_pb2.CredentialChecked()

    def Relay(self, request, context):
        # No live events: a Subscribe's script (its "replay") is all its stream sends.
        self.requests.append(("Relay", request))
        yield session_pb2.RelayFrame(position=0)

    def _unary_handler(self, method):
        def handle(request, context: grpc.ServicerContext):
            self.requests.append((method.rpc, request))
            self._authenticate(request, context)
            script = self.scripts.get(request.session_id, {})
            if "error" in script:
                return method.reply(error=rpc_error(script["error"]))
            result = script.get("result") or method.reply.DESCRIPTOR.fields_by_name["result"].message_type
            if not isinstance(result, Message):
                result = GetMessageClass(result)()
            return method.reply(result=result)

        return handle

    def _stream_handler(self, method):
        def handle(request, context: grpc.ServicerContext):
            self.requests.append((method.rpc, request))
            self._refuse_if_moved(request.session_id, context)
            self._authenticate(request, context)
            yield method.reply(accepted=True)
            for step in self.scripts.get(request.session_id, []):
                if "event" in step:
                    yield method.reply(events=client_api_pb2.EventBatch(events=[step["event"]]))
                elif "observer" in step:  # a subscription's position, fixed (what the session service sends first)
                    yield method.reply(observer=client_api_pb2.Observer(key="key_1", live=True))
                elif "result" in step:
                    yield method.reply(result=step["result"])
                elif "error" in step:
                    yield method.reply(error=rpc_error(step["error"]))
                elif "sleep" in step:
                    time.sleep(step["sleep"])
                elif "hang" in step:
                    while context.is_active():
                        time.sleep(0.02)
                    self.stream_cancelled.set()
                    return
                elif "fail" in step:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "session service went away")

        return handle


def rpc_error(spec: dict) -> RpcError:
    return RpcError(
        code=spec["code"],
        message=spec["message"],
        id_mode=RpcError.IdMode.Value(spec.get("id_mode", "REQUEST_ID")),
    )


def start_double(slow_seconds: float = 1.5) -> tuple[grpc.Server, SessionDouble, str]:
    double = SessionDouble(slow_seconds)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    session_pb2_grpc.add_SessionServiceServicer_to_server(double, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    server.start()
    return server, double, address


def gateway_env(session_addr: str, **overrides: str) -> dict[str, str]:
    defaults = {
        "BAE_ADDR": f"127.0.0.1:{free_port()}",
        "BAE_ADMIN_ADDR": f"127.0.0.1:{free_port()}",
        "BAE_SESSION_GRPC_ADDR": session_addr,
        "BAE_RPC_TIMEOUT": "1",
        "BAE_SHUTDOWN_TIMEOUT": "5",
        "BAE_LOG": "warning",
    }
    return service_env(**{**defaults, **overrides})


class Gateway(ServiceProcess):
    """A running `python -m bae.services.gateway` and clients for its two ports."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        super().__init__("bae.services.gateway", env=env, log_path=log_path)
        self.env = env
        self.client_url = f"http://{env['BAE_ADDR']}"
        self.admin_url = f"http://{env['BAE_ADMIN_ADDR']}"
        self.client = httpx.Client(base_url=self.client_url, timeout=10)
        self.admin = httpx.Client(base_url=self.admin_url, timeout=10)
        deadline = time.monotonic() + 15
        while True:
            assert self.process.poll() is None, log_path.read_text()
            try:
                if self.client.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.05)

    def stop(self) -> int:
        self.client.close()
        self.admin.close()
        return super().stop(timeout=10)


@pytest.fixture(scope="module")
def double() -> Iterator[SessionDouble]:
    server, servicer, address = start_double()
    servicer.address = address
    yield servicer
    server.stop(0)


@pytest.fixture(scope="module")
def gateway(double: SessionDouble, tmp_path_factory) -> Iterator[Gateway]:
    running = Gateway(gateway_env(double.address), tmp_path_factory.mktemp("gw") / "gateway.log")
    yield running
    assert running.stop() == 0


def rpc(gateway: Gateway, body: bytes | str | dict, auth: str | None = GOOD, session: str = "ses_1") -> httpx.Response:
    content = json.dumps(body) if isinstance(body, dict) else body
    headers = {"Authorization": auth} if auth is not None else {}
    return gateway.client.post(f"/api/v1/sessions/{session}/rpc", content=content, headers=headers)


def lines(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.text == "" or response.text.endswith("\n")
    return [json.loads(line) for line in response.text.splitlines()]


# --- envelope errors (SERVER-SPEC §6.2): exact bytes, after authentication ---------------

ENVELOPE_CASES = [
    (b"{not json", b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}\n'),
    (b"", b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}\n'),
    (b'{"jsonrpc":"2.0","id":1,"method":"session.subscribe","x":NaN}',
     b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}\n'),
    (b'[{"jsonrpc":"2.0","id":1,"method":"session.subscribe"}]',
     b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,'
     b'"message":"Invalid Request: batch requests are not supported"}}\n'),
    (b"[]", b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,'
     b'"message":"Invalid Request: batch requests are not supported"}}\n'),
    (b"42", b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request"}}\n'),
    (b'"hello"', b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request"}}\n'),
    (b'{"id":7,"method":"session.subscribe"}',
     b'{"jsonrpc":"2.0","id":7,"error":{"code":-32600,'
     b'"message":"Invalid Request: missing or wrong \\"jsonrpc\\" version"}}\n'),
    (b'{"jsonrpc":"1.0","id":"a","method":"session.subscribe"}',
     b'{"jsonrpc":"2.0","id":"a","error":{"code":-32600,'
     b'"message":"Invalid Request: missing or wrong \\"jsonrpc\\" version"}}\n'),
    (b'{"jsonrpc":"1.0","method":"session.subscribe"}', b""),
    (b'{"jsonrpc":"2.0","id":null}',
     b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: missing \\"method\\""}}\n'),
    (b'{"jsonrpc":"2.0","id":[1,{"a":2}],"method":5}',
     b'{"jsonrpc":"2.0","id":[1,{"a":2}],"error":{"code":-32600,'
     b'"message":"Invalid Request: missing \\"method\\""}}\n'),
    (b'{"jsonrpc":"2.0","id":3,"method":"session.nope"}',
     b'{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"Method not found: session.nope"}}\n'),
    (b'{"jsonrpc":"2.0","method":"session.nope"}', b""),
]


@pytest.mark.parametrize("body,frame", ENVELOPE_CASES)
def test_envelope_error_is_one_exact_frame_after_auth(gateway, double, body, frame):
    response = rpc(gateway, body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.content == frame
    check = double.last("CheckCredential")
    assert (check.kind, check.credential.authorization, check.credential.present, check.session_id) == (
        edge_pb2.SESSION_KEY, GOOD, True, "ses_1")


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'{"jsonrpc":"2.0","id":1,"method":"session.nope"}'])
def test_envelope_error_with_bad_key_is_plain_401(gateway, body):
    response = rpc(gateway, body, auth="Bearer bad")
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "type": "unauthorized", "title": "Unauthorized", "status": 401, "detail": "invalid session key",
    }


def test_missing_authorization_is_forwarded_as_absent(gateway, double):
    response = rpc(gateway, b"{not json", auth=None)
    assert response.status_code == 401
    assert response.json()["detail"] == "missing Authorization header"
    assert double.last("CheckCredential").credential.present is False


def test_unknown_method_needs_auth_first(gateway, double):
    before = len(double.requests)
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.launchMissiles"})
    assert lines(response) == [
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found: session.launchMissiles"}}
    ]
    assert [name for name, _ in double.requests[before:]] == ["CheckCredential"]


# --- streaming methods ---------------------------------------------------------------------

EVENT = event("evt_1")
EVENT_JSON = json.loads(to_json(EVENT))
TURN_RESULT = client_api_pb2.SendMessageResult(message=client_api_pb2.Message(
    role="assistant", content=edge_pb2.JsonValue(json='[{"type":"text","text":"hi"}]')))


def scripted(double, session: str, script) -> str:
    double.scripts[session] = script
    return session


@pytest.mark.parametrize("method,rpc_name,result", [
    ("session.sendMessage", "SendMessage", TURN_RESULT), ("session.compact", "Compact", event("evt_9")),
])
def test_stream_writes_events_then_terminal_result(gateway, double, method, rpc_name, result):
    session = scripted(double, f"ses_{rpc_name}", [{"event": EVENT}, {"event": event("evt_2")}, {"result": result}])
    params = {"message": {"content": "hi"}} if method == "session.sendMessage" else {"prompt": "p"}
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 41, "method": method, "params": params}, session=session)
    assert response.content == (
        b'{"jsonrpc":"2.0","method":"session.event","params":' + to_json(EVENT).encode() + b"}\n"
        b'{"jsonrpc":"2.0","method":"session.event","params":' + to_json(event("evt_2")).encode() + b"}\n"
        b'{"jsonrpc":"2.0","id":41,"result":' + to_json(result).encode() + b"}\n"
    )
    forwarded = double.last(rpc_name)
    assert (forwarded.session_id, forwarded.invalid_params) == (session, "")
    assert forwarded.credential == edge_pb2.Credential(authorization=GOOD, present=True)


def test_params_that_do_not_fit_travel_as_their_text(gateway, double):
    rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.sendMessage", "params": {"message": 5}},
        session=scripted(double, "ses_bad_params", []))
    forwarded = double.last("SendMessage")
    assert forwarded.invalid_params == "invalid type: integer `5`, expected struct Message"
    assert not forwarded.HasField("params") or forwarded.params == client_api_pb2.SendMessageParams()


def test_stream_notification_streams_events_but_no_terminal(gateway, double):
    session = scripted(double, "ses_notify", [{"event": EVENT}, {"result": TURN_RESULT}])
    response = rpc(gateway, {"jsonrpc": "2.0", "method": "session.sendMessage"}, session=session)
    assert lines(response) == [{"jsonrpc": "2.0", "method": "session.event", "params": EVENT_JSON}]


def test_stream_null_id_is_a_request(gateway, double):
    session = scripted(double, "ses_null_id", [{"result": event("evt_9")}])
    response = rpc(gateway, {"jsonrpc": "2.0", "id": None, "method": "session.compact"}, session=session)
    assert response.content == b'{"jsonrpc":"2.0","id":null,"result":' + to_json(event("evt_9")).encode() + b"}\n"


def test_stream_id_of_any_json_type_is_echoed(gateway, double):
    request_id = {"trace": ["a", 1.5, None, True], "ü": "x"}
    session = scripted(double, "ses_any_id", [{"result": TURN_RESULT}])
    response = rpc(gateway, {"jsonrpc": "2.0", "id": request_id, "method": "session.sendMessage"}, session=session)
    assert lines(response) == [{"jsonrpc": "2.0", "id": request_id, "result": json.loads(to_json(TURN_RESULT))}]


def test_stream_error_frames_follow_their_id_mode(gateway, double):
    session = scripted(double, "ses_errors", [
        {"error": {"code": -32000, "message": "lagged; reconnect with since_event_id", "id_mode": "NO_ID"}},
        {"error": {"code": -32000, "message": "replay failed", "id_mode": "NULL_ID"}},
        {"error": {"code": -32001, "message": "call session.registerDriver before session.sendMessage"}},
    ])
    response = rpc(gateway, {"jsonrpc": "2.0", "id": "r-1", "method": "session.sendMessage"}, session=session)
    assert response.content == (
        b'{"jsonrpc":"2.0","error":{"code":-32000,"message":"lagged; reconnect with since_event_id"}}\n'
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"replay failed"}}\n'
        b'{"jsonrpc":"2.0","id":"r-1","error":{"code":-32001,'
        b'"message":"call session.registerDriver before session.sendMessage"}}\n'
    )


def test_stream_notification_drops_only_the_request_error(gateway, double):
    session = scripted(double, "ses_quiet_errors", [
        {"error": {"code": -32000, "message": "lagged; reconnect with since_event_id", "id_mode": "NO_ID"}},
        {"error": {"code": -32001, "message": "call session.registerDriver before session.compact"}},
    ])
    response = rpc(gateway, {"jsonrpc": "2.0", "method": "session.compact"}, session=session)
    assert lines(response) == [
        {"jsonrpc": "2.0", "error": {"code": -32000, "message": "lagged; reconnect with since_event_id"}}
    ]


def test_stream_with_bad_key_is_401_before_any_stream(gateway):
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}, auth="Bearer bad")
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/json"
    assert response.json()["type"] == "unauthorized"


def test_absent_and_null_params_are_an_empty_object(gateway, double):
    rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}, session="ses_params")
    forwarded = double.last("Subscribe")
    assert (forwarded.params, forwarded.invalid_params, forwarded.session_id) == (
        client_api_pb2.SubscribeParams(), "", "ses_params")
    rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver", "params": None})
    assert double.last("RegisterDriver").invalid_params == ""


def test_a_subscription_opens_once_placed_before_its_first_event(gateway, double):
    session = scripted(double, "ses_slow_start", [{"observer": True}, {"sleep": 0.8}, {"event": EVENT}])
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}
    started = time.monotonic()
    with gateway.client.stream("POST", f"/api/v1/sessions/{session}/rpc", json=body,
                               headers={"Authorization": GOOD}) as response:
        headers_after = time.monotonic() - started
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        first_line = next(response.iter_lines())
        line_after = time.monotonic() - started
    assert headers_after < 0.6
    assert line_after >= 0.8
    assert json.loads(first_line)["params"] == EVENT_JSON


def test_frames_are_flushed_as_they_arrive(gateway, double):
    session = scripted(double, "ses_flush", [{"event": EVENT}, {"sleep": 0.8}, {"result": TURN_RESULT}])
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.sendMessage"}
    started = time.monotonic()
    with gateway.client.stream("POST", f"/api/v1/sessions/{session}/rpc", json=body,
                               headers={"Authorization": GOOD}) as response:
        received = [(time.monotonic() - started, line) for line in response.iter_lines()]
    assert len(received) == 2
    assert received[0][0] < 0.6 <= received[1][0]


def test_client_disconnect_cancels_the_grpc_stream(gateway, double):
    double.stream_cancelled.clear()
    session = scripted(double, "ses_hang", [{"event": EVENT}, {"hang": True}])
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}
    with httpx.Client(base_url=gateway.client_url, timeout=10) as client:
        with client.stream("POST", f"/api/v1/sessions/{session}/rpc", json=body,
                           headers={"Authorization": GOOD}) as response:
            assert json.loads(next(response.iter_lines()))["params"] == EVENT_JSON
    assert double.stream_cancelled.wait(5)


def test_session_service_failure_mid_stream_ends_with_internal_error(gateway, double):
    session = scripted(double, "ses_fail", [{"event": EVENT}, {"fail": True}])
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 5, "method": "session.sendMessage"}, session=session)
    assert response.content == (
        b'{"jsonrpc":"2.0","method":"session.event","params":' + to_json(EVENT).encode() + b"}\n"
        b'{"jsonrpc":"2.0","id":5,"error":{"code":-32603,"message":"Internal error"}}\n'
    )
    notification = rpc(gateway, {"jsonrpc": "2.0", "method": "session.sendMessage"}, session=session)
    assert lines(notification) == [{"jsonrpc": "2.0", "method": "session.event", "params": EVENT_JSON}]


# --- unary methods -------------------------------------------------------------------------

@pytest.mark.parametrize("method", [name for name, method in RPC_METHODS.items() if not method.streaming])
def test_unary_method_answers_one_terminal_frame(gateway, double, method):
    rpc_method = RPC_METHODS[method]
    result = GetMessageClass(rpc_method.reply.DESCRIPTOR.fields_by_name["result"].message_type)()
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 9, "method": method, "params": {"k": [1, 2]}},
                   session=f"ses_{rpc_method.rpc}")
    assert response.content == b'{"jsonrpc":"2.0","id":9,"result":' + to_json(result).encode() + b"}\n"
    assert double.last(rpc_method.rpc).session_id == f"ses_{rpc_method.rpc}"


def test_unary_error_and_notification(gateway, double):
    error = {"code": -32013, "message": "sandbox_not_running: no remote sandbox is running for this session"}
    session = scripted(double, "ses_unary_error", {"error": error})
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 2, "method": "session.stopRemoteSandbox"}, session=session)
    assert lines(response) == [{"jsonrpc": "2.0", "id": 2, "error": error}]
    silent = rpc(gateway, {"jsonrpc": "2.0", "method": "session.unsubscribe"})
    assert (silent.status_code, silent.content) == (200, b"")
    null_mode = scripted(double, "ses_null_mode", {"error": {**error, "id_mode": "NULL_ID"}})
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 3, "method": "session.unsubscribe"}, session=null_mode)
    assert lines(response) == [{"jsonrpc": "2.0", "id": None, "error": error}]


def test_unary_with_bad_key_is_401(gateway):
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver"}, auth="Bearer bad")
    assert response.status_code == 401
    assert response.json()["status"] == 401


# --- REST routes ---------------------------------------------------------------------------

def concrete(path: str) -> str:
    return path.replace("{id}", "thing_a")


def default_reply(route):
    """The route's reply with every field at its default; a route that answers first (and may then
    stream a turn, HttpRoute.wait_field) begins with its answer."""
    reply = route.reply()
    if route.wait_field:
        reply.answer.SetInParent()
    return reply


def example_body(route) -> bytes:
    """The route's body as its contract's example shows it; "{}" for a route without one, or whose body is
    any JSON value (JsonValue has no example: a trigger's input is whatever its schema asks for)."""
    if not route.body_field:
        return b"{}"
    body_type = route.request.DESCRIPTOR.fields_by_name[route.body_field].message_type
    return body_type.GetOptions().Extensions[edge_pb2.json_message].example.encode() or b"{}"


@pytest.mark.parametrize("route", ROUTES, ids=lambda route: route.rpc)
def test_rest_route_makes_its_call(gateway, double, route):
    http = gateway.client if route.port.value == "client" else gateway.admin
    response = http.request(route.method, concrete(route.path), params={"limit": "2", "cursor": "", "x": "y"},
                            content=example_body(route),
                            headers={"Authorization": "Bearer k", "Content-Type": "application/json"})
    assert response.status_code == route.status
    if route.status == 204:
        assert response.content == b""
        assert "content-type" not in response.headers
    elif route.ndjson and not route.client_streaming:  # an export: the pieces' text, here one empty piece
        assert response.headers["content-type"] == "application/x-ndjson"
        assert response.content == b""
    else:
        assert response.headers["content-type"] == "application/json"
        reply = default_reply(route)
        assert response.text == to_json(reply.answer if route.wait_field else reply)
    request = double.last(route.rpc)
    assert getattr(request, route.credential_field) == edge_pb2.Credential(authorization="Bearer k", present=True)
    if route.id_field:
        assert getattr(request, route.id_field) == "thing_a"
    if route.body_field:
        assert to_json(getattr(request, route.body_field))  # read from the example
    if route.client_streaming:
        assert list(request.lines) == [example_body(route).decode()]
    assert {name: getattr(request, name) for name in route.query_fields} == {
        name: {"limit": "2"}.get(name, "") for name in route.query_fields}


def test_rest_without_authorization_is_forwarded_as_absent(gateway, double):
    gateway.client.get("/api/v1/sessions/ses_a/events")
    assert double.last("ListEvents").credential == edge_pb2.Credential(authorization="", present=False)


def test_a_body_that_does_not_read_is_a_400_after_the_credential(gateway, double):
    response = gateway.admin.post("/admin/v1/keys", json={"name": ""}, headers={"Authorization": "Bearer k"})
    assert response.json() == {"type": "bad_request", "title": "Bad Request", "status": 400,
                               "detail": "invalid request body: missing field `profile_id`"}
    assert double.last("CheckCredential").kind == edge_pb2.ADMIN_KEY


def test_no_auth_utility_routes(gateway):
    for port in (gateway.client, gateway.admin):
        health = port.get("/healthz")
        assert (health.status_code, health.content) == (200, b"")
    meta = gateway.client.get("/api/v1/meta")
    assert meta.status_code == 200
    assert meta.headers["content-type"] == "application/json"
    assert meta.json() == {"version": "0.1.0", "api_versions": ["v1"]}


@pytest.mark.parametrize("port,path", [
    ("client", "/admin/v1/profiles"), ("client", "/admin/v1/config"), ("admin", "/api/v1/meta"),
    ("admin", "/api/v1/sessions"), ("client", "/api/v1/sessions/ses_a/unknown"),
    ("client", "/api/v1/sessions//events"), ("client", "/"), ("admin", "/admin/v1/profiles/pro_a/extra"),
])
def test_unknown_route_is_rfc7807_404(gateway, port, path):
    http = gateway.client if port == "client" else gateway.admin
    response = http.get(path)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert (body["type"], body["title"], body["status"]) == ("not_found", "Not Found", 404)


@pytest.mark.parametrize("port,method,path,allow", [
    ("client", "POST", "/api/v1/meta", "GET"),
    ("client", "GET", "/api/v1/sessions", "POST"),
    ("client", "GET", "/api/v1/sessions/ses_a/rpc", "POST"),
    ("admin", "PATCH", "/admin/v1/profiles/pro_a", "DELETE, GET, PUT"),
    ("admin", "DELETE", "/admin/v1/sessions", "GET"),
])
def test_wrong_method_is_rfc7807_405(gateway, port, method, path, allow):
    http = gateway.client if port == "client" else gateway.admin
    response = http.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    body = response.json()
    assert (body["type"], body["title"], body["status"]) == ("method_not_allowed", "Method Not Allowed", 405)


def test_service_problem_becomes_the_response(gateway):
    response = gateway.client.delete("/api/v1/sessions/closed")
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"type": "session_closed", "title": "Conflict", "status": 409,
                               "detail": "session is already closed"}
    denied = gateway.admin.get("/admin/v1/keys", headers={"Authorization": "Bearer bad"})
    assert (denied.status_code, denied.json()["detail"]) == (401, "invalid admin key")


def test_deadline_exceeded_is_504(gateway):
    started = time.monotonic()
    response = gateway.client.get("/api/v1/sessions/slow/events")
    assert time.monotonic() - started < 1.5
    assert response.status_code == 504
    body = response.json()
    assert (body["type"], body["title"], body["status"]) == ("gateway_timeout", "Gateway Timeout", 504)


def test_unexpected_failure_is_500_without_details(gateway):
    response = gateway.admin.get("/admin/v1/profiles/crash")
    assert response.status_code == 500
    assert response.json() == {"type": "internal", "title": "Internal Server Error", "status": 500,
                               "detail": "internal server error"}
    assert "boom" not in response.text


# --- the process ---------------------------------------------------------------------------

def test_session_service_down_is_503_without_hanging(tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    gateway = Gateway(gateway_env(dead, BAE_RPC_TIMEOUT="10"), tmp_path / "gateway.log")
    try:
        for request in (
            lambda: gateway.client.get("/api/v1/sessions/ses_a/events"),
            lambda: gateway.admin.get("/admin/v1/profiles"),
            lambda: rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}),
            lambda: rpc(gateway, b"not json"),
        ):
            started = time.monotonic()
            response = request()
            assert time.monotonic() - started < 3
            assert response.status_code == 503
            assert response.json() == {
                "type": "service_unavailable", "title": "Service Unavailable", "status": 503,
                "detail": "the session service is unavailable; try again shortly",
            }
        # The address is for the operator (the log), not for the client.
        assert dead in gateway.log_path.read_text()
    finally:
        assert gateway.stop() == 0


def test_recovers_once_the_session_service_comes_up(tmp_path):
    address_port = free_port()
    gateway = Gateway(gateway_env(f"127.0.0.1:{address_port}"), tmp_path / "gateway.log")
    try:
        assert gateway.client.get("/api/v1/sessions/ses_a/events").status_code == 503
        double = SessionDouble(slow_seconds=0)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        session_pb2_grpc.add_SessionServiceServicer_to_server(double, server)
        server.add_insecure_port(f"127.0.0.1:{address_port}")
        server.start()
        try:
            deadline = time.monotonic() + 3
            while gateway.client.get("/api/v1/sessions/ses_a/events").status_code != 200:
                assert time.monotonic() < deadline, "gateway did not reconnect within 3s"
                time.sleep(0.05)
        finally:
            server.stop(0)
    finally:
        gateway.stop()


def run_gateway(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bae.services.gateway"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=20)


def test_non_loopback_admin_address_exits_2():
    result = run_gateway(gateway_env("127.0.0.1:1", BAE_ADMIN_ADDR="10.1.2.3:8081"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: BAE_ADMIN_ADDR: 10.1.2.3:8081 is not a loopback address; "
        "the admin port must bind to localhost only"
    ]


@pytest.mark.parametrize("taken", ["BAE_ADDR", "BAE_ADMIN_ADDR"])
def test_port_taken_exits_1(taken):
    env = gateway_env("127.0.0.1:1")
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        env[taken] = f"127.0.0.1:{blocker.getsockname()[1]}"
        result = run_gateway(env)
    assert result.returncode == 1, result.stderr
    assert "cannot bind" in result.stderr


def test_sigterm_ends_live_subscriptions_and_exits_0(tmp_path, double):
    gateway = Gateway(gateway_env(double.address), tmp_path / "gateway.log")
    try:
        session = scripted(double, "ses_sigterm", [{"event": EVENT}, {"hang": True}])
        body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}
        with gateway.client.stream("POST", f"/api/v1/sessions/{session}/rpc", json=body,
                                   headers={"Authorization": GOOD}) as response:
            stream = response.iter_lines()
            assert json.loads(next(stream))["params"] == EVENT_JSON
            started = time.monotonic()
            gateway.process.send_signal(signal.SIGTERM)
            assert list(stream) == []  # the stream ends cleanly, no terminal frame
        assert gateway.process.wait(10) == 0
        assert time.monotonic() - started < 3
    finally:
        gateway.stop()  # also when an assertion failed: no gateway process outlives the test


def test_small_responses_are_not_held_back(gateway):
    # Headers and body go out in separate writes; without TCP_NODELAY each response
    # waits ~40 ms for a delayed ACK.
    timings = []
    for _ in range(15):
        started = time.perf_counter()
        assert gateway.client.get("/api/v1/sessions/ses_a/events").status_code == 200
        timings.append(time.perf_counter() - started)
    assert sorted(timings)[len(timings) // 2] < 0.02


# --- what a client cannot make the gateway do ------------------------------------------------

FORGED = "ses_x\n2026-01-01 00:00:00,000 INFO bae.access: access forged=1\r\x1b[31m\u2028\x85"
FORGED_ESCAPED = "ses_x\\n2026-01-01 00:00:00,000 INFO bae.access: access forged=1\\r\\x1b[31m\\u2028\\x85"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_control_characters_in_a_path_cannot_forge_a_log_line(double, tmp_path, log_format):
    gateway = Gateway(gateway_env(double.address, BAE_LOG="info", BAE_LOG_FORMAT=log_format),
                      tmp_path / "gateway.log")
    try:
        response = gateway.client.get(f"/api/v1/sessions/{quote(FORGED, safe='')}/events",
                                      headers={"Authorization": GOOD})
        assert response.status_code == 200
    finally:
        assert gateway.stop() == 0
    [line] = [line for line in gateway.log_path.read_text().splitlines() if "ses_x" in line]
    if log_format == "json":
        assert json.loads(line)["session_id"] == FORGED_ESCAPED
    else:
        assert f' session_id="{FORGED_ESCAPED}" ' in line
        assert line.endswith(" request_id=" + response.headers["x-request-id"])


LONE_SURROGATES = [
    (b'{"name":"\\ud800","profile_id":"pro_1"}', "unexpected end of hex escape at line 1 column 15"),
    (b'{"name":"a\\udc00b","profile_id":"pro_1"}', "lone leading surrogate in hex escape at line 1 column 16"),
    (b'{"name":"\\\\ud800",\n"profile_id":"\\ud83d\\u0041"}', "lone leading surrogate in hex escape at line 2 column 26"),
]


@pytest.mark.parametrize("body,reason", LONE_SURROGATES)
def test_a_lone_surrogate_in_a_rest_body_is_a_400_after_the_credential(gateway, double, body, reason):
    headers = {"Content-Type": "application/json"}
    response = gateway.admin.post("/admin/v1/keys", content=body, headers={**headers, "Authorization": "Bearer bad"})
    assert (response.status_code, response.json()["detail"]) == (401, "invalid admin key")
    response = gateway.admin.post("/admin/v1/keys", content=body, headers={**headers, "Authorization": "Bearer k"})
    assert response.json() == {"type": "bad_request", "title": "Bad Request", "status": 400,
                               "detail": f"Failed to parse the request body as JSON: {reason}"}
    # A pair is one character, however it is written.
    pair = gateway.admin.post("/admin/v1/keys", content=b'{"name":"\\ud83d\\ude00","profile_id":"p"}',
                              headers={**headers, "Authorization": "Bearer k"})
    assert pair.status_code == 201 and double.last("CreateKey").body.name == "\U0001F600"


@pytest.mark.parametrize("params", [b'{"x":"\\ud800"}', b'{"\\udfff":1}', b'["\\ud800\\ud800"]'])
def test_a_lone_surrogate_in_an_rpc_body_is_a_parse_error_after_the_credential(gateway, params):
    body = b'{"jsonrpc":"2.0","id":1,"method":"session.registerDriver","params":' + params + b"}"
    assert rpc(gateway, body, auth="Bearer bad").status_code == 401
    assert rpc(gateway, body).content == b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}\n'


def test_a_refusal_naming_an_unconfigured_owner_is_not_followed(gateway, double):
    # A refusal may name any address; the gateway would carry the internal token there.
    with socket.socket() as elsewhere:
        elsewhere.bind(("127.0.0.1", 0))
        elsewhere.listen()
        elsewhere.setblocking(False)
        double.moved["ses_moved"] = "127.0.0.1:%d" % elsewhere.getsockname()[1]
        unavailable = {"type": "service_unavailable", "title": "Service Unavailable", "status": 503,
                       "detail": "the session service is unavailable; try again shortly"}
        response = gateway.client.get("/api/v1/sessions/ses_moved/events", headers={"Authorization": GOOD})
        assert (response.status_code, response.json()) == (503, unavailable)
        response = rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}, session="ses_moved")
        assert (response.status_code, response.json()) == (503, unavailable)
        readable, _, _ = select.select([elsewhere], [], [], 0.2)
        assert readable == [], "the gateway connected to the address the refusal named"
    assert gateway.log_path.read_text().count(
        f"session replica refused a call naming {double.moved['ses_moved']} as its owner") == 2


def test_an_unknown_method_or_route_is_echoed_cut_to_200_characters(gateway):
    method = "session." + "m" * 1_000_000
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": method})
    assert lines(response) == [
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": f"Method not found: {method[:200]}…"}}
    ]
    path = "/api/v1/" + "p" * 5000
    response = gateway.client.get(path)
    assert response.status_code == 404
    assert response.json()["detail"] == f"no route for GET {path[:200]}…"
    response = gateway.client.delete("/api/v1/sessions/" + "s" * 5000 + "/events")
    assert response.status_code == 405
    assert response.json()["detail"] == f"method DELETE is not allowed on /api/v1/sessions/{'s' * 183}…; allowed: GET"
