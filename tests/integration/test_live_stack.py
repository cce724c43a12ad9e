"""The live loop end to end over real sockets, the stack in this process: lag, OpenAI tools, FIFO, envelope.
(A fallback across both wire kinds and a runner that goes down: test_live_processes.py.)"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import grpc
import httpx
import pytest

from bae.common.internal import InternalPlane
from bae.common.protos import client_api_pb2, edge_pb2, session_pb2_grpc
from testkit.inprocess import launch_inprocess_stack
from testkit.live import all_events, join, new_session, notifications, register, result, rpc, send, types
from testkit.mockllm import MockLLM, Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.inprocess

TOKEN = "sk-test-secret-token-123456"
LAGGED = {"jsonrpc": "2.0", "error": {"code": -32000, "message": "lagged; reconnect with since_event_id"}}


def stack_toml(mock: MockLLM) -> str:
    # "mock" speaks Anthropic Messages, "gpt" OpenAI Chat Completions; both are the same MockLLM.
    return mock_provider_toml(mock.base_url) + mock_provider_toml(mock.base_url, name="gpt", kind="openai")


@pytest.fixture(scope="module")
def provider_timeout_stack(tmp_path_factory, mock):
    running = launch_inprocess_stack(tmp_path_factory.mktemp("live"), stack_toml(mock), MOCK_LLM_TOKEN=TOKEN,
                                     BAE_PROVIDER_TIMEOUT="2")
    yield running
    running.close()


@pytest.fixture
def stack(provider_timeout_stack, mock):
    mock.reset()
    return provider_timeout_stack


@pytest.fixture(scope="module")
def shared(tmp_path_factory, mock):
    """One stack for the many one-request cases (envelope errors, params, auth)."""
    running = launch_inprocess_stack(tmp_path_factory.mktemp("shared"), stack_toml(mock), MOCK_LLM_TOKEN=TOKEN)
    yield running
    running.close()


def join_driver(stack, sid, profile, name: str) -> str:
    """Another client key on the same profile joins and registers; returns its session key."""
    skey = join(stack, sid, profile, name)
    register(stack, sid, skey)
    return skey


def send_body(content, request_id=1) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "session.sendMessage",
            "params": {"message": {"role": "user", "content": content}}}


class PausedReader:
    """A raw HTTP/1.1 client that sends one /rpc request and reads nothing until asked.

    The kernel's receive and send buffers absorb the first megabytes; after that the
    server side backs up the way it would for a stalled observer.
    """

    def __init__(self, base_url: str, path: str, key: str, body: dict) -> None:
        url = urlsplit(base_url)
        self.sock = socket.socket()
        self.sock.connect((url.hostname, url.port))
        payload = json.dumps(body).encode()
        self.sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n".encode() + payload
        )

    def read_to_end(self) -> tuple[bytes, list[dict]]:
        """(status line and headers, the NDJSON lines of the chunked body)."""
        self.sock.settimeout(30)
        raw = b""
        while chunk := self.sock.recv(1 << 20):
            raw += chunk
        self.sock.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        return head, [json.loads(line) for line in dechunk(body).splitlines()]


def dechunk(body: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, body = out + body[:size], body[size + 2:]



def post_rpc(stack, sid, key, body: bytes | dict) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return stack.client.post(f"/api/v1/sessions/{sid}/rpc", content=content, headers=headers)


def ndjson(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in response.text.splitlines()]


# --- 1. subscriber lag -----------------------------------------------------------------------

def test_stalled_observer_is_cut_off_with_lagged_and_the_driver_is_not(stack, mock):
    sid, skey, _ = new_session(stack, fallback_providers=["gpt"])
    register(stack, sid, skey)
    observer = PausedReader(
        stack.client_url, f"/api/v1/sessions/{sid}/rpc", skey,
        {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"},
    )
    time.sleep(0.3)
    # A failed attempt's body is logged but never enters history: each turn pushes ~3 MB at
    # the observer while provider requests stay small. ~30 MB fills every buffer between
    # the session service and the stalled socket; 300 tool calls then overflow its queue.
    failure_body = "x" * 3_000_000
    for _ in range(10):
        mock.enqueue(Reply.error(500, failure_body), Reply.text("ok"))
        frames = send(stack, sid, skey, "fill")
        outcome = result(frames)
        assert outcome["message"]["content"] == [{"type": "text", "text": "ok"}]
        assert [e["id"] for e in notifications(frames)] == [e["id"] for e in outcome["events"][1:]]
    mock.enqueue(Reply.tool_use([(f"tu_{i}", "get_time", {}) for i in range(300)]))
    frames = send(stack, sid, skey, "many")
    outcome = result(frames)
    assert len(outcome["message"]["content"]) == 300
    assert [e["id"] for e in notifications(frames)] == [e["id"] for e in outcome["events"][1:]]
    assert result(rpc(stack.client, sid, skey, "session.unsubscribe")) == {"unsubscribed": True}

    head, lines = observer.read_to_end()
    assert head.startswith(b"HTTP/1.1 200 ")
    assert lines[-1] == LAGGED  # no id: a notification-style error, and the stream ends
    seen = [line["params"]["id"] for line in lines[:-1]]
    recorded = [e["id"] for e in all_events(stack, sid, skey)]
    first = recorded.index(seen[0])
    assert seen == recorded[first:first + len(seen)]  # gapless up to the cut
    assert len(seen) < len(recorded) - first


def test_a_reader_that_keeps_up_gets_a_batch_larger_than_the_lag_limit(stack, mock):
    """300 tool.call events are recorded and published at once; no reader may lag on that alone."""
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    watched: list[dict] = []

    def watch():
        body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}
        with httpx.Client(base_url=stack.client.base_url, timeout=30) as client:
            with client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=body,
                               headers={"Authorization": f"Bearer {skey}"}) as response:
                watched.extend(json.loads(line) for line in response.iter_lines())

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(0.3)
    mock.enqueue(Reply.tool_use([(f"tu_{i}", "get_time", {}) for i in range(300)]))
    frames = send(stack, sid, skey, "many")
    outcome = result(frames)
    assert [block["id"] for block in outcome["message"]["content"]] == [f"tu_{i}" for i in range(300)]
    assert types(outcome["events"]) == [
        "client.message.send", "provider.request", "provider.response", *["tool.call"] * 300, "server.message.send",
    ]
    assert [e["id"] for e in notifications(frames)] == [e["id"] for e in outcome["events"][1:]]
    assert result(rpc(stack.client, sid, skey, "session.unsubscribe")) == {"unsubscribed": True}
    watcher.join(10)
    assert [line["params"]["id"] for line in watched] == [e["id"] for e in outcome["events"]]


def test_events_committed_together_reach_the_gateway_in_one_frame(shared, mock):
    """At the session service's own boundary: a text turn's events written in one commit go in one
    gRPC message. A slow provider's provider.request is written while it waits; a fast one's (within
    the runner's 5 ms) with its answer, so that whole turn is three messages."""
    sid, skey, _ = new_session(shared)
    register(shared, sid, skey)
    plane = InternalPlane.of(shared.settings)
    request = client_api_pb2.SendMessageRequest(
        credential=edge_pb2.Credential(authorization=f"Bearer {skey}", present=True), session_id=sid,
        params=client_api_pb2.SendMessageParams(message=client_api_pb2.MessageParam(
            content=edge_pb2.JsonValue(json='"hi"'))))

    async def frames() -> list[client_api_pb2.TurnFrame]:
        async with grpc.aio.insecure_channel(shared.settings.session_grpc_addr) as channel:
            call = session_pb2_grpc.SessionServiceStub(channel).SendMessage(
                request, metadata=[plane.token_metadata], timeout=30)
            return [frame async for frame in call]

    def turn(reply: Reply) -> tuple[list[str | None], list[list[str]]]:
        mock.enqueue(reply)
        received = asyncio.run(frames())
        events = [[event.event_type for event in frame.events.events] for frame in received
                  if frame.WhichOneof("kind") == "events"]
        return [frame.WhichOneof("kind") for frame in received], events

    shapes, events = turn(Reply.hang(0.2))
    assert shapes == ["accepted", "events", "events", "result"]
    assert events == [["provider.request"], ["provider.response", "server.message.send"]]
    # Whether the provider answers within 5 ms is up to the machine: one of a few quick turns does.
    quick = [turn(Reply.text("quick")) for _ in range(5)]
    assert (["accepted", "events", "result"], [["provider.request", "provider.response", "server.message.send"]]) in quick, quick


# --- 3. OpenAI-kind tool round trip ----------------------------------------------------------

def test_openai_primary_client_tool_round_trip_sends_valid_chat_completions(stack, mock):
    sid, skey, _ = new_session(stack, primary="gpt")
    register(stack, sid, skey)
    mock.enqueue(Reply.tool_use([("call_1", "get_time", {"tz": "UTC"})], text="Checking."), Reply.text("Noon."))
    first = result(send(stack, sid, skey, "time?"))
    assert first["message"] == {"role": "assistant", "content": [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "call_1", "name": "get_time", "input": {"tz": "UTC"}, "dispatch": "client"},
    ]}
    second = result(send(stack, sid, skey, [{"type": "tool_result", "tool_use_id": "call_1", "content": "12:00"}]))
    assert second["message"] == {"role": "assistant", "content": [{"type": "text", "text": "Noon."}]}
    assert types(second["events"]) == [
        "client.message.send", "tool.result", "provider.request", "provider.response", "server.message.send",
    ]
    tools = [{"type": "function", "function": {"name": "get_time", "description": "get_time",
                                               "parameters": {"type": "object"}}}]
    assert [r["path"] for r in mock.requests] == ["/v1/chat/completions"] * 2
    assert mock.requests[0]["body"] == {
        "model": "mock-model", "max_tokens": 4096,
        "messages": [{"role": "user", "content": "time?"}], "tools": tools,
    }
    assert mock.requests[1]["body"] == {
        "model": "mock-model", "max_tokens": 4096,
        "messages": [
            {"role": "user", "content": "time?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz":"UTC"}'}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        ],
        "tools": tools,
    }
    assert mock.requests[1]["headers"]["authorization"] == f"Bearer {TOKEN}"
    # The canonical history the event records is stripped of routing fields too.
    logged = second["events"][2]["payload"]
    assert logged["provider"] == "openai" and "normalized" not in logged
    assert logged["messages"][1]["content"][1] == {"type": "tool_use", "id": "call_1", "name": "get_time",
                                                   "input": {"tz": "UTC"}}
    for sent in (json.dumps(mock.requests[1]["body"]), json.dumps(logged["messages"])):
        assert '"dispatch"' not in sent and '"caller"' not in sent


# --- 5. envelope and params errors through the real stack ------------------------------------

@pytest.fixture(scope="module")
def driver(shared):
    """(session id, a registered driver's session key, an unregistered participant's session key)."""
    sid, skey, profile = new_session(shared)
    register(shared, sid, skey)
    key = shared.create_key(profile["id"], name="observer")["key"]
    joined = shared.client.post(f"/api/v1/sessions/{sid}/join", json={"tools": []},
                                headers={"Authorization": f"Bearer {key}"})
    assert joined.status_code == 201, joined.text
    return sid, skey, joined.json()["session_key"]


def error_line(request_id, code: int, message: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}},
                      separators=(",", ":")).encode() + b"\n"


