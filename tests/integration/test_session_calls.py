"""The gateway's calls to a session replica on its `Calls` stream, through the gateway: a call
past its deadline is stopped on the replica too (the stack in this process, the call held inside
the service), and a replica told to stop answers the calls it took and exits without waiting out
its budget. tests/unit/test_gateway_calls.py tests the stream's two ends on their own."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from bae.launcher.stack import grpc_serving
from testkit.live import new_session, register, result, rpc, turn_in_background
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

TOKEN = "sk-test-secret-token-123456"


@pytest.mark.inprocess
def test_a_call_past_the_gateways_deadline_answers_504_and_is_stopped_on_the_replica(start_inprocess_stack, mock):
    stack = start_inprocess_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                                  BAE_RPC_TIMEOUT="1")
    sid, skey, _ = new_session(stack)
    hold = stack.hold(stack.session.engine.registry, "attach", sid)
    started = time.monotonic()
    response = stack.client.post(
        f"/api/v1/sessions/{sid}/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver"},
        headers={"Authorization": f"Bearer {skey}"},
    )
    assert response.status_code == 504, response.text
    assert response.json()["type"].endswith("gateway_timeout")
    assert time.monotonic() - started < 5
    # The replica cancelled the call where it was held.
    assert hold.cancelled.wait(5)
    hold.release()
    assert rpc(stack.client, sid, skey, "session.registerDriver")[0]["result"] == {"registered": True}


@pytest.mark.stack
def test_a_replica_told_to_stop_answers_the_calls_it_took_and_exits_without_waiting_out_its_budget(
    start_stack, mock
):
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                        BAE_SHUTDOWN_TIMEOUT="30")
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.reset()
    release = threading.Event()
    mock.enqueue(Reply.held(release, then=Reply.text("done")))
    thread, outcome = turn_in_background(stack, sid, skey, "hi")
    deadline = time.monotonic() + 10
    while not mock.requests:  # the turn's provider call is in flight: the replica took the call
        assert time.monotonic() < deadline, "the turn did not reach the provider"
        time.sleep(0.05)
    session = stack.stack.processes["session"]
    session.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while grpc_serving(stack.stack.settings.session_grpc_addr):  # draining once it reports so
        assert time.monotonic() < deadline, "the session service did not start to drain"
        time.sleep(0.05)
    release.set()
    thread.join(10)
    assert result(outcome["frames"])["message"]["content"] == [{"type": "text", "text": "done"}], outcome
    stopping = time.monotonic()
    assert session.wait(15) == 0
    assert time.monotonic() - stopping < 10  # not its 30 s budget: the stream ended once drained
