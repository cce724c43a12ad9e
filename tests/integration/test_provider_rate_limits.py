"""A provider's 429 or 529 through the whole stack of processes: a fallback trigger whose
`Retry-After` is honoured within BAE_RPC_TIMEOUT (docs/engine.md, "Provider attempts")."""

from __future__ import annotations

import email.utils
import json
import time

import pytest

from testkit.live import new_session, register, result, send, session_state, types
from testkit.mockllm import MockLLM, Reply
from testkit.stack import launch_stack, mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"
UNAVAILABLE = "The provider is currently unavailable."


@pytest.fixture(scope="module")
def shared(tmp_path_factory, mock: MockLLM):
    # "mock" speaks Anthropic Messages, "gpt" OpenAI Chat Completions; both are the same MockLLM.
    toml = mock_provider_toml(mock.base_url) + mock_provider_toml(mock.base_url, name="gpt", kind="openai")
    running = launch_stack(tmp_path_factory.mktemp("rate-limits"), toml, MOCK_LLM_TOKEN=TOKEN)
    yield running
    running.close()


@pytest.fixture
def stack(shared, mock):
    mock.reset()
    return shared


def turn(stack, **profile) -> tuple[list[tuple[str, dict]], dict, str, str]:
    """One turn of a new session: its walk (event type, payload) after the client message, the
    result, and the session's id and key."""
    sid, skey, _ = new_session(stack, **profile)
    register(stack, sid, skey)
    outcome = result(send(stack, sid, skey, "hi"))
    assert types(outcome["events"])[0] == "client.message.send"
    assert TOKEN not in json.dumps(outcome)
    return [(e["event_type"], e["payload"]) for e in outcome["events"][1:]], outcome, sid, skey


def failed(attempt: int, kind: str, provider: str, status: int, body: str, **extra) -> dict:
    return {"attempt": attempt, "kind": kind, "provider": provider, "ok": False, "status": status,
            "error": f"provider returned HTTP {status}", "body": body, **extra}


def gap(mock: MockLLM) -> float:
    """Seconds between the mock's first and second request."""
    return mock.requests[1]["received"] - mock.requests[0]["received"]


def test_a_rate_limited_primary_falls_back_at_once(stack, mock):
    mock.enqueue(Reply.error(429, "slow down", {"retry-after": "5"}), Reply.text("from gpt"))
    walk, outcome, sid, _ = turn(stack, fallback_providers=["gpt"])
    assert outcome["message"]["content"] == [{"type": "text", "text": "from gpt"}]
    assert [kind for kind, _ in walk] == [
        "provider.request", "provider.response", "session.error",
        "provider.request", "provider.response", "server.message.send",
    ]
    assert walk[1][1] == failed(0, "primary", "anthropic", 429, "slow down", retry_after=5)
    assert walk[2][1] == {"reason": "provider_call_failed", "provider": "anthropic",
                          "detail": "provider returned HTTP 429"}
    assert {k: walk[3][1][k] for k in ("attempt", "kind", "provider")} == {
        "attempt": 1, "kind": "fallback", "provider": "openai"}
    assert walk[4][1]["ok"] is True and walk[4][1]["attempt"] == 1
    assert gap(mock) < 5, "the walk waited for the primary's Retry-After although a fallback was left"
    assert len(mock.requests) == 2
    assert session_state(stack, sid) == "open"


def test_a_single_provider_is_tried_again_after_its_retry_after(stack, mock):
    mock.enqueue(Reply.error(429, "slow down", {"retry-after": "1"}), Reply.text("now then"))
    walk, outcome, sid, _ = turn(stack)
    assert outcome["message"]["content"] == [{"type": "text", "text": "now then"}]
    assert [kind for kind, _ in walk] == [
        "provider.request", "provider.response", "session.error",
        "provider.request", "provider.response", "server.message.send",
    ]
    assert walk[1][1] == failed(0, "primary", "anthropic", 429, "slow down", retry_after=1)
    assert walk[2][1]["reason"] == "provider_call_failed"
    # The retry is the primary again, its attempt numbered on.
    assert {k: walk[3][1][k] for k in ("attempt", "kind", "provider", "model")} == {
        "attempt": 1, "kind": "primary", "provider": "anthropic", "model": "mock-model"}
    assert walk[3][1]["messages"] == walk[0][1]["messages"]
    assert {k: walk[4][1][k] for k in ("attempt", "kind", "ok", "status")} == {
        "attempt": 1, "kind": "primary", "ok": True, "status": 200}
    assert gap(mock) >= 1, "the retry came before the provider's Retry-After was over"
    assert session_state(stack, sid) == "open"


def test_a_retry_after_beyond_the_rpc_timeout_is_not_waited_for(stack, mock):
    # BAE_RPC_TIMEOUT is 10 s here; this one asks for a minute, as an HTTP date.
    later = email.utils.formatdate(time.time() + 60, usegmt=True)
    mock.enqueue(Reply.error(429, "come back later", {"retry-after": later}))
    walk, outcome, sid, skey = turn(stack)
    assert outcome["message"]["content"] == [{"type": "text", "text": UNAVAILABLE}]
    assert [kind for kind, _ in walk] == ["provider.request", "provider.response", "session.error"]
    response = walk[1][1]
    assert 55 < response.pop("retry_after") <= 60
    assert response == failed(0, "primary", "anthropic", 429, "come back later")
    assert walk[2][1] == {"reason": "all_providers_failed", "attempts": 1}
    assert len(mock.requests) == 1
    assert session_state(stack, sid) == "error"


def test_an_overloaded_anthropic_answer_is_tried_again_once_the_chain_is_walked(stack, mock):
    mock.enqueue(
        Reply.error(529, '{"type":"error","error":{"type":"overloaded_error"}}', {"retry-after-ms": "300"}),
        Reply.error(429, "no wait given"),
        Reply.text("after the wait"),
    )
    walk, outcome, _, _ = turn(stack, fallback_providers=["gpt"])
    assert outcome["message"]["content"] == [{"type": "text", "text": "after the wait"}]
    assert [kind for kind, _ in walk] == [
        "provider.request", "provider.response", "session.error",
        "provider.request", "provider.response",
        "provider.request", "provider.response", "server.message.send",
    ]
    assert walk[1][1] == failed(0, "primary", "anthropic", 529,
                                '{"type":"error","error":{"type":"overloaded_error"}}', retry_after=0.3)
    assert walk[4][1] == failed(1, "fallback", "openai", 429, "no wait given")
    assert {k: walk[5][1][k] for k in ("attempt", "kind", "provider")} == {
        "attempt": 2, "kind": "primary", "provider": "anthropic"}
    assert walk[6][1]["ok"] is True and walk[6][1]["attempt"] == 2
    assert [r["path"] for r in mock.requests] == ["/v1/messages", "/v1/chat/completions", "/v1/messages"]
    assert mock.requests[2]["received"] - mock.requests[0]["received"] >= 0.3
