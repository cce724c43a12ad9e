"""Remote sandboxes through the whole stack, against a real Docker engine."""

from __future__ import annotations

import pytest

from conftest import mock_provider_toml
from docker_support import TEST_IMAGE, docker_client, require_docker
from live import result, rpc, terminal, types
from mockllm import MockLLM, Reply


@pytest.fixture(scope="module")
def mock():
    llm = MockLLM().start()
    yield llm
    llm.stop()


def test_sandbox_lifecycle_auto_dispatch_and_close(start_stack, mock):
    require_docker()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN="t0ken-for-tests")
    profile = stack.create_profile("sbx", available_sandboxes=[TEST_IMAGE])
    other = stack.create_profile("other", available_sandboxes=["elsewhere:1"])
    key = stack.create_key(profile["id"])["key"]
    shell = {"name": "sh", "description": "run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
    opened = stack.open_session(key, sandbox_tools=[shell])
    sid, skey = opened["session_id"], opened["session_key"]
    call = lambda method, params=None: rpc(stack.client, sid, skey, method, params)  # noqa: E731

    assert terminal(call("session.startRemoteSandbox", {"image": TEST_IMAGE}))["error"]["code"] == -32001
    result(call("session.registerDriver"))
    events = stack.client.get(f"/api/v1/sessions/{sid}/events", headers={"Authorization": f"Bearer {skey}"}).json()["items"]
    available = [e for e in events if e["event_type"] == "session.sandbox.available"][0]["payload"]
    assert [i["name"] for i in available["images"]] == [TEST_IMAGE]  # this profile's images only
    refused = terminal(call("session.startRemoteSandbox", {"image": "elsewhere:1"}))["error"]
    assert refused["code"] == -32011
    assert terminal(call("session.stopRemoteSandbox"))["error"]["code"] == -32013

    started = result(call("session.startRemoteSandbox", {"image": TEST_IMAGE}))
    assert started["image"] == TEST_IMAGE
    assert terminal(call("session.startRemoteSandbox", {"image": TEST_IMAGE}))["error"]["code"] == -32000
    ran = result(call("session.execRemoteSandbox", {"command": "echo out; echo err >&2; exit 3"}))
    assert ran == {"stdout": "out\n", "stderr": "err\n", "exit_code": 3}

    mock.enqueue(Reply.tool_use([("tu_1", "sh", {"command": "echo hi; echo oops >&2; exit 2"})]), Reply.text("done"))
    outcome = result(call("session.sendMessage", {"message": {"content": "run it"}}))
    assert types(outcome["events"]) == [
        "client.message.send", "provider.request", "provider.response", "tool.call", "sandbox.request",
        "sandbox.response", "tool.result", "provider.request", "provider.response", "server.message.send",
    ]
    rendered = outcome["events"][6]["payload"]
    assert rendered["is_error"] is True
    assert rendered["content"] == [{"type": "text", "text": "hi\n[stderr]\noops\n[exit_code: 2]"}]

    containers = docker_client().containers.list(filters={"label": f"bae.session_id={sid}"})
    assert len(containers) == 1
    closed = stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"})
    assert closed.status_code == 200
    assert docker_client().containers.list(all=True, filters={"label": f"bae.session_id={sid}"}) == []
    events = stack.client.get(f"/api/v1/sessions/{sid}/events", headers={"Authorization": f"Bearer {skey}"}).json()["items"]
    assert types(events)[-3:] == ["session.close", "session.sandbox.stop", "session.sandbox.stopped"]
    assert other["id"] != profile["id"]
