"""History compaction through the whole stack (SERVER-SPEC §12): session.compact,
auto mode, failures, and the history providers see afterwards."""

from __future__ import annotations

import time

import pytest

from testkit.live import declared, notifications, register, result, rpc, send, session_state, terminal, types
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.inprocess

TOKEN = "sk-test-secret-token-123456"
PREAMBLE = "The earlier part of this conversation was compacted. A summary follows."


@pytest.fixture(scope="module")
def shared(tmp_path_factory, mock):
    from testkit.inprocess import launch_inprocess_stack

    toml = mock_provider_toml(mock.base_url) + mock_provider_toml(mock.base_url, name="gpt", kind="openai")
    stack = launch_inprocess_stack(tmp_path_factory.mktemp("compaction"), toml, MOCK_LLM_TOKEN=TOKEN, BAE_TURN_TIMEOUT="1")
    yield stack
    stack.close()


@pytest.fixture
def stack(shared, mock):
    mock.reset()
    return shared


def open_session(stack, *, compaction=None, tools=("lookup",), primary="mock", fallbacks=()):
    profile = stack.create_profile(
        f"p{time.monotonic_ns()}", primary=primary, allowed_tools=list(tools), fallback_providers=list(fallbacks)
    )
    key = stack.create_key(profile["id"])["key"]
    body = {"tools": declared(tools)}
    if compaction is not None:
        body["compaction"] = compaction
    opened = stack.open_session(key, **body)
    sid, skey = opened["session_id"], opened["session_key"]
    register(stack, sid, skey)
    return sid, skey


def compact(stack, sid, skey, params=None):
    return rpc(stack.client, sid, skey, "session.compact", params)


def events(stack, sid, skey):
    page = stack.client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200},
                            headers={"Authorization": f"Bearer {skey}"})
    return page.json()["items"]


def chat(stack, mock, sid, skey, *texts):
    for text in texts:
        mock.enqueue(Reply.text(f"re: {text}"))
        result(send(stack, sid, skey, text))


def test_manual_compaction_streams_its_events_and_answers_with_the_completed_event(stack, mock):
    sid, skey = open_session(stack)
    chat(stack, mock, sid, skey, "one", "two")
    mock.enqueue(Reply.text("SUMMARY", usage=(321, 12)))
    frames = compact(stack, sid, skey)
    completed = result(frames)
    assert completed["event_type"] == "session.compaction.completed"
    streamed = notifications(frames)
    assert types(streamed) == [
        "session.compaction.started", "provider.request", "provider.response",
        "server.message.send", "server.message.send", "session.compaction.completed",
    ]
    assert streamed[-1] == completed
    started, request, response, preamble, summary = streamed[:5]
    # token_count is the newest turn call's usage (the mock's default 10 + 5).
    assert started["payload"] == {"trigger": "client", "reason": "manual", "token_count": 15, "threshold_tokens": None}
    assert request["payload"]["purpose"] == "compaction" and response["payload"]["purpose"] == "compaction"
    assert request["payload"]["max_tokens"] == 4096 and request["payload"]["tools"] == []
    assert preamble["payload"] == {"role": "user", "content": [{"type": "text", "text": PREAMBLE}],
                                   "synthetic": "compaction_preamble"}
    assert summary["payload"] == {"role": "assistant", "content": [{"type": "text", "text": "SUMMARY"}]}
    assert completed["payload"] == {
        "preamble_event_id": preamble["id"], "summary_event_id": summary["id"],
        "compacted_message_count": 4, "input_tokens": 321, "summary_tokens": 12,
    }
    # The built-in prompt closes the history as a user message of its own (the last one was the assistant's).
    sent = mock.requests[-1]["body"]["messages"]
    assert sent[-1]["role"] == "user" and sent[-1]["content"].startswith("Summarize")
    assert all(e["client_key_id"] == started["client_key_id"] for e in streamed)


def test_providers_see_the_summary_then_what_followed(stack, mock):
    sid, skey = open_session(stack)
    chat(stack, mock, sid, skey, "one")
    mock.enqueue(Reply.text("SUMMARY"))
    result(compact(stack, sid, skey))
    chat(stack, mock, sid, skey, "two", "three")
    assert mock.requests[-1]["body"]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": PREAMBLE}]},
        {"role": "assistant", "content": [{"type": "text", "text": "SUMMARY"}]},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": [{"type": "text", "text": "re: two"}]},
        {"role": "user", "content": "three"},
    ]
    # The event log itself keeps everything.
    assert types(events(stack, sid, skey)).count("client.message.send") == 3


