"""SIGTERM to the session service, or the runner, with a turn in flight (shutdown phases, SERVER-SPEC §1.2).

The service stops accepting, lets the running turn finish within
BAE_SHUTDOWN_TIMEOUT, then tears down: every event of the turn is there
exactly once, the session stays open, and it serves the next turn after a
restart. A turn that outlives the budget is cancelled between events. The
runner finishes the step it is running, then ends the session service's
step stream without waiting out its budget.
"""

from __future__ import annotations

import time

import pytest

from testkit.checks import assert_history_kept, assert_no_container_left, event_log
from testkit.live import new_session, register, result, send, session_state, turn_in_background, types
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"


def wait_for_event(stack, sid, skey, event_type, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = stack.client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200},
                                headers={"Authorization": f"Bearer {skey}"})
        if page.status_code == 200 and event_type in types(page.json()["items"]):
            return
        time.sleep(0.05)
    raise AssertionError(f"{event_type} was not recorded within {timeout}s")


def turn_in_flight(start_stack, mock, *, shutdown_timeout: str, hang: float):
    """A stack, and a turn whose provider call hangs `hang` seconds, already recorded up to provider.request
    (the log as it was then comes last)."""
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                        BAE_SHUTDOWN_TIMEOUT=shutdown_timeout)
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.enqueue(Reply.hang(hang))
    thread, outcome = turn_in_background(stack, sid, skey, "slow one")
    wait_for_event(stack, sid, skey, "provider.request")
    return stack, sid, skey, thread, outcome, event_log(stack, sid, skey)


def turn_events(events):
    return [e for e in events if e["event_type"] not in ("session.open", "session.driver.register")]


def next_turn_text(stack, mock, sid, skey, reply: str) -> str:
    """The text of a next turn after the restart; its events follow the log as it was, each once."""
    before = event_log(stack, sid, skey)
    # The driver's registration is in the log: it sends again without registering.
    mock.enqueue(Reply.text(reply))
    text = result(send(stack, sid, skey, "next"))["message"]["content"][0]["text"]
    events = assert_history_kept(stack, sid, skey, before)
    assert types(events[len(before):]) == [
        "client.message.send", "provider.request", "provider.response", "server.message.send",
    ]
    return text


def test_sigterm_lets_the_running_turn_finish_and_loses_nothing(start_stack, mock):
    stack, sid, skey, thread, outcome, before = turn_in_flight(start_stack, mock, shutdown_timeout="10", hang=1.5)

    stack.stack.restart("session")  # SIGTERM; returns once the new process serves
    thread.join(30)

    events = assert_history_kept(stack, sid, skey, before)  # each event once, what was there kept
    turn = turn_events(events)
    assert types(turn) == ["client.message.send", "provider.request", "provider.response", "server.message.send"]
    assert turn[-1]["payload"]["content"] == [{"type": "text", "text": "ok"}]
    # The caller that was streaming got its terminal result: the gRPC stream drained too.
    assert "frames" in outcome and result(outcome["frames"])["message"]["content"][0]["text"] == "ok"
    assert session_state(stack, sid) == "open"

    assert next_turn_text(stack, mock, sid, skey, "after restart") == "after restart"
    assert_no_container_left(stack)


def test_a_turn_past_the_shutdown_budget_is_cut_between_events(start_stack, mock):
    stack, sid, skey, thread, _, before = turn_in_flight(start_stack, mock, shutdown_timeout="2", hang=20)
    started = time.monotonic()
    stack.stack.restart("session")
    assert time.monotonic() - started < 10  # the budget bounds the stop
    thread.join(30)

    # Whole events only, each once: the provider call never answered, so none is invented.
    events = assert_history_kept(stack, sid, skey, before)
    assert events == before
    assert types(turn_events(events)) == ["client.message.send", "provider.request"]
    assert session_state(stack, sid) == "open"
    assert next_turn_text(stack, mock, sid, skey, "recovered") == "recovered"
    assert_no_container_left(stack)


def test_sigterm_to_the_runner_lets_its_running_step_finish(start_stack, mock):
    stack, sid, skey, thread, outcome, before = turn_in_flight(start_stack, mock, shutdown_timeout="20", hang=1.5)

    started = time.monotonic()
    stack.stack.restart("runner")  # SIGTERM; returns once the new process serves
    # Held open, the step stream would have kept the old runner up for its whole budget (20 s).
    assert time.monotonic() - started < 12
    thread.join(30)

    events = assert_history_kept(stack, sid, skey, before)
    assert types(turn_events(events)) == ["client.message.send", "provider.request", "provider.response",
                                          "server.message.send"]
    assert "frames" in outcome and result(outcome["frames"])["message"]["content"][0]["text"] == "ok"
    assert session_state(stack, sid) == "open"

    # The next step goes to the new runner on a stream of its own.
    mock.enqueue(Reply.text("new runner"))
    assert result(send(stack, sid, skey, "next"))["message"]["content"][0]["text"] == "new runner"
