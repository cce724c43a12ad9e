"""Token streaming through the whole stack: deltas on request, never stored, caught up on join.

gateway -> session -> runner -> the mock LLM, which streams as the real APIs do (Anthropic's
event stream, OpenAI's chat.completion.chunk lines) when a call asks for it.
"""

from __future__ import annotations

import json
import sys
import threading

import pytest

from testkit.inprocess import launch_inprocess_stack
from testkit.live import new_session, register, result, rpc, types
from testkit.mcp_support import TOOLS_SERVER
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml
from testkit.streams import Listener, deltas_of, events_of

pytestmark = pytest.mark.inprocess

TOKEN = "sk-test-secret-token-123456"
WIRES = ("anthropic", "openai")
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def shared(tmp_path_factory, mock):
    toml = (
        mock_provider_toml(mock.base_url)
        + mock_provider_toml(mock.base_url, name="gpt", kind="openai")
        + mock_provider_toml(mock.base_url, name="backup", kind="openai")
        + f'[[mcp.servers]]\nname = "local"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
        + f'args = ["{TOOLS_SERVER}", "stdio"]\n'
    )
    running = launch_inprocess_stack(tmp_path_factory.mktemp("streaming"), toml, MOCK_LLM_TOKEN=TOKEN)
    yield running
    running.close()


@pytest.fixture
def stack(shared, mock):
    mock.reset()
    return shared


def open_on(stack, wire: str, **profile) -> tuple[str, str]:
    primary = {"anthropic": "mock", "openai": "gpt"}[wire]
    sid, skey, _ = new_session(stack, primary_provider=primary, **profile)
    register(stack, sid, skey)
    return sid, skey


def send(stack, sid: str, skey: str, text: str, **params) -> list[dict]:
    return rpc(stack.client, sid, skey, "session.sendMessage", {"message": {"role": "user", "content": text}, **params})


def response_text(event: dict) -> str:
    """The text of a stored provider.response, in either wire's body."""
    body = event["payload"]["body"]
    if "choices" in body:
        return body["choices"][0]["message"]["content"] or ""
    return "".join(block["text"] for block in body["content"] if block["type"] == "text")


def subscribe(stack, sid: str, skey: str, **params) -> Listener:
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe", "params": params}
    return Listener(str(stack.client.base_url), "POST", f"/api/v1/sessions/{sid}/rpc",
                    headers={"Authorization": f"Bearer {skey}"}, json_body=body)


def frames_deltas(frames: list[dict]) -> list[dict]:
    return [frame["params"] for frame in frames if frame.get("method") == "session.delta"]


@pytest.mark.parametrize("wire", WIRES)
def test_text_deltas_join_into_the_stored_response(stack, mock, wire):
    sid, skey = open_on(stack, wire)
    mock.enqueue(Reply.text(TEXT).streaming())
    frames = send(stack, sid, skey, "Say it.", stream_deltas=True)
    events = result(frames)["events"]
    assert types(events) == ["client.message.send", "provider.request", "provider.response", "server.message.send"]
    request, response = events[1], events[2]
    deltas = frames_deltas(frames)
    assert len(deltas) == len(TEXT.split())  # the mock streams a word per delta
    assert {delta["request_event_id"] for delta in deltas} == {request["id"]}
    assert [delta["seq"] for delta in deltas] == list(range(len(deltas)))
    assert {(delta["session_id"], delta["kind"], delta["index"]) for delta in deltas} == {(sid, "text", 0)}
    assert "".join(delta["text"] for delta in deltas) == response_text(response) == TEXT
    # Each delta came after its request event and before the response, on the caller's stream.
    order = [frame.get("method") == "session.delta" or frame["params"]["event_type"]
             for frame in frames if "method" in frame]
    assert order.index(True) > order.index("provider.request") and order.index("provider.response") > len(deltas)
    # The provider was called with its streaming API; the stored response is the body a call
    # without streaming answers, so the log does not change.
    assert mock.requests[-1]["body"]["stream"] is True
    mock.enqueue(Reply.text(TEXT))
    plain = result(send(stack, sid, skey, "Again, without deltas."))
    assert "stream" not in mock.requests[-1]["body"]
    streamed_body, plain_body = response["payload"]["body"], plain["events"][2]["payload"]["body"]
    assert {key: value for key, value in streamed_body.items() if key not in ("id", "created")} == {
        key: value for key, value in plain_body.items() if key not in ("id", "created")}
    assert json.dumps(streamed_body).count(TOKEN) == 0


