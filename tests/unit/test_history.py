"""The session's in-memory provider history (SERVER-SPEC §12.5) and what a step sends of it."""

from __future__ import annotations

import json

import pytest

from bae.services.session.engine.history import History

pytestmark = pytest.mark.unit


def event(event_id: str, event_type: str, payload: dict) -> dict:
    return {"id": event_id, "event_type": event_type, "payload": payload}


CONVERSATION = [
    event("e1", "client.message.send", {"role": "user", "content": "one"}),
    event("e2", "provider.request", {"messages": []}),
    event("e3", "server.message.send", {"role": "assistant", "content": [{"type": "text", "text": "two"}]}),
    event("e4", "client.message.send", {"content": "three"}),  # no role: a client message is the user's
]


def test_a_step_gets_each_message_as_its_text_and_its_role():
    texts, roles = History.from_events(CONVERSATION).step_messages([{"role": "assistant", "content": "four"}])
    assert [json.loads(text) for text in texts] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": [{"type": "text", "text": "two"}]},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four"},
    ]
    assert roles == ["user", "assistant", "user", "assistant"]


def test_a_step_copies_the_history_so_extending_it_later_changes_no_sent_step():
    history = History.from_events(CONVERSATION[:1])
    texts, roles = history.step_messages()
    history.observe(CONVERSATION[2:3])
    assert (len(texts), len(roles), len(history)) == (1, 1, 2)


def test_the_compaction_instruction_joins_a_last_user_message_or_follows_an_assistant_one():
    texts, roles = History.from_events(CONVERSATION).with_instruction("Summarize.")
    assert json.loads(texts[-1]) == {
        "role": "user", "content": [{"type": "text", "text": "three"}, {"type": "text", "text": "Summarize."}],
    }
    assert (len(texts), roles) == (3, ["user", "assistant", "user"])

    texts, roles = History.from_events(CONVERSATION[:3]).with_instruction("Summarize.")
    assert json.loads(texts[-1]) == {"role": "user", "content": "Summarize."}
    assert roles == ["user", "assistant", "user"]


def test_a_completed_compaction_starts_the_history_at_its_preamble():
    history = History.from_events([
        *CONVERSATION,
        event("p", "server.message.send", {"role": "user", "content": "preamble"}),
        event("s", "server.message.send", {"role": "assistant", "content": "summary"}),
        event("c", "session.compaction.completed", {"preamble_event_id": "p", "summary_event_id": "s"}),
    ])
    texts, roles = history.step_messages()
    assert [json.loads(text)["content"] for text in texts] == ["preamble", "summary"]
    assert roles == ["user", "assistant"] and len(history) == 2
