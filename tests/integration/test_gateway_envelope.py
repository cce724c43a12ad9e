"""The gateway as a process, in front of a scripted SessionService double.

The double is a real gRPC server (threads, so tests can use plain blocking
httpx); the gateway is the real `python -m services.gateway` subprocess.
"""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Callable, Iterator

import grpc
import httpx
import pytest
from google.protobuf.message_factory import GetMessageClass

from bae.common.errors import PROBLEM_TRAILER, Problem, unauthorized
from bae.common.protos import session_pb2, session_pb2_grpc
from testkit import ROOT
from testkit.ports import free_port
from testkit.processes import ServiceProcess, service_env

pytestmark = pytest.mark.stack

GOOD = "Bearer good"
RpcError = session_pb2.RpcError

REST_RPCS = [
    "OpenSession", "JoinSession", "ListParticipants", "ListEvents", "CloseSession",
    "CreateProfile", "ListProfiles", "GetProfile", "ReplaceProfile", "DeleteProfile",
    "CreateKey", "ListKeys", "RevokeKey", "ListSessions", "ListSessionEvents",
    "ListMcpServers", "ListProviders", "GetConfig", "GetSandboxStatus",
]
UNARY_RPCS = [
    "RegisterDriver", "Unsubscribe", "UpdateClientTools", "StartRemoteSandbox",
    "StopRemoteSandbox", "ExecRemoteSandbox", "ReportLocalSandbox", "ReportLocalSubagent",
    "CancelSubagent",
]
STREAM_RPCS = ["SendMessage", "Compact", "Subscribe"]


def abort_with(context: grpc.ServicerContext, problem: Problem) -> None:
    context.set_trailing_metadata(((PROBLEM_TRAILER, problem.to_json()),))
    context.abort(problem.grpc_code, problem.detail)


class ExchangedContext:
    """The servicer context of a call served on the Exchange stream: what the double's handlers use."""

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