@pytest.mark.parametrize("wire", WIRES)
def test_tool_input_streams_as_partial_json_and_the_tool_loop_goes_on(stack, mock, wire):
    sid, skey = open_on(stack, wire)
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {"zone": "Europe/Paris"})], text="Let me look. ").streaming())
    frames = send(stack, sid, skey, "What time is it?", stream_deltas=True)
    deltas = frames_deltas(frames)
    tool_input = [delta for delta in deltas if delta["kind"] == "tool_input"]
    assert json.loads("".join(delta["text"] for delta in tool_input)) == {"zone": "Europe/Paris"}
    assert {delta["index"] for delta in tool_input} == {1}  # the text is block 0 on both wires
    assert "".join(delta["text"] for delta in deltas if delta["kind"] == "text") == "Let me look. "
    assert [delta["seq"] for delta in deltas] == list(range(len(deltas)))
    paused = result(frames)
    assert paused["message"]["content"][-1]["input"] == {"zone": "Europe/Paris"}
    # The client answers; the next provider call streams too, under its own request event.
    mock.enqueue(Reply.text("Noon in Paris.").streaming())
    answer = [{"type": "tool_result", "tool_use_id": "tu_1", "content": "12:00"}]
    frames = rpc(stack.client, sid, skey, "session.sendMessage",
                 {"message": {"role": "user", "content": answer}, "stream_deltas": True})
    second = frames_deltas(frames)
    assert "".join(delta["text"] for delta in second) == "Noon in Paris."
    assert second[0]["seq"] == 0 and second[0]["request_event_id"] != deltas[0]["request_event_id"]


@pytest.mark.parametrize("wire", WIRES)
def test_an_mcp_tool_runs_between_two_streamed_calls_of_one_turn(stack, mock, wire):
    sid, skey = open_on(stack, wire, mcp_servers=["local"])
    mock.enqueue(Reply.tool_use([("tu_1", "echo", {"text": "from the tool"})]).streaming(),
                 Reply.text("The tool said so.").streaming())
    frames = send(stack, sid, skey, "Ask the tool.", stream_deltas=True)
    events = result(frames)["events"]
    assert types(events)[1:] == ["provider.request", "provider.response", "tool.call", "mcp.request", "mcp.response",
                                 "tool.result", "provider.request", "provider.response", "server.message.send"]
    first, second = (event["id"] for event in events if event["event_type"] == "provider.request")
    deltas = frames_deltas(frames)
    assert json.loads("".join(d["text"] for d in deltas if d["request_event_id"] == first)) == {"text": "from the tool"}
    assert "".join(d["text"] for d in deltas if d["request_event_id"] == second) == "The tool said so."
    order = [frame["params"].get("event_type") or frame["params"]["request_event_id"]
             for frame in frames if "method" in frame]
    assert order.index(second) > order.index("tool.result")  # in their place among the events


def test_thinking_streams_as_its_own_kind(stack, mock):
    sid, skey = open_on(stack, "anthropic")
    mock.enqueue(Reply.thinking("Noon, surely.", "It is noon.").streaming())
    frames = send(stack, sid, skey, "Time?", stream_deltas=True)
    deltas = frames_deltas(frames)
    thinking = [delta for delta in deltas if delta["kind"] == "thinking"]
    assert "".join(delta["text"] for delta in thinking) == "Noon, surely." and {d["index"] for d in thinking} == {0}
    text = [delta for delta in deltas if delta["kind"] == "text"]
    assert "".join(delta["text"] for delta in text) == "It is noon." and {d["index"] for d in text} == {1}
    assert result(frames)["message"]["content"] == [{"type": "text", "text": "It is noon."}]


@pytest.mark.parametrize("wire", WIRES)
def test_a_subscriber_joining_halfway_catches_up_then_gets_the_rest(stack, mock, wire):
    sid, skey = open_on(stack, wire)
    resume = threading.Event()
    mock.enqueue(Reply.text(TEXT).streaming(pause_at=4, resume=resume))
    first = subscribe(stack, sid, skey, deltas=True)
    with first:
        turn = threading.Thread(target=lambda: send(stack, sid, skey, "Say it."))
        turn.start()
        first.wait_for(lambda items: len(deltas_of(items)) == 4)
        with subscribe(stack, sid, skey, deltas=True) as late, subscribe(stack, sid, skey) as plain:
            caught = late.wait_for(lambda items: len(deltas_of(items)) >= 1)
            catch_up = deltas_of(caught)[0]
            assert catch_up["seq"] == 3 and catch_up["index"] == 0 and catch_up["kind"] == "text"
            assert catch_up["text"] == "The quick brown fox "
            resume.set()
            turn.join(30)
            late.wait_for(lambda items: "server.message.send" in types(events_of(items)))
            plain_items = plain.wait_for(lambda items: "server.message.send" in types(events_of(items)))
        whole = deltas_of(first.items)
        assert [delta["seq"] for delta in whole] == list(range(len(TEXT.split())))
        rest = deltas_of(late.items)[1:]
        assert [delta["seq"] for delta in rest] == list(range(4, len(TEXT.split())))
        assert catch_up["text"] + "".join(delta["text"] for delta in rest) == TEXT
        response = next(e for e in events_of(late.items) if e["event_type"] == "provider.response")
        assert response_text(response) == TEXT
        # A subscriber that did not ask gets no delta.
        assert deltas_of(plain_items) == []


