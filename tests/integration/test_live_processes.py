"""The live loop through all five service processes: a turn that falls back from the Anthropic to the
OpenAI wire kind, and a runner process that goes down and comes back."""

from __future__ import annotations

import json
import time

import pytest

from testkit.live import all_events, new_session, register, result, send, session_state, types
from testkit.mockllm import MockLLM, Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"


def stack_toml(mock: MockLLM) -> str:
    # "mock" speaks Anthropic Messages, "gpt" OpenAI Chat Completions; both are the same MockLLM.
    return mock_provider_toml(mock.base_url) + mock_provider_toml(mock.base_url, name="gpt", kind="openai")


@pytest.fixture
def stack(start_stack, mock):
    mock.reset()
    return start_stack(config_toml=stack_toml(mock), MOCK_LLM_TOKEN=TOKEN, BAE_PROVIDER_TIMEOUT="2")


# --- mixed-kind fallback ------------------------------------------------------------------

def test_anthropic_primary_failing_falls_back_to_openai_with_the_exact_walk(stack, mock):
    sid, skey, _ = new_session(stack, fallback_providers=["gpt"])
    register(stack, sid, skey)
    tools = [{"name": "get_time", "description": "get_time", "input_schema": {"type": "object"}}]
    cases = [
        (Reply.error(503, "overloaded"), {"status": 503, "error": "provider returned HTTP 503", "body": "overloaded"}),
        (Reply.hang(3), {"status": None, "error": "request timed out after 2 s", "body": None}),
    ]
    for number, (failure, failed) in enumerate(cases):
        mock.reset()
        mock.enqueue(failure, Reply.text(f"from gpt {number}"))
        outcome = result(send(stack, sid, skey, f"hi {number}"))
        assert outcome["message"] == {"role": "assistant", "content": [{"type": "text", "text": f"from gpt {number}"}]}
        walk = [(e["event_type"], e["payload"]) for e in outcome["events"][1:]]
        assert [kind for kind, _ in walk] == [
            "provider.request", "provider.response", "session.error",
            "provider.request", "provider.response", "server.message.send",
        ]
        primary_request, primary_response, error, fallback_request, fallback_response, _ = (p for _, p in walk)
        assert {k: primary_request[k] for k in ("attempt", "kind", "provider", "base_url", "model", "max_tokens")} == {
            "attempt": 0, "kind": "primary", "provider": "anthropic", "base_url": mock.base_url,
            "model": "mock-model", "max_tokens": 4096,
        }
        assert primary_request["tools"] == tools
        assert primary_response == {"attempt": 0, "kind": "primary", "provider": "anthropic", "ok": False, **failed}
        assert error == {"reason": "provider_call_failed", "provider": "anthropic", "detail": failed["error"]}
        assert {k: fallback_request[k] for k in ("attempt", "kind", "provider", "base_url")} == {
            "attempt": 1, "kind": "fallback", "provider": "openai", "base_url": mock.base_url,
        }
        assert fallback_request["messages"] == primary_request["messages"]
        assert "normalized" not in fallback_request
        assert fallback_response["ok"] is True and fallback_response["status"] == 200
        assert fallback_response["usage"] == {"input_tokens": 10, "output_tokens": 5}
        assert fallback_response["body"]["choices"][0]["message"]["content"] == f"from gpt {number}"
        assert [r["path"] for r in mock.requests] == ["/v1/messages", "/v1/chat/completions"]
        assert mock.requests[0]["headers"]["x-api-key"] == TOKEN
        assert mock.requests[1]["headers"]["authorization"] == f"Bearer {TOKEN}"
        assert TOKEN not in json.dumps(outcome)
    assert session_state(stack, sid) == "open"


# --- runner unreachable -------------------------------------------------------------------

def test_runner_down_fails_the_turn_with_session_loop_failed_and_the_session_stays_usable(start_stack, mock):
    mock.reset()
    # BAE_RPC_TIMEOUT bounds how long a step waits for an unreachable runner.
    stack = start_stack(config_toml=stack_toml(mock), MOCK_LLM_TOKEN=TOKEN, BAE_RPC_TIMEOUT="3")
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    runner = stack.stack.processes["runner"]
    runner.terminate()
    runner.wait(10)

    began = time.monotonic()
    frames = send(stack, sid, skey, "hi")
    assert 3 <= time.monotonic() - began < 8
    assert frames == [{"jsonrpc": "2.0", "id": frames[-1]["id"],
                       "error": {"code": -32000, "message": "session loop failed"}}]
    recorded = all_events(stack, sid, skey)
    assert types(recorded)[-1] == "client.message.send"  # the input is kept; no provider event was written
    assert session_state(stack, sid) == "open"
    assert mock.requests == []

    stack.stack.restart("runner")
    mock.enqueue(Reply.text("back"))
    outcome = result(send(stack, sid, skey, "again"))
    assert outcome["message"]["content"] == [{"type": "text", "text": "back"}]
    request = outcome["events"][1]["payload"]
    # Both user turns reach the provider, folded into one Anthropic user message.
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "again"}]}
    ]
    assert request["normalized"] == {"prepended_user": False, "merged": [[0, 1]]}
