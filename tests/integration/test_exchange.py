"""The gateway's calls to a session replica, through the gateway: a call past its deadline
is stopped on the replica too, and a replica told to stop answers the calls it took and exits
without waiting out its budget.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from bae.launcher.stack import grpc_serving
from testkit.live import new_session, rpc
from testkit.race_holds import RaceHolds
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"


@pytest.fixture
def holds():
    holds = RaceHolds()
    yield holds
    holds.close()


def held_registration(stack, holds, sid, skey):
    """A registerDriver call through the gateway, held on the replica; returns its thread, its
    outcome (filled when it ends) and the held connection."""
    holds.hold("session.registerDriver", sid)
    outcome: dict = {}

    def call():
        try:
            outcome["lines"] = rpc(stack.client, sid, skey, "session.registerDriver")
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    return thread, outcome, holds.wait_held()


def test_a_call_past_the_gateways_deadline_answers_504_and_is_stopped_on_the_replica(start_stack, mock, holds):
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                        BAE_TEST_HOLD_ADDR=holds.address, BAE_RPC_TIMEOUT="1")
    sid, skey, _ = new_session(stack)
    holds.hold("session.registerDriver", sid)
    started = time.monotonic()
    response = stack.client.post(
        f"/api/v1/sessions/{sid}/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver"},
        headers={"Authorization": f"Bearer {skey}"},
    )
    assert response.status_code == 504, response.text
    assert response.json()["type"].endswith("gateway_timeout")
    assert time.monotonic() - started < 5
    # The replica cancelled the call: the hold's connection is closed without an answer.
    held = holds.wait_held()
    held.settimeout(5)
    assert held.recv(16) == b""
    held.close()
    holds.hold("nothing", "")
    assert rpc(stack.client, sid, skey, "session.registerDriver")[0]["result"] == {"registered": True}


def test_a_replica_told_to_stop_answers_the_calls_it_took_and_exits_without_waiting_out_its_budget(
    start_stack, mock, holds
):
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                        BAE_TEST_HOLD_ADDR=holds.address, BAE_SHUTDOWN_TIMEOUT="30")
    sid, skey, _ = new_session(stack)
    thread, outcome, held = held_registration(stack, holds, sid, skey)
    session = stack.stack.processes["session"]
    session.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while grpc_serving(stack.stack.settings.session_grpc_addr):  # draining once it reports so
        assert time.monotonic() < deadline, "the session service did not start to drain"
        time.sleep(0.05)
    RaceHolds.release(held)
    thread.join(10)
    assert outcome.get("lines", [{}])[0].get("result") == {"registered": True}, outcome
    stopping = time.monotonic()
    assert session.wait(15) == 0
    assert time.monotonic() - stopping < 10  # not its 30 s budget: it stopped once its calls were answered
