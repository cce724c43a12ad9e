"""The live loop through the whole stack: gateway -> session -> runner -> mock LLM."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import httpx
import pytest

from testkit.live import (
    all_events, at, join, new_session, notifications, register, result, rpc, send, terminal, turn_in_background, types,
)
from testkit.inprocess import launch_inprocess_stack
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.inprocess

TOKEN = "sk-test-secret-token-123456"


@pytest.fixture(scope="module")
def shared(tmp_path_factory, mock):
    """One stack for the module: every test opens sessions of its own."""
    toml = mock_provider_toml(mock.base_url) + mock_provider_toml(mock.base_url, name="backup", kind="openai")
    running = launch_inprocess_stack(tmp_path_factory.mktemp("turns"), toml, MOCK_LLM_TOKEN=TOKEN, BAE_TURN_TIMEOUT="1")
    yield running
    running.close()


@pytest.fixture
def stack(shared, mock):
    mock.reset()
    return shared


def test_text_turn_records_the_exact_sequence_and_streams_all_but_the_echo(stack, mock):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.enqueue(Reply.text("It is noon."))
    frames = send(stack, sid, skey, "What time is it?")
    outcome = result(frames)
    assert outcome["message"] == {"role": "assistant", "content": [{"type": "text", "text": "It is noon."}]}
    assert types(outcome["events"]) == [
        "client.message.send", "provider.request", "provider.response", "server.message.send",
    ]
    # The caller's own client.message.send is not echoed back on its stream.
    assert types(notifications(frames)) == ["provider.request", "provider.response", "server.message.send"]
    assert all(e["client_key_id"] == outcome["events"][0]["client_key_id"] for e in outcome["events"])
    # Durable: the replay holds the same events after open and register.
    page = stack.client.get(f"/api/v1/sessions/{sid}/events", headers={"Authorization": f"Bearer {skey}"}).json()
    assert types(page["items"])[-4:] == types(outcome["events"])
    assert TOKEN not in json.dumps(page)
    assert mock.requests[-1]["headers"]["x-api-key"] == TOKEN


def test_driver_gate_comes_first(stack):
    sid, skey, _ = new_session(stack)
    error = terminal(send(stack, sid, skey, "hi"))["error"]
    assert error == {"code": -32001, "message": "call session.registerDriver before session.sendMessage"}


def test_register_is_idempotent_and_lists_participants(stack):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    register(stack, sid, skey)
    auth = {"Authorization": f"Bearer {skey}"}
    events = stack.client.get(f"/api/v1/sessions/{sid}/events", headers=auth).json()["items"]
    assert types(events).count("session.driver.register") == 1
    drivers = stack.client.get(f"/api/v1/sessions/{sid}/participants", headers=auth).json()["drivers"]
    assert drivers == [events[0]["client_key_id"]]


def test_client_tool_round_trip_and_dispatch_never_reaches_the_provider(stack, mock):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {})]), Reply.text("Noon."))
    first = result(send(stack, sid, skey, "time?"))
    assert first["message"]["content"] == [
        {"type": "tool_use", "id": "tu_1", "name": "get_time", "input": {}, "dispatch": "client"}
    ]
    assert types(first["events"]) == [
        "client.message.send", "provider.request", "provider.response", "tool.call", "server.message.send",
    ]
    frames = send(stack, sid, skey, [{"type": "tool_result", "tool_use_id": "tu_1", "content": "12:00"}])
    second = result(frames)
    assert types(second["events"]) == [
        "client.message.send", "tool.result", "provider.request", "provider.response", "server.message.send",
    ]
    assert "tool.result" not in types(notifications(frames))  # own input is not echoed
    sent = mock.requests[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert "dispatch" not in json.dumps(sent)


def test_orphan_tool_result_is_refused_and_nothing_recorded(stack):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    error = terminal(send(stack, sid, skey, [{"type": "tool_result", "tool_use_id": "x", "content": "?"}]))["error"]
    assert error["code"] == -32000
    assert error["message"].startswith("tool result merge invalid: no paused turn is awaiting tool results")


def test_bad_continuation_moves_the_session_to_error(stack, mock):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {})]))
    result(send(stack, sid, skey, "time?"))
    error = terminal(send(stack, sid, skey, [{"type": "tool_result", "tool_use_id": "tu_9", "content": "?"}]))
    assert error["error"] == {
        "code": -32000,
        "message": 'tool result merge invalid: tool_result id "tu_9" is not in the paused assistant turn',
    }
    error = terminal(send(stack, sid, skey, "hello"))["error"]
    assert error == {"code": -32000, "message": "session is error, not open"}


def test_plain_message_abandons_the_pause_with_synthetic_results(stack, mock):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {})]), Reply.text("ok then"))
    result(send(stack, sid, skey, "time?"))
    outcome = result(send(stack, sid, skey, "never mind"))
    recorded = outcome["events"][0]["payload"]["content"]
    assert recorded[0]["tool_use_id"] == "tu_1" and recorded[0]["is_error"] is True
    assert recorded[1] == {"type": "text", "text": "never mind"}
    assert outcome["message"]["content"][0]["text"] == "ok then"


def test_fallback_and_all_providers_failed(stack, mock):
    sid, skey, _ = new_session(stack, fallback_providers=["backup"])
    register(stack, sid, skey)
    mock.enqueue(Reply.error(500, "boom"), Reply.text("from backup"))
    outcome = result(send(stack, sid, skey, "hi"))
    assert types(outcome["events"]) == [
        "client.message.send", "provider.request", "provider.response", "session.error",
        "provider.request", "provider.response", "server.message.send",
    ]
    assert outcome["events"][3]["payload"]["reason"] == "provider_call_failed"
    mock.enqueue(Reply.error(500, "a"), Reply.error(503, "b"))
    outcome = result(send(stack, sid, skey, "again"))
    assert outcome["message"]["content"][0]["text"] == "The provider is currently unavailable."
    assert outcome["events"][-1]["payload"] == {"reason": "all_providers_failed", "attempts": 2}
    assert terminal(send(stack, sid, skey, "more"))["error"]["message"] == "session is error, not open"


def test_second_driver_waits_in_fifo_order_behind_a_pause(stack, mock):
    sid, skey_a, profile = new_session(stack)
    register(stack, sid, skey_a)
    skey_b = join(stack, sid, profile)
    register(stack, sid, skey_b)
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {})]), Reply.text("A done"), Reply.text("B done"))
    result(send(stack, sid, skey_a, "A asks"))

    b_frames: list = []
    b_thread = threading.Thread(target=lambda: b_frames.extend(send(stack, sid, skey_b, "B asks")))
    b_thread.start()
    time.sleep(0.3)
    assert b_thread.is_alive()  # queued behind A's live pause
    a_outcome = result(send(stack, sid, skey_a, [{"type": "tool_result", "tool_use_id": "tu_1", "content": "x"}]))
    assert a_outcome["message"]["content"][0]["text"] == "A done"
    b_thread.join(10)
    assert result(b_frames)["message"]["content"][0]["text"] == "B done"


def test_expired_pause_is_reclaimed_by_a_queued_driver(stack, mock):
    sid, skey_a, profile = new_session(stack)
    register(stack, sid, skey_a)
    skey_b = join(stack, sid, profile)
    register(stack, sid, skey_b)
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {})]), Reply.text("B served"))
    result(send(stack, sid, skey_a, "A asks"))
    outcome = result(send(stack, sid, skey_b, "B asks"))  # BAE_TURN_TIMEOUT=1: waits, then reclaims
    assert types(outcome["events"])[:2] == ["client.message.send", "tool.result"]
    events = stack.client.get(
        f"/api/v1/sessions/{sid}/events", headers={"Authorization": f"Bearer {skey_b}"}
    ).json()["items"]
    abandoned = [e for e in events if e["event_type"] == "session.error"]
    assert abandoned[0]["payload"]["reason"] == "driver_turn_abandoned"


# Turn lengths that step through a 0.5 s period: a queued caller that only noticed the gate at
# 0.5 s polls would start at least 0.375 s late in one of these rounds, whatever its poll's phase.
PHASES = (0.4, 0.525, 0.65, 0.775)


def queue_behind(stack, mock, sid, first_key, second_key) -> tuple[dict, dict, float]:
    """The first key sends; the second key's sendMessage arrives while the first turn's provider
    call is in flight. Returns both results and when the second call was sent."""
    asked = len(mock.requests)
    first: list = []
    thread = threading.Thread(target=lambda: first.extend(send(stack, sid, first_key, "first")))
    thread.start()
    deadline = time.monotonic() + 10
    while len(mock.requests) == asked:  # the first turn is in its provider call
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sent = time.time()
    second = result(send(stack, sid, second_key, "second"))
    thread.join(10)
    return result(first), second, sent


def test_a_queued_driver_starts_as_soon_as_the_turn_ahead_completes(stack, mock):
    """The gate wakes the caller queued behind a running turn when that turn ends (server times:
    A's last event to B's first), not at a later poll."""
    sid, skey_a, profile = new_session(stack)
    register(stack, sid, skey_a)
    skey_b = join(stack, sid, profile)
    register(stack, sid, skey_b)
    gaps = []
    for seconds in PHASES:
        mock.enqueue(Reply.hang(seconds), Reply.text("B's turn"))
        a_outcome, b_outcome, b_sent = queue_behind(stack, mock, sid, skey_a, skey_b)
        a_done, b_start = a_outcome["events"][-1], b_outcome["events"][0]
        assert (a_done["event_type"], b_start["event_type"]) == ("server.message.send", "client.message.send")
        assert b_sent < at(a_done)  # B was queued while A ran
        gaps.append(round(at(b_start) - at(a_done), 3))
    assert max(gaps) < 0.25, gaps


def test_a_queued_driver_reclaims_a_pause_as_soon_as_it_expires(stack, mock):
    """A running turn that pauses wakes the caller queued behind it, which then waits exactly
    until the pause's deadline (BAE_TURN_TIMEOUT=1) and reclaims it."""
    sid, skey_a, profile = new_session(stack)
    register(stack, sid, skey_a)
    skey_b = join(stack, sid, profile)
    register(stack, sid, skey_b)
    lateness = []
    for round_number, seconds in enumerate(PHASES):
        pausing = replace(Reply.tool_use([(f"tu_{round_number}", "get_time", {})]), seconds=seconds)
        mock.enqueue(pausing, Reply.text("B's turn"))
        a_outcome, b_outcome, b_sent = queue_behind(stack, mock, sid, skey_a, skey_b)
        paused = a_outcome["events"][-1]
        assert paused["payload"]["content"][0]["type"] == "tool_use" and b_sent < at(paused)
        assert b_outcome["message"]["content"][0]["text"] == "B's turn"
        log = stack.client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200},
                               headers={"Authorization": f"Bearer {skey_a}"}).json()["items"]
        abandoned = log[[e["id"] for e in log].index(paused["id"]) + 1]  # B's first event
        assert abandoned["payload"]["reason"] == "driver_turn_abandoned"
        lateness.append(round(at(abandoned) - at(paused) - 1.0, 3))
    assert min(lateness) > -0.05 and max(lateness) < 0.25, lateness


