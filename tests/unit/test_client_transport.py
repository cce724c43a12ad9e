"""bae_client over a swapped transport (httpx.MockTransport): what it sends, and how it reads what a server
answers, including a subscription cut off as lagged or by a broken connection, and deltas caught up after it.
The server side here is a script of the wire format of docs/reference/rpc.md; test_client_library.py drives
the same client against real services."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

import httpx
import pytest

from bae_client import (
    AsyncClient,
    Client,
    Delta,
    Event,
    EventType,
    Hooks,
    InvalidParamsError,
    QuotaExceededError,
    Tool,
    TransportError,
)

pytestmark = pytest.mark.unit

SID = "ses_1"


def event(number: int, kind: str = "client.message.send", **payload: Any) -> dict[str, Any]:
    return {"id": f"evt_{number}", "session_id": SID, "client_key_id": "key_1", "event_type": kind,
            "payload": payload, "created_at": "2026-12-07T00:00:00Z"}


def ndjson(*frames: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(frame).encode() + b"\n" for frame in frames)


def note(item: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "session.event", "params": item}


def delta(seq: int, text: str, index: int = 0) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "session.delta",
            "params": {"session_id": SID, "request_event_id": "evt_2", "seq": seq, "index": index, "kind": "text",
                       "text": text}}


class Server:
    """Answers as the client port would, from a script: open, then one rpc answer per call in order."""

    def __init__(self, rpc_answers: list[Callable[[dict[str, Any]], httpx.Response]]) -> None:
        self.rpc_answers = rpc_answers
        self.calls: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/sessions":
            assert request.headers["authorization"] == "Bearer bae_key"
            self.calls.append(json.loads(request.content))
            return httpx.Response(201, json={"session_id": SID, "session_key": "bae_ses_key", "profile": {}})
        if request.url.path == f"/api/v1/sessions/{SID}/events":
            return httpx.Response(200, json={"items": [event(1, "session.open")], "next_cursor": None})
        assert request.url.path == f"/api/v1/sessions/{SID}/rpc"
        assert request.headers["authorization"] == "Bearer bae_ses_key"
        body = json.loads(request.content)
        self.calls.append(body)
        return self.rpc_answers.pop(0)(body)


def result(value: Any, *notifications: dict[str, Any]) -> Callable[[dict[str, Any]], httpx.Response]:
    return lambda body: httpx.Response(200, content=ndjson(*notifications, {"jsonrpc": "2.0", "id": body["id"],
                                                                            "result": value}))


TOOL_TURN = {"message": {"role": "assistant", "content": [
    {"type": "text", "text": "Let me look."},
    {"type": "tool_use", "id": "tu_1", "name": "get_time", "input": {"zone": "UTC"}, "dispatch": "client"},
    {"type": "tool_use", "id": "tu_2", "name": "search", "input": {}, "dispatch": "mcp"}]},
    "events": [event(2), event(3, "tool.call", name="get_time")]}
ANSWER = {"message": {"role": "assistant", "content": [{"type": "text", "text": "Noon."}]}, "events": [event(4)]}


def script() -> Server:
    return Server([result({"registered": True}),
                   result(TOOL_TURN, note(event(3, "tool.call")), delta(0, "Let me")),
                   result(ANSWER, note(event(4, "server.message.send")))])


def test_the_loop_over_a_mock_transport() -> None:
    server = script()
    order: list[str] = []
    hooks = Hooks(before_send=lambda _: order.append("before_send"), after_receive=lambda _: order.append("after"),
                  before_tool_call=lambda call: order.append(f"call {call['name']}"),
                  after_tool_call=lambda _: order.append("result"), on_event=lambda e: order.append(e.event_type))
    deltas: list[Delta] = []
    with Client("http://bae.test", client_key="bae_key", hooks=hooks,
                transport=httpx.MockTransport(server)) as bae:
        session = bae.open(tools=[Tool("get_time", handler=lambda input: {"time": "12:00", **input})],
                           compaction={"mode": "client"})
        reply = session.send("time?", on_delta=deltas.append)
    assert reply.text == "Noon." and reply.events[0].event_type is EventType.CLIENT_MESSAGE_SEND
    assert order == ["before_send", "tool.call", "after", "call get_time", "result", "before_send",
                     "server.message.send", "after"]
    assert deltas == [Delta(SID, "evt_2", 0, 0, "text", "Let me")]
    opened, register, first, second = server.calls
    assert opened["compaction"] == {"mode": "client"} and opened["tools"][0]["name"] == "get_time"
    assert register["method"] == "session.registerDriver"
    assert first["params"] == {"message": {"role": "user", "content": "time?"}, "stream_deltas": True}
    # Only the client's call is answered; the MCP one is the server's.
    assert second["params"]["message"]["content"] == [
        {"type": "tool_result", "tool_use_id": "tu_1", "content": '{"time": "12:00", "zone": "UTC"}'}]


async def test_the_async_loop_over_a_mock_transport() -> None:
    server = script()

    async def get_time(input: dict) -> str:
        return "12:00"

    async with AsyncClient("http://bae.test", client_key="bae_key", transport=httpx.MockTransport(server)) as bae:
        session = await bae.open(tools=[Tool("get_time", handler=get_time)])
        reply = await session.send("time?")
        assert [event.event_id async for event in session.all_events()] == ["evt_1"]
    assert reply.text == "Noon."
    assert server.calls[-1]["params"]["message"]["content"][0]["content"] == "12:00"


def test_error_frames_are_typed() -> None:
    error = {"code": -32602, "message": "Invalid params: missing \"message\""}
    quota = {"code": -32050, "message": "quota_exceeded: max_subscribers_per_session 2 reached"}
    server = Server([lambda body: httpx.Response(200, content=ndjson({"jsonrpc": "2.0", "id": body["id"],
                                                                      "error": error})),
                     lambda body: httpx.Response(200, content=ndjson({"jsonrpc": "2.0", "id": body["id"],
                                                                      "error": quota}))])
    with Client("http://bae.test", client_key="bae_key", transport=httpx.MockTransport(server)) as bae:
        session = bae.open()
        with pytest.raises(InvalidParamsError) as invalid:
            session.call("session.sendMessage", {})
        assert invalid.value.code == -32602 and invalid.value.message == error["message"]
        with pytest.raises(QuotaExceededError):
            list(session.subscribe(since_event_id="evt_0"))


def broken(*chunks: bytes) -> Iterator[bytes]:
    yield from chunks
    raise httpx.ReadError("connection reset by peer")


def test_a_subscription_resumes_after_lagged_and_after_a_broken_connection() -> None:
    lagged = {"jsonrpc": "2.0", "error": {"code": -32000, "message": "lagged; reconnect with since_event_id"}}
    answers = [
        # Cut off as lagged after evt_2 and the first delta of the call evt_2 started.
        lambda body: httpx.Response(200, content=ndjson(note(event(2, "provider.request")), delta(0, "The qu"),
                                                        lagged)),
        # Back from evt_2: the catch-up holds the block so far (one delta, seq 1), then the connection breaks.
        lambda body: httpx.Response(200, content=broken(ndjson(delta(1, "The quick"), delta(2, " brown")))),
        # Back from evt_2 again: the catch-up repeats what was delivered, then live deltas and the response.
        lambda body: httpx.Response(200, content=ndjson(delta(2, "The quick brown"), delta(3, " fox"),
                                                        note(event(3, "provider.response")))),
    ]
    server = Server(answers)
    items: list[Event | Delta] = []
    with Client("http://bae.test", client_key="bae_key", transport=httpx.MockTransport(server)) as bae:
        session = bae.open()
        with session.subscribe(deltas=True) as subscription:
            for item in subscription:
                items.append(item)
                if isinstance(item, Event) and item.event_type == EventType.PROVIDER_RESPONSE:
                    break
        assert subscription.reconnects == 2 and subscription.last_event_id == "evt_3"
    since = [call["params"].get("since_event_id") for call in server.calls[1:]]
    assert since == ["evt_1", "evt_2", "evt_2"]  # evt_1: the last stored event when it subscribed
    assert all(call["params"]["deltas"] is True for call in server.calls[1:])
    assert [item.event_id if isinstance(item, Event) else item.text for item in items] == [
        "evt_2", "The qu", "ick", " brown", " fox", "evt_3"]


def test_a_stopped_server_is_a_transport_error_that_says_what_to_do() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    with Client("http://127.0.0.1:9", transport=httpx.MockTransport(refuse)) as bae:
        with pytest.raises(TransportError) as failed:
            bae.meta()
    assert str(failed.value).startswith("cannot reach the BAE server at http://127.0.0.1:9 (")
    assert "bae run" in str(failed.value) and "BAE_ADDR" in str(failed.value)


def test_defaults_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAE_ADDR", "10.1.2.3:9090")
    monkeypatch.setenv("BAE_CLIENT_KEY", "bae_from_env")
    with Client() as bae:
        assert (bae.base_url, bae.client_key) == ("http://10.1.2.3:9090", "bae_from_env")


def test_tool_define() -> None:
    @Tool.define(input_schema={"type": "object", "properties": {"zone": {"type": "string"}}})
    def get_time(input: dict) -> str:
        """The time in a zone."""
        return "noon"

    assert get_time.declaration() == {"name": "get_time", "description": "The time in a zone.",
                                      "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
    assert get_time.handler is not None and get_time.handler({}) == "noon"