def test_prompt_precedence_param_then_stored_then_default(stack, mock):
    sid, skey = open_session(stack, compaction={"mode": "client", "prompt": "STORED PROMPT"})
    chat(stack, mock, sid, skey, "one")
    mock.enqueue(Reply.text("S1"))
    result(compact(stack, sid, skey))
    assert mock.requests[-1]["body"]["messages"][-1]["content"] == "STORED PROMPT"
    mock.enqueue(Reply.text("S2"))
    result(compact(stack, sid, skey, {"prompt": "PARAM PROMPT"}))
    assert mock.requests[-1]["body"]["messages"][-1]["content"] == "PARAM PROMPT"
    mock.enqueue(Reply.text("S3"))
    result(compact(stack, sid, skey, {"prompt": None}))
    assert mock.requests[-1]["body"]["messages"][-1]["content"] == "STORED PROMPT"


def test_a_session_not_open_is_refused_before_params(stack, mock):
    sid, skey = open_session(stack)
    mock.enqueue(Reply.tool_use([("tu_1", "lookup", {})]))
    result(send(stack, sid, skey, "go"))
    broken = terminal(send(stack, sid, skey, [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]))
    assert broken["error"]["message"].startswith("tool result merge invalid")
    error = terminal(compact(stack, sid, skey, {"prompt": 7}))["error"]
    assert error == {"code": -32000, "message": "session is error, not open"}


def test_bad_params_are_refused_before_the_gate(stack, mock):
    sid, skey = open_session(stack)
    mock.enqueue(Reply.tool_use([("tu_1", "lookup", {})]))
    result(send(stack, sid, skey, "go"))  # a live pause: -32020 would come after the params check
    error = terminal(compact(stack, sid, skey, {"prompt": 7}))["error"]
    assert error == {"code": -32602, "message": "Invalid params: invalid type: integer `7`, expected a string or null"}


def test_an_unregistered_caller_is_refused_first(stack):
    profile = stack.create_profile(f"p{time.monotonic_ns()}")
    key = stack.create_key(profile["id"])["key"]
    opened = stack.open_session(key)
    frames = compact(stack, opened["session_id"], opened["session_key"], {"prompt": 7})
    assert frames == [{"jsonrpc": "2.0", "id": frames[0]["id"],
                       "error": {"code": -32001, "message": "call session.registerDriver before session.compact"}}]


def test_a_live_pause_is_turn_in_progress_and_an_expired_one_is_retired(stack, mock):
    sid, skey = open_session(stack)
    mock.enqueue(Reply.tool_use([("tu_1", "lookup", {"q": 1})]))
    assert result(send(stack, sid, skey, "look"))["message"]["content"][0]["dispatch"] == "client"
    error = terminal(compact(stack, sid, skey))["error"]
    assert error == {"code": -32020, "message": "turn in progress: resolve the paused turn before compacting"}
    time.sleep(1.1)  # BAE_TURN_TIMEOUT=1: the pause expires
    mock.enqueue(Reply.text("SUMMARY"))
    frames = compact(stack, sid, skey)
    assert result(frames)["event_type"] == "session.compaction.completed"
    streamed = notifications(frames)
    assert types(streamed)[:3] == ["session.error", "server.message.send", "tool.result"]
    assert streamed[0]["payload"]["reason"] == "driver_turn_abandoned"
    assert streamed[1]["payload"] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "tu_1",
                     "content": "Client tool call was abandoned before returning a result.", "is_error": True}],
        "synthetic": "abandoned_tool_results",
    }
    assert streamed[2]["payload"]["tool_use_id"] == "tu_1" and streamed[2]["payload"]["dispatch"] == "client"
    # The summarized history answered every tool_use, so the provider accepted it.
    sent = mock.requests[-1]["body"]["messages"]
    assert sent[1]["content"][0]["type"] == "tool_use" and sent[2]["content"][0]["type"] == "tool_result"
    # The last message is the user's, so the instruction is appended to it as a text block.
    assert len(sent) == 3 and sent[2]["content"][-1]["text"].startswith("Summarize")
    # The owner's late results now have no pause to go to.
    late = terminal(send(stack, sid, skey, [{"type": "tool_result", "tool_use_id": "tu_1", "content": "x"}]))
    assert late["error"]["code"] == -32000 and "no paused turn" in late["error"]["message"]