def test_subscriber_replays_then_follows_live_and_unsubscribe_ends_it(stack, mock):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    auth = {"Authorization": f"Bearer {skey}"}
    first_event = stack.client.get(f"/api/v1/sessions/{sid}/events", headers=auth).json()["items"][0]
    lines: list[dict] = []

    def watch():
        body = {"jsonrpc": "2.0", "id": 7, "method": "session.subscribe", "params": {"since_event_id": first_event["id"]}}
        with httpx.Client(base_url=stack.client.base_url, timeout=30) as client:
            with client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=body, headers=auth) as response:
                for line in response.iter_lines():
                    lines.append(json.loads(line))

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(0.3)
    mock.enqueue(Reply.text("hello"))
    result(send(stack, sid, skey, "hi"))
    time.sleep(0.3)
    assert result(rpc(stack.client, sid, skey, "session.unsubscribe")) == {"unsubscribed": True}
    watcher.join(10)
    assert not watcher.is_alive()
    seen = types(notifications(lines))
    assert seen == [
        "session.driver.register", "client.message.send", "provider.request", "provider.response", "server.message.send",
    ]
    assert all("id" not in line for line in lines)  # no terminal frame for a subscription


def test_update_client_tools_scopes_the_next_provider_call(stack, mock):
    sid, skey, _ = new_session(stack, tools=("get_time", "get_date"))
    register(stack, sid, skey)
    reply = rpc(stack.client, sid, skey, "session.updateClientTools", {"tools": [{"name": "get_date"}]})
    assert result(reply) == {"updated": True}
    refused = terminal(rpc(stack.client, sid, skey, "session.updateClientTools", {"tools": [{"name": "rm"}]}))
    assert refused["error"] == {"code": -32015, "message": 'tool_not_allowed: tool "rm" is not in the profile\'s allowlist'}
    mock.enqueue(Reply.text("ok"))
    result(send(stack, sid, skey, "hi"))
    assert [t["name"] for t in mock.requests[-1]["body"]["tools"]] == ["get_date"]


