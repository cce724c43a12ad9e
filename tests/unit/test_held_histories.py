"""What a step sends of its history, given what the runner holds of the stream's histories."""

from __future__ import annotations

import pytest

from bae.common.protos import runner_pb2
from bae.services.session.remote import runner
from bae.services.session.engine.ports import StepFailed, StepMessages
from bae.services.session.remote.runner import HELD_MESSAGE_OVERHEAD, HeldHistories

pytestmark = pytest.mark.unit

TEXTS = [f'{{"role":"user","content":"message {i}"}}' for i in range(6)]


def step(held: HeldHistories, session_id: str, texts: list[str]) -> runner_pb2.StepRequest:
    request = runner_pb2.StepRequest(session_id=session_id)
    held.step(request, StepMessages(texts, ["user"] * len(texts)))
    return request


def sent(request: runner_pb2.StepRequest) -> tuple[int, list[str], list[str]]:
    return request.kept_messages, list(request.messages), list(request.forget_sessions)


def holding(budget: int | None = None) -> HeldHistories:
    """Histories of a stream whose runner said it holds them."""
    held = HeldHistories() if budget is None else HeldHistories(budget=budget)
    held.runner_holds = True
    return held


def test_a_step_sends_the_messages_after_the_part_held():
    held = holding()
    assert sent(step(held, "a", TEXTS[:3])) == (0, TEXTS[:3], [])
    assert sent(step(held, "a", TEXTS[:5])) == (3, TEXTS[3:5], [])
    # Equal texts count as the same message, whatever object holds them.
    assert sent(step(held, "a", [text.encode().decode() for text in TEXTS[:6]])) == (5, TEXTS[5:6], [])
    # The last message replaced (a compaction's instruction), then a shorter history.
    assert sent(step(held, "a", [*TEXTS[:5], "instructed"])) == (5, ["instructed"], [])
    assert sent(step(held, "a", TEXTS[:2])) == (2, [], [])
    assert sent(step(held, "a", TEXTS[1:4])) == (0, TEXTS[1:4], [])
    # Another session's history is its own.
    assert sent(step(held, "b", TEXTS[1:4])) == (0, TEXTS[1:4], [])
    assert list(step(held, "a", TEXTS[1:4]).roles) == []


def test_the_sessions_stepped_least_recently_are_dropped_beyond_the_budget_and_named_next():
    one = len(TEXTS[0]) + HELD_MESSAGE_OVERHEAD
    held = holding(budget=3 * one)
    step(held, "a", TEXTS[:1])
    step(held, "b", TEXTS[:1])
    step(held, "a", TEXTS[:1])  # a is now the most recent
    assert sent(step(held, "c", TEXTS[:2])) == (0, TEXTS[:2], [])  # b dropped, named next
    assert sent(step(held, "a", TEXTS[:2])) == (1, TEXTS[1:2], ["b"])  # c dropped, named next
    assert sent(step(held, "b", TEXTS[:1])) == (0, TEXTS[:1], ["c"])
    # One history over the budget alone is still held: it is the one being stepped.
    assert sent(step(held, "d", TEXTS)) == (0, TEXTS, [])
    assert sent(step(held, "d", TEXTS)) == (6, [], ["a", "b"])


def test_a_dropped_session_is_sent_whole_and_named_for_the_runner_to_drop():
    held = holding()
    step(held, "a", TEXTS[:3])
    step(held, "b", TEXTS[:3])
    held.drop("a")  # its step was refused
    held.drop("a")
    assert sent(step(held, "b", TEXTS[:4])) == (3, TEXTS[3:4], ["a"])
    assert sent(step(held, "a", TEXTS[:4])) == (0, TEXTS[:4], [])


def test_every_step_is_sent_whole_until_the_runner_says_it_holds_histories():
    # A runner from before held histories would ignore kept_messages and send the provider a part.
    held = HeldHistories()
    assert sent(step(held, "a", TEXTS[:3])) == (0, TEXTS[:3], [])
    request = step(held, "a", TEXTS[:5])
    assert sent(request) == (0, TEXTS[:5], []) and request.hold_history
    held.runner_holds = True  # its replies said so: it holds what every step so far sent
    assert sent(step(held, "a", TEXTS[:6])) == (5, TEXTS[5:6], [])


def test_a_history_grown_too_large_for_the_stream_is_refused_and_nothing_changes(monkeypatch):
    monkeypatch.setattr(runner, "MAX_STEP_REQUEST_BYTES", 4 * len(TEXTS[0]) + 20)
    held = holding()
    step(held, "a", TEXTS[:3])
    with pytest.raises(StepFailed, match="over the"):
        step(held, "a", [*TEXTS[:3], "x" * 60])
    # Counted in UTF-8, not in characters: three bytes each (the characters alone would fit).
    with pytest.raises(StepFailed, match="over the"):
        step(held, "a", [*TEXTS[:3], "\u20ac" * 20])
    assert sent(step(held, "a", TEXTS[:4])) == (3, TEXTS[3:4], [])
    # A history that lost messages counts only what is left.
    assert sent(step(held, "a", [*TEXTS[:2], "x" * 25])) == (2, ["x" * 25], [])