def test_a_fallback_after_a_broken_stream_emits_reset(stack, mock):
    sid, skey = open_on(stack, "anthropic", fallback_providers=["backup"])
    mock.enqueue(Reply.text("Half of it and").streaming(fail_at=2, failure="cut"), Reply.text(TEXT).streaming())
    frames = send(stack, sid, skey, "Say it.", stream_deltas=True)
    events = result(frames)["events"]
    requests = [event["id"] for event in events if event["event_type"] == "provider.request"]
    assert len(requests) == 2
    deltas = frames_deltas(frames)
    first = [delta for delta in deltas if delta["request_event_id"] == requests[0]]
    assert [(delta["seq"], delta["kind"]) for delta in first] == [(0, "text"), (1, "text"), (2, "reset")]
    second = [delta for delta in deltas if delta["request_event_id"] == requests[1]]
    assert [delta["seq"] for delta in second] == list(range(len(second)))
    assert "".join(delta["text"] for delta in second) == TEXT
    failed = next(event for event in events if event["event_type"] == "provider.response")
    assert failed["payload"]["ok"] is False and "stream" in failed["payload"]["error"]


def test_an_error_event_mid_stream_fails_the_attempt_with_the_providers_error(stack, mock):
    sid, skey = open_on(stack, "openai", fallback_providers=["backup"])
    mock.enqueue(Reply.text("Half of it").streaming(fail_at=1, failure="error"), Reply.text("Whole.").streaming())
    frames = send(stack, sid, skey, "Say it.", stream_deltas=True)
    deltas = frames_deltas(frames)
    assert [delta["kind"] for delta in deltas] == ["text", "reset", "text"]
    failed = [e for e in result(frames)["events"] if e["event_type"] == "provider.response"][0]["payload"]
    assert failed["ok"] is False and failed["status"] == 200 and failed["body"]
    assert result(frames)["message"]["content"] == [{"type": "text", "text": "Whole."}]


def test_callers_that_did_not_ask_get_no_deltas_and_nobody_listening_means_no_streaming(stack, mock):
    sid, skey = open_on(stack, "anthropic")
    with subscribe(stack, sid, skey) as plain:
        mock.enqueue(Reply.text(TEXT).streaming())
        frames = send(stack, sid, skey, "Say it.")
        assert frames_deltas(frames) == []
        assert "stream" not in mock.requests[-1]["body"]  # nobody listened: no streaming call
        with subscribe(stack, sid, skey, deltas=True) as listening:
            listening.wait_for(lambda items: True)
            mock.enqueue(Reply.text(TEXT).streaming())
            frames = send(stack, sid, skey, "Again.")
            assert frames_deltas(frames) == []  # the caller did not ask
            assert mock.requests[-1]["body"]["stream"] is True  # a subscriber did
            got = listening.wait_for(lambda items: "server.message.send" in types(events_of(items)))
            assert "".join(delta["text"] for delta in deltas_of(got)) == TEXT
        seen = plain.wait_for(lambda items: types(events_of(items)).count("server.message.send") == 2)
        assert deltas_of(seen) == []


def test_invalid_delta_params_are_refused(stack, mock):
    sid, skey = open_on(stack, "anthropic")
    frames = send(stack, sid, skey, "Hi.", stream_deltas="yes")
    assert frames[-1]["error"]["code"] == -32602


def sse(stack, sid: str, key: str, *, admin: bool = False, **params: str) -> Listener:
    base = str((stack.admin if admin else stack.client).base_url)
    prefix = "/admin/v1" if admin else "/api/v1"
    headers = {"Authorization": f"Bearer {key}"}
    if "last_event_id" in params:
        headers["Last-Event-ID"] = params.pop("last_event_id")
    return Listener(base, "GET", f"{prefix}/sessions/{sid}/events/stream", headers=headers, params=params, sse=True)