class SessionDouble(session_pb2_grpc.SessionServiceServicer):
    """Records every request; answers by convention or by a per-test `rest_replies` entry.

    REST: "Bearer bad" -> 401 problem; path id "slow" -> answers too late; "crash" ->
    an unexpected exception; "closed" -> 409 problem; otherwise echoes what it got.
    RPC: anything but "Bearer good" -> 401; params {"script": [...]} drive streams,
    params {"result": ...} / {"error": ...} drive unary replies.
    """

    def __init__(self, slow_seconds: float) -> None:
        self.slow_seconds = slow_seconds
        self.requests: list[tuple[str, object]] = []
        self.rest_replies: dict[str, Callable[[session_pb2.RestRequest], str]] = {}
        self.stream_cancelled = threading.Event()
        for name in REST_RPCS:
            setattr(self, name, self._rest_handler(name))
        for name in UNARY_RPCS:
            setattr(self, name, self._unary_handler(name))
        for name in STREAM_RPCS:
            setattr(self, name, self._stream_handler(name))

    def Exchange(self, packs, context):
        """The gateway's calls on one stream, each in a thread of its own as its call would be."""
        replies: queue.Queue = queue.Queue()
        calls = (call for pack in packs for call in pack.calls)
        contexts: dict[int, ExchangedContext] = {}

        def serve(call: session_pb2.ExchangeCall) -> None:
            for reply in self._exchanged(call, contexts[call.call_id]):
                replies.put(reply)

        def read() -> None:
            serving = []
            try:
                for call in calls:
                    if call.HasField("start"):
                        contexts[call.call_id] = ExchangedContext()
                        serving.append(threading.Thread(target=serve, args=(call,)))
                        serving[-1].start()
                    elif call.HasField("cancel") and call.call_id in contexts:
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
            yield session_pb2.ExchangeReplies(replies=[reply])

    def _exchanged(self, call: session_pb2.ExchangeCall, context: "ExchangedContext"):
        name = call.start.method.rpartition("/")[2]
        method = session_pb2.DESCRIPTOR.services_by_name["SessionService"].methods_by_name[name]
        request = GetMessageClass(method.input_type).FromString(call.start.request)
        try:
            answer = getattr(self, name)(request, context)
            if method.server_streaming:
                for message in answer:
                    yield session_pb2.ExchangeReply(call_id=call.call_id, more=True,
                                                    message=message.SerializeToString())
                yield session_pb2.ExchangeReply(call_id=call.call_id, trailing_metadata=dict(context.trailing))
            else:
                yield session_pb2.ExchangeReply(call_id=call.call_id, message=answer.SerializeToString(),
                                                trailing_metadata=dict(context.trailing))
        except ExchangedContext.Aborted:
            yield session_pb2.ExchangeReply(call_id=call.call_id, code=context.code.value[0],
                                            details=context.details, trailing_metadata=dict(context.trailing))
        except Exception:
            yield session_pb2.ExchangeReply(call_id=call.call_id, code=grpc.StatusCode.UNKNOWN.value[0],
                                            details="Exception calling application")

    def last(self, rpc: str):
        return [request for name, request in self.requests if name == rpc][-1]

    def _rest_handler(self, name: str):
        def handle(request: session_pb2.RestRequest, context: grpc.ServicerContext):
            self.requests.append((name, request))
            if request.authorization == "Bearer bad":
                abort_with(context, unauthorized("invalid admin key"))
            if request.path_id == "slow":
                time.sleep(self.slow_seconds)
            if request.path_id == "crash":
                raise RuntimeError("boom: secret stack detail")
            if request.path_id == "closed":
                abort_with(context, Problem(409, "session_closed", "session is already closed"))
            if name in self.rest_replies:
                return session_pb2.JsonReply(json=self.rest_replies[name](request))
            if name in ("DeleteProfile", "RevokeKey"):
                return session_pb2.JsonReply(json="")
            echo = {
                "rpc": name,
                "authorization": request.authorization,
                "has_authorization": request.has_authorization,
                "path_id": request.path_id,
                "body": request.body.decode(),
                "content_type": request.content_type,
                "query": dict(request.query),
            }
            return session_pb2.JsonReply(json=json.dumps(echo))

        return handle

    def _authenticate(self, request: session_pb2.RpcRequest, context: grpc.ServicerContext) -> None:
        if not request.has_authorization:
            abort_with(context, unauthorized("missing Authorization header"))
        if request.authorization != GOOD:
            abort_with(context, unauthorized("invalid session key"))

    def CheckSessionKey(self, request, context):
        self.requests.append(("CheckSessionKey", request))
        self._authenticate(request, context)
        return session_pb2.JsonReply(json="{}")

    def Relay(self, request, context):
        # No live events: a Subscribe's script (its "replay") is all its stream sends.
        self.requests.append(("Relay", request))
        yield session_pb2.RpcFrame(position=0)

    def _unary_handler(self, name: str):
        def handle(request: session_pb2.RpcRequest, context: grpc.ServicerContext):
            self.requests.append((name, request))
            self._authenticate(request, context)
            params = json.loads(request.params_json)
            if isinstance(params, dict) and "error" in params:
                return session_pb2.RpcReply(error=rpc_error(params["error"]))
            if isinstance(params, dict) and "result" in params:
                return session_pb2.RpcReply(result_json=json.dumps(params["result"]))
            return session_pb2.RpcReply(result_json=json.dumps({"rpc": name}))

        return handle

    def _stream_handler(self, name: str):
        def handle(request: session_pb2.RpcRequest, context: grpc.ServicerContext):
            self.requests.append((name, request))
            self._authenticate(request, context)
            yield session_pb2.RpcFrame(accepted=True)
            params = json.loads(request.params_json)
            for step in params.get("script", []) if isinstance(params, dict) else []:
                if "event" in step:
                    yield session_pb2.RpcFrame(events=session_pb2.EventBatch(json=[json.dumps(step["event"])]))
                elif "result" in step:
                    yield session_pb2.RpcFrame(result_json=json.dumps(step["result"]))
                elif "error" in step:
                    yield session_pb2.RpcFrame(error=rpc_error(step["error"]))
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
    """A running `python -m services.gateway` and clients for its two ports."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        super().__init__("services.gateway", env=env, log_path=log_path)
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
    check = double.last("CheckSessionKey")
    assert (check.authorization, check.has_authorization, check.session_id) == (GOOD, True, "ses_1")


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
    assert double.last("CheckSessionKey").has_authorization is False


def test_unknown_method_needs_auth_first(gateway, double):
    before = len(double.requests)
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.launchMissiles"})
    assert lines(response) == [
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found: session.launchMissiles"}}
    ]
    assert [name for name, _ in double.requests[before:]] == ["CheckSessionKey"]


# --- streaming methods ---------------------------------------------------------------------

EVENT = {"id": "evt_1", "session_id": "ses_1", "event_type": "provider.request", "payload": {"n": 1}}


@pytest.mark.parametrize("method,rpc_name", [
    ("session.sendMessage", "SendMessage"), ("session.compact", "Compact"), ("session.subscribe", "Subscribe"),
])
def test_stream_writes_events_then_terminal_result(gateway, double, method, rpc_name):
    script = [{"event": EVENT}, {"event": {**EVENT, "id": "evt_2"}}, {"result": {"message": {"role": "assistant"}}}]
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 41, "method": method, "params": {"script": script}})
    assert response.content == (
        b'{"jsonrpc":"2.0","method":"session.event","params":' + json.dumps(EVENT).encode() + b"}\n"
        b'{"jsonrpc":"2.0","method":"session.event","params":'
        + json.dumps({**EVENT, "id": "evt_2"}).encode() + b"}\n"
        b'{"jsonrpc":"2.0","id":41,"result":{"message": {"role": "assistant"}}}\n'
    )
    forwarded = double.last(rpc_name)
    assert forwarded.session_id == "ses_1"
    assert json.loads(forwarded.params_json) == {"script": script}


def test_stream_notification_streams_events_but_no_terminal(gateway):
    script = [{"event": EVENT}, {"result": {"ok": True}}]
    response = rpc(gateway, {"jsonrpc": "2.0", "method": "session.sendMessage", "params": {"script": script}})
    assert lines(response) == [{"jsonrpc": "2.0", "method": "session.event", "params": EVENT}]


def test_stream_null_id_is_a_request(gateway):
    response = rpc(gateway, {"jsonrpc": "2.0", "id": None, "method": "session.compact",
                             "params": {"script": [{"result": {"id": "evt_9"}}]}})
    assert response.content == b'{"jsonrpc":"2.0","id":null,"result":{"id": "evt_9"}}\n'


def test_stream_id_of_any_json_type_is_echoed(gateway):
    request_id = {"trace": ["a", 1.5, None, True], "ü": "x"}
    response = rpc(gateway, {"jsonrpc": "2.0", "id": request_id, "method": "session.sendMessage",
                             "params": {"script": [{"result": {}}]}})
    assert lines(response) == [{"jsonrpc": "2.0", "id": request_id, "result": {}}]


def test_stream_error_frames_follow_their_id_mode(gateway):
    script = [
        {"error": {"code": -32000, "message": "lagged; reconnect with since_event_id", "id_mode": "NO_ID"}},
        {"error": {"code": -32000, "message": "replay failed", "id_mode": "NULL_ID"}},
        {"error": {"code": -32001, "message": "call session.registerDriver before session.sendMessage"}},
    ]
    response = rpc(gateway, {"jsonrpc": "2.0", "id": "r-1", "method": "session.sendMessage",
                             "params": {"script": script}})
    assert response.content == (
        b'{"jsonrpc":"2.0","error":{"code":-32000,"message":"lagged; reconnect with since_event_id"}}\n'
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"replay failed"}}\n'
        b'{"jsonrpc":"2.0","id":"r-1","error":{"code":-32001,'
        b'"message":"call session.registerDriver before session.sendMessage"}}\n'
    )


def test_stream_notification_drops_only_the_request_error(gateway):
    script = [
        {"error": {"code": -32000, "message": "lagged; reconnect with since_event_id", "id_mode": "NO_ID"}},
        {"error": {"code": -32001, "message": "call session.registerDriver before session.compact"}},
    ]
    response = rpc(gateway, {"jsonrpc": "2.0", "method": "session.compact", "params": {"script": script}})
    assert lines(response) == [
        {"jsonrpc": "2.0", "error": {"code": -32000, "message": "lagged; reconnect with since_event_id"}}
    ]


def test_stream_with_bad_key_is_401_before_any_stream(gateway):
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}, auth="Bearer bad")
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/json"
    assert response.json()["type"] == "unauthorized"


def test_absent_params_are_sent_as_empty_object(gateway, double):
    rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}, session="ses_params")
    forwarded = double.last("Subscribe")
    assert (forwarded.params_json, forwarded.session_id) == ("{}", "ses_params")
    rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver", "params": None})
    assert double.last("RegisterDriver").params_json == "null"


def test_stream_opens_before_the_first_frame(gateway):
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe",
            "params": {"script": [{"sleep": 0.8}, {"event": EVENT}]}}
    started = time.monotonic()
    with gateway.client.stream("POST", "/api/v1/sessions/ses_1/rpc", json=body,
                               headers={"Authorization": GOOD}) as response:
        headers_after = time.monotonic() - started
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        first_line = next(response.iter_lines())
        line_after = time.monotonic() - started
    assert headers_after < 0.6
    assert line_after >= 0.8
    assert json.loads(first_line)["params"] == EVENT


def test_frames_are_flushed_as_they_arrive(gateway):
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.sendMessage",
            "params": {"script": [{"event": EVENT}, {"sleep": 0.8}, {"result": {}}]}}
    started = time.monotonic()
    with gateway.client.stream("POST", "/api/v1/sessions/ses_1/rpc", json=body,
                               headers={"Authorization": GOOD}) as response:
        received = [(time.monotonic() - started, line) for line in response.iter_lines()]
    assert len(received) == 2
    assert received[0][0] < 0.6 <= received[1][0]


def test_client_disconnect_cancels_the_grpc_stream(gateway, double):
    double.stream_cancelled.clear()
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe",
            "params": {"script": [{"event": EVENT}, {"hang": True}]}}
    with httpx.Client(base_url=gateway.client_url, timeout=10) as client:
        with client.stream("POST", "/api/v1/sessions/ses_1/rpc", json=body,
                           headers={"Authorization": GOOD}) as response:
            assert json.loads(next(response.iter_lines()))["params"] == EVENT
    assert double.stream_cancelled.wait(5)


def test_session_service_failure_mid_stream_ends_with_internal_error(gateway):
    script = [{"event": EVENT}, {"fail": True}]
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 5, "method": "session.sendMessage", "params": {"script": script}})
    assert response.content == (
        b'{"jsonrpc":"2.0","method":"session.event","params":' + json.dumps(EVENT).encode() + b"}\n"
        b'{"jsonrpc":"2.0","id":5,"error":{"code":-32603,"message":"Internal error"}}\n'
    )
    notification = rpc(gateway, {"jsonrpc": "2.0", "method": "session.sendMessage", "params": {"script": script}})
    assert lines(notification) == [{"jsonrpc": "2.0", "method": "session.event", "params": EVENT}]


# --- unary methods -------------------------------------------------------------------------

@pytest.mark.parametrize("method,rpc_name", [
    ("session.registerDriver", "RegisterDriver"), ("session.unsubscribe", "Unsubscribe"),
    ("session.updateClientTools", "UpdateClientTools"), ("session.startRemoteSandbox", "StartRemoteSandbox"),
    ("session.stopRemoteSandbox", "StopRemoteSandbox"), ("session.execRemoteSandbox", "ExecRemoteSandbox"),
    ("session.reportLocalSandbox", "ReportLocalSandbox"), ("session.reportLocalSubagent", "ReportLocalSubagent"),
    ("session.cancelSubagent", "CancelSubagent"),
])
def test_unary_method_answers_one_terminal_frame(gateway, double, method, rpc_name):
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 9, "method": method, "params": {"k": [1, 2]}})
    assert response.content == b'{"jsonrpc":"2.0","id":9,"result":{"rpc": "' + rpc_name.encode() + b'"}}\n'
    assert double.last(rpc_name).params_json == '{"k":[1,2]}'


def test_unary_error_and_notification(gateway):
    error = {"code": -32013, "message": "sandbox_not_running: no remote sandbox is running for this session"}
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 2, "method": "session.stopRemoteSandbox",
                             "params": {"error": error}})
    assert lines(response) == [{"jsonrpc": "2.0", "id": 2, "error": error}]
    silent = rpc(gateway, {"jsonrpc": "2.0", "method": "session.unsubscribe"})
    assert (silent.status_code, silent.content) == (200, b"")
    null_mode = rpc(gateway, {"jsonrpc": "2.0", "id": 3, "method": "session.unsubscribe",
                              "params": {"error": {**error, "id_mode": "NULL_ID"}}})
    assert lines(null_mode) == [{"jsonrpc": "2.0", "id": None, "error": error}]


def test_unary_with_bad_key_is_401(gateway):
    response = rpc(gateway, {"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver"}, auth="Bearer bad")
    assert response.status_code == 401
    assert response.json()["status"] == 401


# --- REST routes ---------------------------------------------------------------------------

CLIENT_ROUTES = [
    ("POST", "/api/v1/sessions", "OpenSession", "", 201),
    ("POST", "/api/v1/sessions/ses_a/join", "JoinSession", "ses_a", 201),
    ("GET", "/api/v1/sessions/ses_a/participants", "ListParticipants", "ses_a", 200),
    ("GET", "/api/v1/sessions/ses_a/events", "ListEvents", "ses_a", 200),
    ("DELETE", "/api/v1/sessions/ses_a", "CloseSession", "ses_a", 200),
]
ADMIN_ROUTES = [
    ("POST", "/admin/v1/profiles", "CreateProfile", "", 201),
    ("GET", "/admin/v1/profiles", "ListProfiles", "", 200),
    ("GET", "/admin/v1/profiles/pro_a", "GetProfile", "pro_a", 200),
    ("PUT", "/admin/v1/profiles/pro_a", "ReplaceProfile", "pro_a", 200),
    ("DELETE", "/admin/v1/profiles/pro_a", "DeleteProfile", "pro_a", 204),
    ("POST", "/admin/v1/keys", "CreateKey", "", 201),
    ("GET", "/admin/v1/keys", "ListKeys", "", 200),
    ("DELETE", "/admin/v1/keys/key_a", "RevokeKey", "key_a", 204),
    ("GET", "/admin/v1/sessions", "ListSessions", "", 200),
    ("GET", "/admin/v1/sessions/ses_a/events", "ListSessionEvents", "ses_a", 200),
    ("GET", "/admin/v1/mcp-servers", "ListMcpServers", "", 200),
    ("GET", "/admin/v1/providers", "ListProviders", "", 200),
    ("GET", "/admin/v1/config", "GetConfig", "", 200),
    ("GET", "/admin/v1/sandbox-status", "GetSandboxStatus", "", 200),
]


@pytest.mark.parametrize("port,method,path,rpc_name,path_id,status",
                         [("client", *route) for route in CLIENT_ROUTES] + [("admin", *route) for route in ADMIN_ROUTES])
def test_rest_route_forwards_the_request(gateway, double, port, method, path, rpc_name, path_id, status):
    http = gateway.client if port == "client" else gateway.admin
    response = http.request(method, path, params={"limit": "2", "cursor": ""}, content=b'{"a": 1}',
                            headers={"Authorization": "Bearer k", "Content-Type": "application/json"})
    assert response.status_code == status
    if status == 204:
        assert response.content == b""
        assert "content-type" not in response.headers
    else:
        assert response.headers["content-type"] == "application/json"
        assert response.json() == {
            "rpc": rpc_name, "authorization": "Bearer k", "has_authorization": True, "path_id": path_id,
            "body": '{"a": 1}', "content_type": "application/json", "query": {"limit": "2", "cursor": ""},
        }
    assert double.last(rpc_name).path_id == path_id


def test_rest_without_authorization_is_forwarded_as_absent(gateway):
    body = gateway.client.get("/api/v1/sessions/ses_a/events").json()
    assert (body["authorization"], body["has_authorization"], body["content_type"]) == ("", False, "")


def test_no_auth_utility_routes(gateway):
    health = gateway.client.get("/healthz")
    assert (health.status_code, health.content) == (200, b"")
    meta = gateway.client.get("/api/v1/meta")
    assert meta.status_code == 200
    assert meta.headers["content-type"] == "application/json"
    assert meta.json() == {"version": "0.1.0", "api_versions": ["v1"]}


@pytest.mark.parametrize("port,path", [
    ("client", "/admin/v1/profiles"), ("client", "/admin/v1/config"), ("admin", "/api/v1/meta"),
    ("admin", "/healthz"), ("admin", "/api/v1/sessions"), ("client", "/api/v1/sessions/ses_a/unknown"),
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
    return subprocess.run([sys.executable, "-m", "services.gateway"], cwd=ROOT, env=env,
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
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe",
            "params": {"script": [{"event": EVENT}, {"hang": True}]}}
    with gateway.client.stream("POST", "/api/v1/sessions/ses_1/rpc", json=body,
                               headers={"Authorization": GOOD}) as response:
        stream = response.iter_lines()
        assert json.loads(next(stream))["params"] == EVENT
        started = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        assert list(stream) == []  # the stream ends cleanly, no terminal frame
    assert gateway.process.wait(10) == 0
    assert time.monotonic() - started < 3
    gateway.stop()


def test_small_responses_are_not_held_back(gateway):
    # Headers and body go out in separate writes; without TCP_NODELAY each response
    # waits ~40 ms for a delayed ACK.
    timings = []
    for _ in range(15):
        started = time.perf_counter()
        assert gateway.client.get("/api/v1/sessions/ses_a/events").status_code == 200
        timings.append(time.perf_counter() - started)
    assert sorted(timings)[len(timings) // 2] < 0.02
