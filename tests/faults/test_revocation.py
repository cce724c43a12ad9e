"""Revoking a client key ends its live access at once (the session stays open for
the keys that still hold it): its streams end, it stops being a driver, and a turn
it left paused is reclaimable immediately."""

from __future__ import annotations

import json
import threading
import time

import pytest

from conftest import mock_provider_toml
from live import declared, notifications, register, result, send, session_state, types
from mockllm import Reply

TOKEN = "sk-test-secret-token-123456"


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


def subscribe_in_background(stack, sid, skey):
    lines: list[dict] = []
    done = threading.Event()

    def run():
        body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}
        with stack.client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=body,
                                 headers={"Authorization": f"Bearer {skey}"}, timeout=60) as response:
            for line in response.iter_lines():
                if line:
                    lines.append(json.loads(line))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return lines, done


def test_revocation_ends_the_keys_subscription_and_driver_role(stack, mock):
    sid, a, b, b_key_id = two_drivers(stack)
    lines, done = subscribe_in_background(stack, sid, b)
    time.sleep(0.3)
    mock.enqueue(Reply.text("first"))
    result(send(stack, sid, a, "before"))
    deadline = time.monotonic() + 5
    while "server.message.send" not in types(notifications(lines)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "server.message.send" in types(notifications(lines))

    assert stack.admin.delete(f"/admin/v1/keys/{b_key_id}").status_code == 204
    assert done.wait(5), "the revoked key's subscription is still open"
    seen = len(lines)
    mock.enqueue(Reply.text("second"))
    result(send(stack, sid, a, "after"))
    assert len(lines) == seen  # nothing more reached the revoked key
    assert session_state(stack, sid) == "open"
    drivers = stack.client.get(f"/api/v1/sessions/{sid}/participants",
                               headers={"Authorization": f"Bearer {a}"}).json()["drivers"]
    assert b_key_id not in drivers


def test_a_revoked_keys_pause_is_reclaimed_at_once(stack, mock):
    sid, a, b, b_key_id = two_drivers(stack)
    mock.enqueue(Reply.tool_use([("tu_1", "lookup", {})]))
    assert result(send(stack, sid, b, "look"))["message"]["content"][0]["dispatch"] == "client"
    assert stack.admin.delete(f"/admin/v1/keys/{b_key_id}").status_code == 204

    mock.enqueue(Reply.text("carried on"))
    started = time.monotonic()
    outcome = result(send(stack, sid, a, "go on"))
    assert time.monotonic() - started < 10  # not the 300 s turn timeout
    assert outcome["message"]["content"][0]["text"] == "carried on"
    log = stack.client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200},
                           headers={"Authorization": f"Bearer {a}"}).json()["items"]
    abandoned = [e for e in log if e["event_type"] == "session.error"]
    assert [e["payload"] for e in abandoned] == [{"reason": "driver_turn_abandoned", "owner_client_key_id": b_key_id}]
    # Every tool_use was answered before the next provider call.
    sent = mock.requests[-1]["body"]["messages"]
    assert sent[-1]["content"][0] == {"type": "tool_result", "tool_use_id": "tu_1",
                                      "content": "Client tool call was abandoned before returning a result.",
                                      "is_error": True}


def test_the_revoked_key_can_no_longer_call(stack, mock):
    sid, a, b, b_key_id = two_drivers(stack)
    assert stack.admin.delete(f"/admin/v1/keys/{b_key_id}").status_code == 204
    response = stack.client.post(f"/api/v1/sessions/{sid}/rpc", headers={"Authorization": f"Bearer {b}"},
                                 json={"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"})
    assert response.status_code == 401
