"""kill -9 the session service while a turn is paused for a client tool, then restart it.

The pause lived only in the dead process's memory. The restarted service finds
the paused assistant turn at the end of the log and holds it again, already
expired: the owner may still answer it, and anyone else reclaims it with
synthetic results, so the next provider call never carries an unanswered
tool_use (which the real Anthropic API refuses).
"""

from __future__ import annotations

import signal
import time

import pytest

from testkit.checks import assert_history_kept, assert_no_container_left, event_log
from testkit.live import declared, register, result, send, session_state, types
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"
# The events of a turn that resumes the two-call pause: its message, one result per call, one provider call.
RESUMED_TURN = ["client.message.send", "tool.result", "tool.result", "provider.request", "provider.response",
                "server.message.send"]


@pytest.fixture
def stack(start_stack, mock):
    mock.reset()
    return start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN, BAE_TURN_TIMEOUT="300")


def paused_session(stack, mock):
    profile = stack.create_profile(f"p{time.monotonic_ns()}", allowed_tools=["lookup"])
    a_key = stack.create_key(profile["id"], name="a")
    opened = stack.open_session(a_key["key"], tools=declared(("lookup",)))
    sid, a = opened["session_id"], opened["session_key"]
    b_key = stack.create_key(profile["id"], name="b")["key"]
    joined = stack.client.post(f"/api/v1/sessions/{sid}/join", json={"tools": []},
                               headers={"Authorization": f"Bearer {b_key}"})
    b = joined.json()["session_key"]
    register(stack, sid, a)
    mock.enqueue(Reply.tool_use([("tu_1", "lookup", {"q": 1}), ("tu_2", "lookup", {"q": 2})]))
    assert result(send(stack, sid, a, "look twice"))["message"]["content"][0]["dispatch"] == "client"
    return sid, a, b, a_key["id"]


def crash_and_restart(stack):
    session = stack.stack.processes["session"]
    session.send_signal(signal.SIGKILL)
    session.wait(10)
    stack.stack.restart("session")


def assert_every_tool_use_answered(messages):
    for index, message in enumerate(messages):
        content = message["content"] if isinstance(message["content"], list) else []
        ids = [b["id"] for b in content if b.get("type") == "tool_use"]
        if ids:
            following = messages[index + 1]["content"]
            answered = [b["tool_use_id"] for b in following if b.get("type") == "tool_result"]
            assert answered[: len(ids)] == ids, (ids, following)


def test_another_driver_reclaims_a_pause_that_outlived_its_process(stack, mock):
    sid, a, b, a_key_id = paused_session(stack, mock)
    before = event_log(stack, sid, a)
    crash_and_restart(stack)
    assert assert_history_kept(stack, sid, b, before) == before  # the crash lost or repeated nothing
    register(stack, sid, b)
    mock.enqueue(Reply.text("moved on"))
    outcome = result(send(stack, sid, b, "carry on"))
    assert outcome["message"]["content"][0]["text"] == "moved on"
    assert types(outcome["events"])[:3] == ["client.message.send", "tool.result", "tool.result"]
    log = assert_history_kept(stack, sid, b, before)
    assert types(log[len(before):]) == [
        "session.driver.register", "session.error", *RESUMED_TURN,
    ]
    errors = [e["payload"] for e in log if e["event_type"] == "session.error"]
    assert errors == [{"reason": "driver_turn_abandoned", "owner_client_key_id": a_key_id}]
    assert_every_tool_use_answered(mock.requests[-1]["body"]["messages"])
    assert session_state(stack, sid) == "open"
    assert_no_container_left(stack)


def test_the_owner_can_still_answer_its_pause_after_the_restart(stack, mock):
    sid, a, b, _ = paused_session(stack, mock)
    before = event_log(stack, sid, a)
    crash_and_restart(stack)  # a stays a driver: its registration is in the log
    mock.enqueue(Reply.text("thanks"))
    results = [{"type": "tool_result", "tool_use_id": tid, "content": f"r{tid}"} for tid in ("tu_1", "tu_2")]
    outcome = result(send(stack, sid, a, results))
    assert outcome["message"]["content"][0]["text"] == "thanks"
    sent = mock.requests[-1]["body"]["messages"]
    assert sent[-1]["content"] == results
    assert_every_tool_use_answered(sent)
    log = assert_history_kept(stack, sid, a, before)
    assert types(log[len(before):]) == RESUMED_TURN
    assert session_state(stack, sid) == "open"
    assert_no_container_left(stack)