def test_server_sent_events_carry_events_with_ids_and_deltas_without(stack, mock):
    sid, skey = open_on(stack, "openai")
    with sse(stack, sid, skey, deltas="true") as stream:
        assert stream.status == 200 and stream.headers["content-type"].startswith("text/event-stream")
        assert stream.headers["cache-control"] == "no-cache"
        mock.enqueue(Reply.text(TEXT).streaming())
        outcome = result(send(stack, sid, skey, "Say it."))
        items = stream.wait_for(lambda items: "server.message.send" in types(events_of(items)))
    records = [item for item in items if "comment" not in item]
    for record in records:
        if record["event"] == "session.event":
            assert record["id"] == record["data"]["id"]
        else:
            assert record["event"] == "session.delta" and record["id"] is None
    assert events_of(records) == outcome["events"]  # its own message too: this stream is not the caller's
    assert "".join(delta["text"] for delta in deltas_of(records)) == TEXT
    # Resuming after the request event replays the rest of the turn, and no delta of it (its
    # response is in the replay).
    request_id = outcome["events"][1]["id"]
    with sse(stack, sid, skey, deltas="true", last_event_id=request_id) as again:
        replayed = again.wait_for(lambda items: "server.message.send" in types(events_of(items)))
    assert types(events_of(replayed)) == ["provider.response", "server.message.send"]
    assert deltas_of(replayed) == []


def test_the_admin_stream_takes_the_admin_token_for_any_session(stack, mock):
    sid, skey = open_on(stack, "anthropic")
    mock.enqueue(Reply.text(TEXT).streaming(), Reply.text(TEXT).streaming())
    with sse(stack, sid, stack.admin_key, admin=True, deltas="true") as watching:
        assert watching.status == 200
        # Watching changes nothing of the session: asking for deltas makes no call stream...
        first = result(send(stack, sid, skey, "Say it."))
        got = watching.wait_for(lambda items: first["events"][-1] in events_of(items))
        assert "stream" not in mock.requests[-1]["body"]
        assert deltas_of(got) == []
        # ...but the deltas of a call that streams for a client reach the watcher too.
        second = result(send(stack, sid, skey, "Again.", stream_deltas=True))
        got = watching.wait_for(lambda items: second["events"][-1] in events_of(items))
        assert mock.requests[-1]["body"]["stream"] is True
    assert "".join(delta["text"] for delta in deltas_of(got)) == TEXT
    # A session key is not the admin token; an unknown session is 404.
    with sse(stack, sid, skey, admin=True) as refused:
        assert refused.status == 401
    with sse(stack, "ses_unknown", stack.admin_key, admin=True) as unknown:
        assert unknown.status == 404
    # The client route refuses the admin token, and bad queries after authentication.
    with sse(stack, sid, stack.admin_key) as wrong:
        assert wrong.status == 401
    with sse(stack, sid, skey, deltas="maybe") as bad:
        assert bad.status == 400
    with sse(stack, sid, "bae_ses_nope", deltas="maybe") as stranger:
        assert stranger.status == 401


def test_a_turn_cancelled_mid_stream_stops_the_providers_stream(stack, mock):
    sid, skey = open_on(stack, "anthropic")
    resume = threading.Event()
    mock.enqueue(Reply.text(TEXT).streaming(pause_at=2, resume=resume))
    with subscribe(stack, sid, skey, deltas=True) as watching:
        outcome: dict = {}
        turn = threading.Thread(target=lambda: outcome.update(frames=send(stack, sid, skey, "Say it.")))
        turn.start()
        watching.wait_for(lambda items: len(deltas_of(items)) == 2)
        assert result(rpc(stack.client, sid, skey, "session.cancelTurn", {})) == {"cancelled": True}
        turn.join(30)
        assert outcome["frames"][-1]["error"]["code"] == -32052
        deadline = threading.Event()
        for _ in range(200):  # the runner closed the provider's stream: the mock saw its client leave
            if mock.aborted:
                break
            deadline.wait(0.02)
        assert mock.aborted and mock.aborted[-1]["body"]["stream"] is True
        resume.set()
        # A subscriber joining now gets no catch-up of the cancelled call: only the next call's deltas.
        with subscribe(stack, sid, skey, deltas=True) as late:
            mock.enqueue(Reply.text("Fine.").streaming())
            events = result(send(stack, sid, skey, "Then just this."))["events"]
            got = late.wait_for(lambda items: "server.message.send" in types(events_of(items)))
        request_id = next(event["id"] for event in events if event["event_type"] == "provider.request")
        assert [(delta["request_event_id"], delta["text"]) for delta in deltas_of(got)] == [(request_id, "Fine.")]