ENVELOPE_CASES = [
    (b"{not json", error_line(None, -32700, "Parse error")),
    (b'[{"jsonrpc":"2.0","id":1,"method":"session.sendMessage"}]',
     error_line(None, -32600, "Invalid Request: batch requests are not supported")),
    (b"42", error_line(None, -32600, "Invalid Request")),
    (b'{"jsonrpc":"1.0","id":"a","method":"session.sendMessage"}',
     error_line("a", -32600, 'Invalid Request: missing or wrong "jsonrpc" version')),
    (b'{"jsonrpc":"2.0","id":2}', error_line(2, -32600, 'Invalid Request: missing "method"')),
    (b'{"jsonrpc":"2.0","id":3,"method":"session.nope"}', error_line(3, -32601, "Method not found: session.nope")),
    (b'{"jsonrpc":"2.0","id":4,"method":"session.compact","params":{"prompt":5}}',
     error_line(4, -32602, "Invalid params: invalid type: integer `5`, expected a string or null")),
    (b'{"jsonrpc":"2.0","id":5,"method":"session.reportLocalSubagent","params":{"state":"start"}}',
     error_line(5, -32602, 'Invalid params: "subagent_id", "harness", and "model" must be non-empty strings')),
    (b'{"jsonrpc":"2.0","id":6,"method":"session.cancelSubagent","params":{"subagent_id":"sba_1"}}',
     error_line(6, -32014, 'subagent_not_found: no tracked subagent "sba_1" for this session')),
]