@pytest.mark.parametrize(
    "reply,primary,detail",
    [
        (Reply.text("   "), "mock", "empty summary"),
        (Reply.truncated("half a summ"), "mock", "summary truncated: stop_reason max_tokens"),
        (Reply.truncated("half a summ"), "gpt", "summary truncated: finish_reason length"),
        (Reply.error(500, "down"), "mock", "all 1 providers failed"),
    ],
    ids=["empty", "anthropic-max-tokens", "openai-length", "all-failed"],
)
def test_a_failed_compaction_leaves_history_untouched_and_the_session_open(stack, mock, reply, primary, detail):
    sid, skey = open_session(stack, primary=primary)
    chat(stack, mock, sid, skey, "one")
    mock.enqueue(reply)
    frames = compact(stack, sid, skey)
    assert terminal(frames)["error"] == {"code": -32000, "message": f"compaction failed: {detail}"}
    assert types(notifications(frames)) == ["session.compaction.started", "provider.request", "provider.response"]
    assert session_state(stack, sid) == "open"
    chat(stack, mock, sid, skey, "two")
    assert [m["role"] for m in mock.requests[-1]["body"]["messages"]] == ["user", "assistant", "user"]


def test_all_providers_failed_counts_the_chain(stack, mock):
    sid, skey = open_session(stack, fallbacks=("gpt",))
    chat(stack, mock, sid, skey, "one")
    mock.enqueue(Reply.error(500, "down"))
    mock.enqueue(Reply.error(503, "down too"))
    frames = compact(stack, sid, skey)
    assert terminal(frames)["error"]["message"] == "compaction failed: all 2 providers failed"
    # Compaction walks never write session.error.
    assert "session.error" not in types(notifications(frames))


def test_auto_compaction_runs_inside_the_turn_that_crossed_the_threshold(stack, mock):
    sid, skey = open_session(stack, compaction={"mode": "auto", "size": 1000})
    mock.enqueue(Reply.text("below", usage=(900, 50)))
    assert "session.compaction.started" not in types(result(send(stack, sid, skey, "small"))["events"])
    mock.enqueue(Reply.text("above", usage=(990, 20)))
    mock.enqueue(Reply.text("AUTO SUMMARY", usage=(1200, 40)))
    frames = send(stack, sid, skey, "big")
    outcome = result(frames)
    assert outcome["message"]["content"][0]["text"] == "above"
    assert types(outcome["events"]) == [
        "client.message.send", "provider.request", "provider.response", "server.message.send",
        "session.compaction.started", "provider.request", "provider.response",
        "server.message.send", "server.message.send", "session.compaction.completed",
    ]
    assert outcome["events"][4]["payload"] == {
        "trigger": "auto", "reason": "token_threshold", "token_count": 1010, "threshold_tokens": 1000,
    }
    # Every event reached the caller's stream too, before the terminal frame.
    assert types(notifications(frames))[-6:] == types(outcome["events"])[-6:]


def test_a_threshold_crossed_on_a_paused_call_compacts_when_the_turn_completes(stack, mock):
    sid, skey = open_session(stack, compaction={"mode": "auto", "size": 1000})
    mock.enqueue(Reply.tool_use([("tu_1", "lookup", {})], usage=(1500, 10)))
    paused = result(send(stack, sid, skey, "go"))
    assert "session.compaction.started" not in types(paused["events"])
    mock.enqueue(Reply.text("done", usage=None))
    mock.enqueue(Reply.text("SUMMARY"))
    done = result(send(stack, sid, skey, [{"type": "tool_result", "tool_use_id": "tu_1", "content": "r"}]))
    started = [e for e in done["events"] if e["event_type"] == "session.compaction.started"]
    assert [e["payload"]["token_count"] for e in started] == [1510]


