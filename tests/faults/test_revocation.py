"""Revoking a client key ends its live access at once (the session stays open for
the keys that still hold it): its streams end, it stops being a driver, and a turn
it left paused is reclaimable immediately.

A revoked key's stream ends without a terminal frame (docs/engine.md). A turn
already running runs on to its end, as when its caller goes away, so the log
never holds half a turn; a call still queued for the gate records nothing.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from testkit.checks import (
    assert_each_event_once, assert_history_kept, assert_no_container_left, event_log, wait_for_log, wait_until,
)
from testkit.live import declared, notifications, register, result, send, session_state, turn_in_background, types
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"
TURN = ["client.message.send", "provider.request", "provider.response", "server.message.send"]


@pytest.fixture
def stack(start_stack, mock):
    mock.reset()
    # A long turn timeout: only the revocation can make the pause reclaimable in time.
    return start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN, BAE_TURN_TIMEOUT="300")


def two_drivers(stack):
    profile = stack.create_profile(f"p{time.monotonic_ns()}", allowed_tools=["lookup"])
    a_key = stack.create_key(profile["id"], name="a")["key"]
    opened = stack.open_session(a_key, tools=declared(("lookup",)))
    sid, a = opened["session_id"], opened["session_key"]
    b_client = stack.create_key(profile["id"], name="b")
    joined = stack.client.post(f"/api/v1/sessions/{sid}/join", json={"tools": declared(("lookup",))},
                               headers={"Authorization": f"Bearer {b_client['key']}"})
    assert joined.status_code == 201, joined.text
    b = joined.json()["session_key"]
    register(stack, sid, a)
    register(stack, sid, b)
    return sid, a, b, b_client["id"]


class Stream:
    """One NDJSON call read in the background: its lines as they arrive, when its headers came, when it ended."""

    def __init__(self, stack, sid: str, skey: str, method: str, params: dict | None = None) -> None:
        self.lines: list[dict] = []
        self.status: int | None = None
        self.opened = threading.Event()
        self.done = threading.Event()
        body = {"jsonrpc": "2.0", "id": 1, "method": method, **({"params": params} if params else {})}
        self._args = (stack, sid, skey, body)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        stack, sid, skey, body = self._args
        try:
            with stack.client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=body,
                                     headers={"Authorization": f"Bearer {skey}"}, timeout=60) as response:
                self.status = response.status_code
                self.opened.set()
                for line in response.iter_lines():
                    if line:
                        self.lines.append(json.loads(line))
        finally:
            self.opened.set()
            self.done.set()

    @property
    def terminal_frames(self) -> list[dict]:
        return [line for line in self.lines if "id" in line]


def message(text: str) -> dict:
    return {"message": {"role": "user", "content": text}}


@contextmanager
def provider_call_held(mock, reply: Reply) -> Iterator[threading.Event]:
    """The next provider call waits until the block ends (or the test sets the event)."""
    release = threading.Event()
    mock.enqueue(Reply.held(release, reply))
    try:
        yield release
    finally:
        release.set()


def revoke(stack, key_id: str) -> None:
    assert stack.admin.delete(f"/admin/v1/keys/{key_id}").status_code == 204


def drivers(stack, sid: str, skey: str) -> list[str]:
    participants = stack.client.get(f"/api/v1/sessions/{sid}/participants", headers={"Authorization": f"Bearer {skey}"})
    assert participants.status_code == 200, participants.text
    return participants.json()["drivers"]


def test_revocation_ends_the_keys_subscription_and_driver_role(stack, mock):
    sid, a, b, b_key_id = two_drivers(stack)
    before = event_log(stack, sid, a)
    subscription = Stream(stack, sid, b, "session.subscribe")
    assert subscription.opened.wait(10) and subscription.status == 200
    mock.enqueue(Reply.text("first"))
    result(send(stack, sid, a, "before"))
    wait_until(lambda: "server.message.send" in types(notifications(subscription.lines)), timeout=5)

    revoke(stack, b_key_id)
    assert subscription.done.wait(5), "the revoked key's subscription is still open"
    seen = len(subscription.lines)
    mock.enqueue(Reply.text("second"))
    result(send(stack, sid, a, "after"))
    assert len(subscription.lines) == seen  # nothing more reached the revoked key
    assert session_state(stack, sid) == "open"
    assert b_key_id not in drivers(stack, sid, a)
    events = assert_history_kept(stack, sid, a, before)
    assert types(events[len(before):]) == TURN + TURN
    # What the subscription got was the log's first turn, each event once.
    assert [event["id"] for event in notifications(subscription.lines)] == [event["id"] for event in events[len(before):][:seen]]
    assert_no_container_left(stack)


def test_revocation_ends_a_running_turns_stream_and_the_turn_still_ends_whole(stack, mock):
    sid, a, b, b_key_id = two_drivers(stack)
    before = event_log(stack, sid, a)
    with provider_call_held(mock, Reply.text("answered late")):
        turn = Stream(stack, sid, b, "session.sendMessage", message("b asks"))
        wait_until(lambda: "provider.request" in types(notifications(turn.lines)))  # the provider call is in flight
        revoke(stack, b_key_id)
        assert turn.done.wait(5), "the revoked key's sendMessage stream is still open"
    # The stream ended between two events, with no terminal frame: the revoked key learns no outcome.
    assert turn.status == 200 and turn.terminal_frames == []
    assert "server.message.send" not in types(notifications(turn.lines))

    # The turn itself ran on once the provider answered: whole, in order, each event once.
    events = wait_for_log(stack, sid, a, lambda log: "server.message.send" in types(log[len(before):]))
    events = assert_history_kept(stack, sid, a, before)
    after = events[len(before):]
    assert types(after) == TURN
    assert after[-1]["payload"]["content"] == [{"type": "text", "text": "answered late"}]
    assert {event["client_key_id"] for event in after} == {b_key_id}
    # What reached the revoked key is a prefix of that turn (minus its own input's echo).
    seen = [event["id"] for event in notifications(turn.lines)]
    assert seen == [event["id"] for event in after[1:1 + len(seen)]]

    assert session_state(stack, sid) == "open"
    assert b_key_id not in drivers(stack, sid, a)
    mock.enqueue(Reply.text("next"))
    assert result(send(stack, sid, a, "a asks"))["message"]["content"] == [{"type": "text", "text": "next"}]
    assert mock.requests[-1]["body"]["messages"] == [
        {"role": "user", "content": "b asks"},
        {"role": "assistant", "content": [{"type": "text", "text": "answered late"}]},
        {"role": "user", "content": "a asks"},
    ]
    assert types(assert_history_kept(stack, sid, a, events)[len(events):]) == TURN
    assert_no_container_left(stack)


def test_a_revoked_keys_pause_is_reclaimed_at_once(stack, mock):
    sid, a, b, b_key_id = two_drivers(stack)
    before = event_log(stack, sid, a)
    mock.enqueue(Reply.tool_use([("tu_1", "lookup", {})]))
    assert result(send(stack, sid, b, "look"))["message"]["content"][0]["dispatch"] == "client"
    revoke(stack, b_key_id)

    mock.enqueue(Reply.text("carried on"))
    started = time.monotonic()
    outcome = result(send(stack, sid, a, "go on"))
    assert time.monotonic() - started < 10  # not the 300 s turn timeout
    assert outcome["message"]["content"][0]["text"] == "carried on"
    events = assert_history_kept(stack, sid, a, before)
    assert types(events[len(before):]) == [
        "client.message.send", "provider.request", "provider.response", "tool.call", "server.message.send",
        "session.error", "client.message.send", "tool.result", *TURN[1:],
    ]
    abandoned = [e for e in events if e["event_type"] == "session.error"]
    assert [e["payload"] for e in abandoned] == [{"reason": "driver_turn_abandoned", "owner_client_key_id": b_key_id}]
    # Every tool_use was answered before the next provider call.
    sent = mock.requests[-1]["body"]["messages"]
    assert sent[-1]["content"][0] == {"type": "tool_result", "tool_use_id": "tu_1",
                                      "content": "Client tool call was abandoned before returning a result.",
                                      "is_error": True}
    assert session_state(stack, sid) == "open"
    assert_no_container_left(stack)


def test_a_turn_running_when_its_key_is_revoked_pauses_already_reclaimable(stack, mock):
    sid, a, b, b_key_id = two_drivers(stack)
    with provider_call_held(mock, Reply.tool_use([("tu_1", "lookup", {})])):
        turn = Stream(stack, sid, b, "session.sendMessage", message("look"))
        wait_until(lambda: "provider.request" in types(notifications(turn.lines)))
        revoke(stack, b_key_id)
        assert turn.done.wait(5), "the revoked key's sendMessage stream is still open"
    # The turn runs on and pauses for the revoked key's client tool; nobody can answer that pause.
    wait_for_log(stack, sid, a, lambda log: "server.message.send" in types(log))

    mock.enqueue(Reply.text("carried on"))
    started = time.monotonic()
    outcome = result(send(stack, sid, a, "go on"))
    assert time.monotonic() - started < 10  # not the 300 s turn timeout
    assert outcome["message"]["content"] == [{"type": "text", "text": "carried on"}]
    events = event_log(stack, sid, a)
    assert_each_event_once(events)
    assert [e["payload"] for e in events if e["event_type"] == "session.error"] == [
        {"reason": "driver_turn_abandoned", "owner_client_key_id": b_key_id}
    ]
    assert mock.requests[-1]["body"]["messages"][-1]["content"][0] == {
        "type": "tool_result", "tool_use_id": "tu_1",
        "content": "Client tool call was abandoned before returning a result.", "is_error": True,
    }
    assert session_state(stack, sid) == "open"
    assert_no_container_left(stack)


def test_a_revoked_keys_queued_send_message_ends_at_once_and_records_nothing(stack, mock):
    sid, a, b, b_key_id = two_drivers(stack)
    before = event_log(stack, sid, a)
    with provider_call_held(mock, Reply.text("for a")):
        a_thread, a_outcome = turn_in_background(stack, sid, a, "a asks")
        wait_until(lambda: len(mock.requests) == 1)  # a holds the gate, its provider call in flight
        queued = Stream(stack, sid, b, "session.sendMessage", message("b asks"))
        # Headers come once the session service accepted the call; then it queues, silent.
        assert queued.opened.wait(10) and queued.status == 200
        revoke(stack, b_key_id)
        # Ended while a's turn still holds the gate, not when the gate frees.
        assert queued.done.wait(5), "the revoked key's queued sendMessage is still waiting"
    assert queued.lines == []  # a queued caller writes nothing, and nothing was run for it
    a_thread.join(30)
    assert result(a_outcome["frames"])["message"]["content"] == [{"type": "text", "text": "for a"}]

    mock.enqueue(Reply.text("again"))
    result(send(stack, sid, a, "a again"))
    events = assert_history_kept(stack, sid, a, before)
    assert types(events[len(before):]) == TURN + TURN
    assert [e["payload"]["content"] for e in events if e["event_type"] == "client.message.send"] == ["a asks", "a again"]
    assert len(mock.requests) == 2 and "b asks" not in json.dumps(mock.requests[-1]["body"])
    assert session_state(stack, sid) == "open"
    assert b_key_id not in drivers(stack, sid, a)
    assert_no_container_left(stack)


def test_a_revoked_keys_queued_compaction_ends_at_once_and_runs_nothing(stack, mock):
    sid, a, b, b_key_id = two_drivers(stack)
    before = event_log(stack, sid, a)
    with provider_call_held(mock, Reply.text("for a")):
        a_thread, a_outcome = turn_in_background(stack, sid, a, "a asks")
        wait_until(lambda: len(mock.requests) == 1)
        queued = Stream(stack, sid, b, "session.compact")  # waits for the running turn
        assert queued.opened.wait(10) and queued.status == 200
        revoke(stack, b_key_id)
        assert queued.done.wait(5), "the revoked key's queued compaction is still waiting"
    assert queued.lines == []
    a_thread.join(30)
    assert result(a_outcome["frames"])["message"]["content"] == [{"type": "text", "text": "for a"}]
    events = assert_history_kept(stack, sid, a, before)
    assert types(events[len(before):]) == TURN  # no compaction ran after the turn
    assert len(mock.requests) == 1
    assert session_state(stack, sid) == "open"
    assert_no_container_left(stack)


def test_the_revoked_key_can_no_longer_call(stack, mock):
    sid, a, b, b_key_id = two_drivers(stack)
    before = event_log(stack, sid, a)
    revoke(stack, b_key_id)
    response = stack.client.post(f"/api/v1/sessions/{sid}/rpc", headers={"Authorization": f"Bearer {b}"},
                                 json={"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"})
    assert response.status_code == 401
    assert assert_history_kept(stack, sid, a, before) == before  # revocation of a joiner writes no event
    assert session_state(stack, sid) == "open"
    assert_no_container_left(stack)