@pytest.mark.parametrize("body,frame", ENVELOPE_CASES)
def test_envelope_error_is_one_exact_frame(shared, driver, body, frame):
    sid, skey, _ = driver
    response = post_rpc(shared, sid, skey, body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.content == frame


PARAMS_CASES = [
    ("session.sendMessage", {}, 'Invalid params: missing "message"'),
    ("session.sendMessage", [1], "Invalid params: invalid type: sequence, expected a map"),
    ("session.sendMessage", {"message": "hi"}, 'Invalid params: invalid type: string "hi", expected struct Message'),
    ("session.sendMessage", {"message": {"role": "user"}}, "Invalid params: missing field `content`"),
    ("session.sendMessage", {"message": {"content": 5}},
     "Invalid params: invalid type: integer `5`, expected a string or an array of content blocks"),
    ("session.subscribe", [1], "Invalid params: invalid type: sequence, expected a map"),
    ("session.updateClientTools", {}, 'Invalid params: missing "tools"'),
    ("session.updateClientTools", {"tools": {}}, "Invalid params: invalid type: map, expected a sequence"),
    ("session.updateClientTools", {"tools": [{"name": " "}]},
     'Invalid params: every tool requires a non-empty "name"'),
    ("session.startRemoteSandbox", {}, 'Invalid params: missing "image"'),
    ("session.startRemoteSandbox", {"image": " "}, 'Invalid params: missing "image"'),
    ("session.execRemoteSandbox", {}, 'Invalid params: missing "command"'),
    ("session.reportLocalSandbox", {"state": "paused", "image": "x"},
     'Invalid params: "state" must be "running", "stopped", or "error"'),
    ("session.reportLocalSandbox", {"state": "running"}, 'Invalid params: missing "image"'),
]


@pytest.mark.parametrize("method,params,message", PARAMS_CASES)
def test_invalid_params_is_32602_and_records_nothing(shared, driver, method, params, message):
    sid, skey, _ = driver
    before = len(all_events(shared, sid, skey))
    response = post_rpc(shared, sid, skey, {"jsonrpc": "2.0", "id": 9, "method": method, "params": params})
    assert ndjson(response) == [{"jsonrpc": "2.0", "id": 9, "error": {"code": -32602, "message": message}}]
    assert len(all_events(shared, sid, skey)) == before


@pytest.mark.parametrize("method", ["session.sendMessage", "session.updateClientTools"])
def test_driver_gate_is_checked_before_params(shared, driver, method):
    sid, _, unregistered = driver
    response = post_rpc(shared, sid, unregistered, {"jsonrpc": "2.0", "id": 1, "method": method, "params": [1]})
    assert ndjson(response) == [{"jsonrpc": "2.0", "id": 1, "error": {
        "code": -32001, "message": f"call session.registerDriver before {method}"}}]


@pytest.fixture(scope="module")
def other_session_key(shared) -> str:
    """A valid session key, but for another session."""
    return new_session(shared)[1]


UNAUTHORIZED = {"type": "unauthorized", "title": "Unauthorized", "status": 401, "detail": "invalid session key"}


@pytest.mark.parametrize("body", [
    b"{not json",
    b"[]",
    b'{"jsonrpc":"2.0","id":1,"method":"session.nope"}',
    b'{"jsonrpc":"2.0","id":1,"method":"session.registerDriver"}',
    b'{"jsonrpc":"2.0","id":1,"method":"session.subscribe"}',
    b'{"jsonrpc":"2.0","id":1,"method":"session.sendMessage","params":{"message":{"content":"hi"}}}',
])
def test_bad_key_is_401_before_any_stream(shared, driver, other_session_key, body):
    sid, _, _ = driver
    for key, detail in ((None, "missing Authorization header"), ("bae_ses_nope", "invalid session key"),
                        (other_session_key, "invalid session key")):
        response = post_rpc(shared, sid, key, body)
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/json"
        assert response.json() == {**UNAUTHORIZED, "detail": detail}


def test_notification_send_streams_events_without_a_terminal_frame(shared, driver, mock):
    sid, skey, _ = driver
    mock.reset()
    mock.enqueue(Reply.text("quiet"))
    body = send_body("no id")
    del body["id"]
    lines = ndjson(post_rpc(shared, sid, skey, body))
    assert all("id" not in line for line in lines)
    assert types([line["params"] for line in lines]) == ["provider.request", "provider.response", "server.message.send"]
    assert lines[-1]["params"]["payload"]["content"] == [{"type": "text", "text": "quiet"}]


# --- 6. client disconnect mid-turn -----------------------------------------------------------

def test_driver_disconnect_mid_turn_the_turn_still_finishes_and_is_durable(stack, mock):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.enqueue(Reply.hang(1))
    with httpx.Client(base_url=stack.client.base_url, timeout=10) as client:
        with client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=send_body("slow"),
                           headers={"Authorization": f"Bearer {skey}"}) as response:
            first = json.loads(next(response.iter_lines()))
            assert first["params"]["event_type"] == "provider.request"
    # The connection is gone; the turn keeps going inside the session service.
    deadline = time.monotonic() + 10
    while types(all_events(stack, sid, skey))[-1] != "server.message.send":
        assert time.monotonic() < deadline, types(all_events(stack, sid, skey))
        time.sleep(0.1)
    recorded = all_events(stack, sid, skey)
    assert types(recorded)[-4:] == ["client.message.send", "provider.request", "provider.response", "server.message.send"]
    assert recorded[-1]["payload"] == {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}
    mock.enqueue(Reply.text("next"))
    outcome = result(send(stack, sid, skey, "again"))
    assert outcome["message"]["content"] == [{"type": "text", "text": "next"}]
    assert [m["role"] for m in mock.requests[-1]["body"]["messages"]] == ["user", "assistant", "user"]