def test_a_failed_auto_attempt_backs_off_until_a_larger_count(stack, mock):
    sid, skey = open_session(stack, compaction={"mode": "auto", "size": 1000})
    mock.enqueue(Reply.text("a", usage=(1100, 0)))
    mock.enqueue(Reply.text(""))  # empty summary: the attempt fails, the turn does not
    first = result(send(stack, sid, skey, "one"))
    assert first["message"]["content"][0]["text"] == "a"
    assert types(first["events"])[-3:] == ["session.compaction.started", "provider.request", "provider.response"]
    assert session_state(stack, sid) == "open"
    mock.enqueue(Reply.text("b", usage=(1050, 0)))  # not above the failed count: no attempt
    assert "session.compaction.started" not in types(result(send(stack, sid, skey, "two"))["events"])
    mock.enqueue(Reply.text("c", usage=(1200, 0)))
    mock.enqueue(Reply.text("SUMMARY"))
    third = result(send(stack, sid, skey, "three"))
    started = [e["payload"] for e in third["events"] if e["event_type"] == "session.compaction.started"]
    assert started == [{"trigger": "auto", "reason": "retry_after_failure", "token_count": 1200,
                        "threshold_tokens": 1000}]
    assert third["events"][-1]["event_type"] == "session.compaction.completed"


def test_a_primary_provider_that_cannot_be_resolved_fails_before_started(stack, mock):
    sid, skey = open_session(stack)
    chat(stack, mock, sid, skey, "one")
    before = events(stack, sid, skey)
    listed = stack.admin.get("/admin/v1/sessions", params={"limit": 200}).json()["items"]
    profile_id = next(row["profile_id"] for row in listed if row["id"] == sid)
    profile = stack.admin.get(f"/admin/v1/profiles/{profile_id}").json()
    moved = {**{name: profile[name] for name in ("name", "fallback_providers", "allowed_tools")},
             "primary_provider": "nowhere"}
    assert stack.admin.put(f"/admin/v1/profiles/{profile_id}", json=moved).status_code == 200
    frames = compact(stack, sid, skey)
    assert frames == [{"jsonrpc": "2.0", "id": frames[0]["id"], "error": {
        "code": -32000,
        "message": 'compaction failed: provider_config: primary provider "nowhere" is not configured in bae-config.toml',
    }}]
    assert events(stack, sid, skey) == before  # no started event, nothing at all
    assert len(mock.requests) == 1  # the turn's call only
    assert session_state(stack, sid) == "open"


def test_a_manual_compaction_ignores_the_backoff_and_clears_it(stack, mock):
    sid, skey = open_session(stack, compaction={"mode": "auto", "size": 1000})
    mock.enqueue(Reply.text("a", usage=(1100, 0)), Reply.text(""))  # the auto attempt fails: backoff at 1100
    assert types(result(send(stack, sid, skey, "one"))["events"])[-1] == "provider.response"
    mock.enqueue(Reply.text("MANUAL SUMMARY"))
    completed = result(compact(stack, sid, skey))  # no completed turn since the failure: manual runs anyway
    assert completed["event_type"] == "session.compaction.completed"
    # Backed off, 1050 would not be retried (not above the failed 1100); cleared, it is a new trigger.
    mock.enqueue(Reply.text("b", usage=(1000, 50)), Reply.text("AUTO SUMMARY"))
    outcome = result(send(stack, sid, skey, "two"))
    started = [e["payload"] for e in outcome["events"] if e["event_type"] == "session.compaction.started"]
    assert started == [{"trigger": "auto", "reason": "token_threshold", "token_count": 1050,
                        "threshold_tokens": 1000}]
    assert outcome["events"][-1]["event_type"] == "session.compaction.completed"


def test_usage_null_never_triggers_and_manual_token_count_looks_no_further_back(stack, mock):
    sid, skey = open_session(stack, compaction={"mode": "auto", "size": 1000})
    mock.enqueue(Reply.text("a", usage=(1100, 0)), Reply.text("SUMMARY ONE"))
    assert types(result(send(stack, sid, skey, "one"))["events"])[-1] == "session.compaction.completed"
    # The next turn's only call reports no usage: no trigger, whatever earlier calls reported.
    mock.enqueue(Reply.text("b", usage=None))
    outcome = result(send(stack, sid, skey, "two"))
    assert types(outcome["events"]) == [
        "client.message.send", "provider.request", "provider.response", "server.message.send",
    ]
    assert outcome["events"][2]["payload"]["usage"] is None
    mock.enqueue(Reply.text("SUMMARY TWO"))
    frames = compact(stack, sid, skey)
    assert result(frames)["event_type"] == "session.compaction.completed"
    # The newest turn call's usage is null: token_count is null, not the 1100 before it (§12.3 step 9).
    assert notifications(frames)[0]["payload"] == {"trigger": "client", "reason": "manual", "token_count": None,
                                                   "threshold_tokens": None}
