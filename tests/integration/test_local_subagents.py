"""session.reportLocalSubagent and the session.cancelSubagent checks that need no sandbox (SERVER-SPEC §11.5, §11.6)."""

from __future__ import annotations

import pytest

from testkit.live import new_session, register, result, rpc, terminal
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.inprocess

TOKEN = "sk-test-secret-token-123456"


@pytest.fixture(scope="module")
def shared(tmp_path_factory, mock):
    from testkit.inprocess import launch_inprocess_stack

    stack = launch_inprocess_stack(tmp_path_factory.mktemp("local-subagents"), mock_provider_toml(mock.base_url),
                         MOCK_LLM_TOKEN=TOKEN)
    yield stack
    stack.close()


@pytest.fixture
def driver(shared):
    sid, skey, _ = new_session(shared)
    register(shared, sid, skey)
    return shared, sid, skey


def report(stack, sid, skey, params):
    return rpc(stack.client, sid, skey, "session.reportLocalSubagent", params)


def events(stack, sid, skey):
    page = stack.client.get(f"/api/v1/sessions/{sid}/events", headers={"Authorization": f"Bearer {skey}"})
    return page.json()["items"]


BASE = {"subagent_id": "loc_1", "harness": "claude", "model": "m"}


@pytest.mark.parametrize(
    "state,extra,payload",
    [
        ("start", {}, {"detail": None}),
        ("running", {"detail": "pid 42"}, {"detail": "pid 42"}),
        ("completed", {"exit_code": 0}, {"detail": None, "exit_code": 0}),
        ("failed", {"reason": "whatever", "exit_code": 3}, {"detail": None, "reason": "whatever", "exit_code": 3}),
        ("cancelled", {"reason": "explicit"}, {"detail": None, "reason": "explicit", "exit_code": None}),
    ],
)
def test_every_state_maps_to_its_event(driver, state, extra, payload):
    stack, sid, skey = driver
    assert result(report(stack, sid, skey, {"state": state, **BASE, **extra})) == {"reported": True}
    last = events(stack, sid, skey)[-1]
    assert last["event_type"] == f"session.subagent.{state}"
    assert last["payload"] == {"dispatch": "local", **BASE, **payload}


@pytest.mark.parametrize(
    "params,message",
    [
        ({"state": "begun", **BASE}, '"state" must be "start", "running", "completed", "failed", or "cancelled"'),
        ({"state": "start", "subagent_id": "x", "harness": " ", "model": "m"},
         '"subagent_id", "harness", and "model" must be non-empty strings'),
        ({"state": "start", **BASE, "detail": 5}, '"detail" must be a string or null'),
        ({"state": "failed", **BASE, "reason": ["x"]}, '"reason" must be a string or null'),
        ({"state": "failed", **BASE, "exit_code": "1"}, '"exit_code" must be an integer'),
        ({"state": "failed", **BASE, "exit_code": True}, '"exit_code" must be an integer'),
    ],
)
def test_bad_params_are_refused_exactly(driver, params, message):
    stack, sid, skey = driver
    error = terminal(report(stack, sid, skey, params))["error"]
    assert error == {"code": -32602, "message": f"Invalid params: {message}"}


def test_an_unregistered_caller_is_refused_first(shared):
    sid, skey, _ = new_session(shared)
    error = terminal(report(shared, sid, skey, {"state": "nope"}))["error"]
    assert error == {"code": -32001, "message": "call session.registerDriver before session.reportLocalSubagent"}


def test_cancel_checks(driver):
    stack, sid, skey = driver
    missing = terminal(rpc(stack.client, sid, skey, "session.cancelSubagent", {}))["error"]
    assert missing == {"code": -32602, "message": 'Invalid params: missing "subagent_id"'}
    # A locally reported subagent is not tracked: it cannot be cancelled server-side.
    result(report(stack, sid, skey, {"state": "start", **BASE}))
    unknown = terminal(rpc(stack.client, sid, skey, "session.cancelSubagent", {"subagent_id": "loc_1"}))["error"]
    assert unknown == {"code": -32014, "message": 'subagent_not_found: no tracked subagent "loc_1" for this session'}