def test_missing_env_var_fails_the_attempt_without_leaking(start_inprocess_stack, mock):
    mock.reset()
    stack = start_inprocess_stack(config_toml=mock_provider_toml(mock.base_url, token_var="NOT_SET_ANYWHERE"))
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    outcome = result(send(stack, sid, skey, "hi"))
    response = [e for e in outcome["events"] if e["event_type"] == "provider.response"][0]["payload"]
    assert response["ok"] is False and response["status"] is None
    assert "NOT_SET_ANYWHERE" in response["error"]
    assert mock.requests == []


# -- session.cancelTurn ----------------------------------------------------------------------


def cancel_turn(stack, sid: str, skey: str) -> dict:
    """The terminal frame of one session.cancelTurn."""
    return terminal(rpc(stack.client, sid, skey, "session.cancelTurn", {}))


def wait_until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def key_of(stack, sid: str, skey: str, event_type: str) -> str:
    """The client key id that recorded the session's first `event_type` event."""
    return next(e["client_key_id"] for e in all_events(stack, sid, skey) if e["event_type"] == event_type)


def test_cancel_during_a_provider_call_aborts_it_and_the_session_goes_on(stack, mock):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    since = all_events(stack, sid, skey)[0]["id"]
    watched: list[dict] = []
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe", "params": {"since_event_id": since}}

    def watch() -> None:  # an observer: replay, then live, so it misses nothing whenever it attaches
        with httpx.Client(base_url=stack.client.base_url, timeout=30) as client:
            headers = {"Authorization": f"Bearer {skey}"}
            with client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=body, headers=headers) as response:
                watched.extend(json.loads(line) for line in response.iter_lines())

    observer = threading.Thread(target=watch)
    observer.start()
    release = threading.Event()
    mock.enqueue(Reply.held(release))
    try:
        thread, outcome = turn_in_background(stack, sid, skey, "take your time")
        wait_until(lambda: len(mock.requests) == 1, "the provider call never started")
        # The runner holds a call's request event a few milliseconds, to write it with a fast answer.
        wait_until(lambda: types(all_events(stack, sid, skey))[-1] == "provider.request", "no provider.request")
        assert cancel_turn(stack, sid, skey)["result"] == {"cancelled": True}
        thread.join(10)
        # The runner closed the provider connection: the held request is aborted, never answered.
        wait_until(lambda: mock.aborted == mock.requests, "the provider request was not aborted")
    finally:
        release.set()
    assert terminal(outcome["frames"])["error"] == {"code": -32052, "message": "turn cancelled"}
    assert types(notifications(outcome["frames"])) == ["provider.request", "session.turn.cancelled"]
    events = all_events(stack, sid, skey)
    assert types(events)[-3:] == ["client.message.send", "provider.request", "session.turn.cancelled"]
    me = key_of(stack, sid, skey, "session.open")
    assert events[-1]["payload"] == {"cancelled_by": me, "tool_use_ids": []}
    assert len(mock.requests) == 1  # nothing was sent again

    mock.enqueue(Reply.text("starting over"))
    follow = result(send(stack, sid, skey, "start over"))
    assert follow["message"]["content"] == [{"type": "text", "text": "starting over"}]
    sent = mock.requests[-1]["body"]["messages"]  # the two user messages, folded into one for Anthropic
    assert [m["role"] for m in sent] == ["user"]
    assert [block["text"] for block in sent[0]["content"]] == ["take your time", "start over"]
    assert result(rpc(stack.client, sid, skey, "session.unsubscribe")) == {"unsubscribed": True}
    observer.join(10)
    assert "session.turn.cancelled" in types(notifications(watched))


