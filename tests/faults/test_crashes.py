"""A service killed with SIGKILL in the middle of a turn, then started again.

The session service's state is the event log; a crash may cut a turn short,
but never loses or repeats a committed event, and the session serves its
next turn. A runner that dies mid-step is a failed provider attempt.
"""

from __future__ import annotations

import signal

import pytest

from testkit.checks import assert_history_kept, assert_no_container_left, count, event_log, wait_for_log, wait_until
from testkit.live import new_session, register, result, send, session_state, turn_in_background, types
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"


def crash_stack(start_stack, mock):
    mock.reset()
    return start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN)


def test_session_service_killed_mid_turn(start_stack, mock):
    stack = crash_stack(start_stack, mock)
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.enqueue(Reply.text("first"))
    assert result(send(stack, sid, skey, "one"))["message"]["content"][0]["text"] == "first"
    mock.enqueue(Reply.hang(3))
    thread, outcome = turn_in_background(stack, sid, skey, "two")
    before = wait_for_log(stack, sid, skey, lambda events: count(events, "provider.request") == 2)
    wait_until(lambda: len(mock.requests) == 2)  # the turn is waiting on the provider
    assert types(before)[-2:] == ["client.message.send", "provider.request"]

    stack.stack.restart("session", sig=signal.SIGKILL)
    thread.join(30)
    # The caller's stream ended with an error instead of a result; nothing was invented for it.
    assert "result" not in (outcome.get("frames") or [{}])[-1]

    events = assert_history_kept(stack, sid, skey, before)
    assert events == before  # the cut turn wrote nothing after the crash
    assert session_state(stack, sid) == "open"
    # The driver's registration is in the log: it sends again without registering.
    mock.enqueue(Reply.text("after the crash"))
    after = result(send(stack, sid, skey, "three"))
    assert after["message"]["content"][0]["text"] == "after the crash"
    events = assert_history_kept(stack, sid, skey, before)
    assert types(events[len(before):]) == [
        "client.message.send", "provider.request", "provider.response", "server.message.send",
    ]
    assert_no_container_left(stack)


def test_runner_killed_mid_step(start_stack, mock):
    stack = crash_stack(start_stack, mock)
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.enqueue(Reply.hang(3))
    thread, outcome = turn_in_background(stack, sid, skey, "one")
    before = wait_for_log(stack, sid, skey, lambda events: count(events, "provider.request") == 1)
    wait_until(lambda: len(mock.requests) == 1)  # the step is waiting on the provider

    stack.stack.restart("runner", sig=signal.SIGKILL)
    thread.join(30)
    # The step's stream broke: the caller gets the spec's loop failure, and the turn ends there.
    assert outcome["frames"][-1]["error"] == {"code": -32000, "message": "session loop failed"}
    events = assert_history_kept(stack, sid, skey, before)
    assert types(events[len(before) - 2:]) == ["client.message.send", "provider.request"]
    assert session_state(stack, sid) == "open"

    # The restarted runner serves the next turn, which sees the whole conversation.
    mock.enqueue(Reply.text("runner is back"))
    after = result(send(stack, sid, skey, "two"))
    assert after["message"]["content"][0]["text"] == "runner is back"
    # The unanswered message and the new one reach the provider as one user turn.
    assert mock.requests[-1]["body"]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}
    ]
    events = assert_history_kept(stack, sid, skey, before)
    assert types(events[len(before):]) == [
        "client.message.send", "provider.request", "provider.response", "server.message.send",
    ]
    assert_no_container_left(stack)


def test_runner_killed_between_turns_is_sent_the_whole_history_again(start_stack, mock):
    """The runner keeps each session's history between steps and a step sends only what is new;
    a restarted runner holds nothing, so the next step sends everything again."""
    stack = crash_stack(start_stack, mock)
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    said = []
    for word in ("one", "two", "three"):
        mock.enqueue(Reply.text(f"answer to {word}"))
        assert result(send(stack, sid, skey, word))["message"]["content"][0]["text"] == f"answer to {word}"
        said += [{"role": "user", "content": word}, {"role": "assistant", "content": [{"type": "text", "text": f"answer to {word}"}]}]
    stack.stack.restart("runner", sig=signal.SIGKILL)

    mock.enqueue(Reply.text("answer to four"))
    assert result(send(stack, sid, skey, "four"))["message"]["content"][0]["text"] == "answer to four"
    assert mock.requests[-1]["body"]["messages"] == [*said, {"role": "user", "content": "four"}]
    # Every turn's provider.request records the whole history its provider call carried.
    events = event_log(stack, sid, skey)
    recorded = [event["payload"]["messages"] for event in events if event["event_type"] == "provider.request"]
    assert recorded == [request["body"]["messages"] for request in mock.requests]
    assert len(recorded) == 4


def test_session_service_killed_before_its_wal_is_checkpointed(start_stack, mock):
    """Committed turns still only in the WAL (the store checkpoints 0.2 s after writes, on a thread
    of its own) survive a SIGKILL: after the restart every event is there, once."""
    stack = crash_stack(start_stack, mock)
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    for n in range(5):
        mock.enqueue(Reply.text(f"reply {n}"))
        assert result(send(stack, sid, skey, f"turn {n}"))["message"]["content"][0]["text"] == f"reply {n}"
    before = event_log(stack, sid, skey)

    stack.stack.restart("session", sig=signal.SIGKILL)  # at once: the last turns' checkpoint is still due

    assert event_log(stack, sid, skey) == before
    assert len({event["id"] for event in before}) == len(before)
    assert types(before).count("server.message.send") == 5
    register(stack, sid, skey)
    mock.enqueue(Reply.text("after the crash"))
    assert result(send(stack, sid, skey, "again"))["message"]["content"][0]["text"] == "after the crash"