def test_queued_caller_that_disconnects_leaves_no_trace(stack, mock):
    sid, skey_a, profile = new_session(stack)
    register(stack, sid, skey_a)
    skey_b = join_driver(stack, sid, profile, "b")
    mock.enqueue(Reply.hang(1), Reply.text("after"))
    a_frames: list = []
    a_thread = threading.Thread(target=lambda: a_frames.extend(send(stack, sid, skey_a, "A slow")))
    a_thread.start()
    time.sleep(0.3)
    with httpx.Client(base_url=stack.client.base_url, timeout=10) as client:
        with client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=send_body("B gives up"),
                           headers={"Authorization": f"Bearer {skey_b}"}) as response:
            assert response.status_code == 200  # the stream opened, silent while queued
    a_thread.join(10)
    assert result(a_frames)["message"]["content"] == [{"type": "text", "text": "ok"}]
    time.sleep(0.2)
    assert "B gives up" not in json.dumps(all_events(stack, sid, skey_a))
    outcome = result(send(stack, sid, skey_b, "B again"))
    assert outcome["message"]["content"] == [{"type": "text", "text": "after"}]


# --- 7. FIFO across gateway connections ------------------------------------------------------

def test_queued_drivers_write_zero_bytes_and_run_in_arrival_order(stack, mock):
    sid, skey_a, profile = new_session(stack)
    register(stack, sid, skey_a)
    queued = {"B": join_driver(stack, sid, profile, "b"), "C": join_driver(stack, sid, profile, "c")}
    mock.enqueue(Reply.hang(1), Reply.text("for B"), Reply.text("for C"))
    started = time.monotonic()
    a_frames: list = []
    a_done: list[float] = []

    def run_a() -> None:
        a_frames.extend(send(stack, sid, skey_a, "A asks"))
        a_done.append(time.monotonic() - started)

    a_thread = threading.Thread(target=run_a)
    a_thread.start()
    seen: dict[str, dict] = {}

    def queue_up(name: str) -> None:
        with httpx.Client(base_url=stack.client.base_url, timeout=30) as client:
            with client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=send_body(f"{name} asks"),
                               headers={"Authorization": f"Bearer {queued[name]}"}) as response:
                opened = time.monotonic() - started
                raw = response.iter_raw()
                first_chunk = next(raw)
                first_byte = time.monotonic() - started
                body = first_chunk + b"".join(raw)
        seen[name] = {"opened": opened, "first_byte": first_byte,
                      "frames": [json.loads(line) for line in body.splitlines()]}

    threads = []
    for name in ("B", "C"):
        time.sleep(0.3)  # B arrives while A runs, C after B
        threads.append(threading.Thread(target=queue_up, args=(name,)))
        threads[-1].start()
    for thread in (a_thread, *threads):
        thread.join(15)
    assert result(a_frames)["message"]["content"] == [{"type": "text", "text": "ok"}]
    for name in ("B", "C"):
        assert seen[name]["opened"] < a_done[0]  # headers at once, while A still runs ...
        assert seen[name]["first_byte"] >= 1.0  # ... but no byte before A's slow provider call answered
        assert result(seen[name]["frames"])["message"]["content"] == [{"type": "text", "text": f"for {name}"}]
    assert seen["B"]["first_byte"] < seen["C"]["first_byte"]
    turns = [e["payload"]["content"] for e in all_events(stack, sid, skey_a) if e["event_type"] == "client.message.send"]
    assert turns == ["A asks", "B asks", "C asks"]
    assert [r["body"]["messages"][-1]["content"] for r in mock.requests] == ["A asks", "B asks", "C asks"]


# --- messages larger than gRPC's default 4 MB limit ------------------------------------------

def test_a_turn_larger_than_four_megabytes_crosses_every_service(stack, mock):
    """Provider requests may be far larger than 4 MB; no internal hop may refuse them."""
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.enqueue(Reply.text("read it"))
    document = "y" * 5_000_000
    outcome = result(send(stack, sid, skey, document))
    assert outcome["message"]["content"] == [{"type": "text", "text": "read it"}]
    assert mock.requests[-1]["body"]["messages"] == [{"role": "user", "content": document}]