def test_cancel_while_paused_answers_the_calls_and_the_history_stays_valid(stack, mock):
    sid, skey, profile = new_session(stack)
    register(stack, sid, skey)
    other = join(stack, sid, profile)
    register(stack, sid, other)  # any registered driver may cancel the turn, whoever's it is
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {}), ("tu_2", "get_time", {"zone": "utc"})]))
    paused = result(send(stack, sid, skey, "time?"))
    assert cancel_turn(stack, sid, other)["result"] == {"cancelled": True}

    events = all_events(stack, sid, skey)
    owner, canceller = key_of(stack, sid, skey, "session.open"), key_of(stack, sid, skey, "session.join")
    text = "Tool call was cancelled before returning a result."
    synthetic = [{"type": "tool_result", "tool_use_id": i, "content": text, "is_error": True} for i in ("tu_1", "tu_2")]
    assert [(e["event_type"], e["payload"]) for e in events[-4:]] == [
        ("server.message.send", {"role": "user", "content": synthetic, "synthetic": "cancelled_tool_results"}),
        *[("tool.result", {"tool_use_id": i, "dispatch": "client", "server_name": None, "is_error": True, "content": text})
          for i in ("tu_1", "tu_2")],
        ("session.turn.cancelled", {"cancelled_by": canceller, "tool_use_ids": ["tu_1", "tu_2"]}),
    ]
    assert {e["client_key_id"] for e in events[-4:]} == {owner}  # the turn's events, as the pause's were
    assert events[-5]["id"] == paused["events"][-1]["id"]

    # Its owner's late results find no paused turn; the session is open and its history valid.
    late = terminal(send(stack, sid, skey, [{"type": "tool_result", "tool_use_id": "tu_1", "content": "12:00"}]))
    assert late["error"]["message"].startswith("tool result merge invalid: no paused turn is awaiting tool results")
    mock.enqueue(Reply.text("fine"))
    assert result(send(stack, sid, skey, "never mind"))["message"]["content"][0]["text"] == "fine"
    sent = mock.requests[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert [b["tool_use_id"] for b in sent[2]["content"] if b["type"] == "tool_result"] == ["tu_1", "tu_2"]
    assert sent[2]["content"][-1] == {"type": "text", "text": "never mind"}
    assert cancel_turn(stack, sid, skey)["result"] == {"cancelled": False}


def test_cancel_with_no_turn_and_who_may_cancel(stack, mock):
    sid, skey, profile = new_session(stack)
    observer = join(stack, sid, profile)
    refused = {"code": -32001, "message": "call session.registerDriver before session.cancelTurn"}
    assert cancel_turn(stack, sid, skey)["error"] == refused  # not registered yet
    register(stack, sid, skey)
    before = all_events(stack, sid, skey)
    assert cancel_turn(stack, sid, skey)["result"] == {"cancelled": False}
    assert cancel_turn(stack, sid, observer)["error"] == refused  # an observer never may
    mock.enqueue(Reply.text("done"))
    result(send(stack, sid, skey, "hi"))
    assert cancel_turn(stack, sid, skey)["result"] == {"cancelled": False}  # that turn has ended
    after = all_events(stack, sid, skey)
    assert len(after) == len(before) + 4 and "session.turn.cancelled" not in types(after)


def test_a_cancel_racing_the_turns_end_has_one_outcome(stack, mock):
    """Each cancel is sent once the provider has the request, which it answers at once: a round ends
    either as a normal turn and cancelled:false, or as a cancelled turn; never as both."""
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    cancels = 0
    for round_number in range(6):
        mock.enqueue(Reply.text(f"answer {round_number}"))
        thread, outcome = turn_in_background(stack, sid, skey, f"question {round_number}")
        wait_until(lambda asked=round_number + 1: len(mock.requests) == asked, "the provider call never started")
        cancelled = cancel_turn(stack, sid, skey)["result"]["cancelled"]
        thread.join(10)
        last, recorded = terminal(outcome["frames"]), types(all_events(stack, sid, skey))
        if cancelled:
            cancels += 1
            assert last["error"] == {"code": -32052, "message": "turn cancelled"}
            assert recorded[-1] == "session.turn.cancelled"
        else:
            assert last["result"]["message"]["content"][0]["text"] == f"answer {round_number}"
            assert recorded[-1] == "server.message.send"
        assert recorded.count("session.turn.cancelled") == cancels
