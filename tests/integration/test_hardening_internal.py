"""Internal details stay inside when a service fails: no address, no gRPC text, in what a client sees
(a session service killed, a sandbox host's refusals, an answer too large for the internal plane)."""

from __future__ import annotations

import json
import logging
import uuid

import pytest

from bae.common.errors import BaeError
from bae.services.session.engine.ports import SandboxHandle
from bae.services.session.remote.sandbox_pool import SandboxPool
from testkit.docker_support import TEST_IMAGE, SandboxHostProcess, require_docker
from testkit.live import new_session, register, result, send, session_state, terminal
from testkit.mockllm import Reply
from testkit.problems import assert_problem
from testkit.processes import TEST_PLANE
from testkit.stack import launch_stack, mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.docker]


# --- internal details stay inside ----------------------------------------------------------

def test_a_session_service_outage_names_no_address(tmp_path):
    running = launch_stack(tmp_path)
    try:
        address = running.stack.settings.session_grpc_addr
        running.stack.processes["session"].kill()
        running.stack.processes["session"].wait(10)
        response = running.client.get("/api/v1/sessions/ses_x/events", headers={"Authorization": "Bearer x"})
        problem = assert_problem(response, 503, "service_unavailable")
        assert address not in problem["detail"] and address.rpartition(":")[2] not in problem["detail"]
        assert problem["detail"] == "the session service is unavailable; try again shortly"
        assert address in (tmp_path / "logs" / "gateway.log").read_text()
    finally:
        running.close()


async def test_grpc_failure_text_never_becomes_a_sandbox_error_detail(caplog):
    # The session service's real sandbox pool against a real sandbox host: a call gRPC itself
    # refuses ("Sent message larger than max …") yields a plain detail, and the text goes to the log.
    require_docker()
    host = SandboxHostProcess(f"test-hardening-{uuid.uuid4().hex[:8]}")
    try:
        host.wait_serving()
        pool = SandboxPool([host.address], rpc_timeout=5, plane=TEST_PLANE)
        handle = SandboxHandle(host=host.address, sandbox_id="0" * 64, image=TEST_IMAGE)
        with caplog.at_level(logging.WARNING, logger="bae.session.sandboxes"):
            with pytest.raises(BaeError) as caught:
                await pool.exec(handle, "x" * (65 * 1024 * 1024))
            assert caught.value.detail == "the sandbox call exceeded a size limit"
            with pytest.raises(BaeError) as caught:
                await pool.exec(handle, "true")
            assert caught.value.detail == "no such sandbox: " + "0" * 64  # the host's own verdicts pass
            host.kill()
            with pytest.raises(BaeError) as caught:
                await pool.exec(handle, "true")
            assert caught.value.detail == "the sandbox host is unavailable"
        assert "larger than max" in caplog.text and host.address in caplog.text
        await pool.close()
    finally:
        host.stop()


def test_an_answer_too_large_for_the_internal_plane_reaches_no_one_as_grpc_text(start_stack, mock):
    # The gateway path to gRPC's own size error: a client's sandbox command is capped by the body
    # limit (48 MiB at most) and a command's output by the host (16 MiB), both under the plane's
    # 64 MiB messages, but a provider may answer more than that. The runner cannot send it on;
    # the client gets the spec's plain loop failure, the log gets gRPC's text.
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN="t0ken-for-tests")
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.enqueue(Reply.text("x" * (65 * 1024 * 1024)))
    frames = send(stack, sid, skey, "write a lot")
    assert terminal(frames)["error"] == {"code": -32000, "message": "session loop failed"}
    events = stack.client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200},
                              headers={"Authorization": f"Bearer {skey}"}).json()["items"]
    assert [event["event_type"] for event in events] == [
        "session.open", "session.driver.register", "client.message.send", "provider.request",
    ]
    seen = json.dumps(frames) + json.dumps(events)
    runner = stack.stack.settings.runner_grpc_addr
    assert "larger than max" not in seen and "RESOURCE_EXHAUSTED" not in seen and runner not in seen
    logs = "".join(log.read_text() for log in (stack.tmp / "logs").glob("*.log"))
    assert "Sent message larger than max" in logs
    assert session_state(stack, sid) == "open"
    mock.enqueue(Reply.text("smaller"))
    assert result(send(stack, sid, skey, "less, please"))["message"]["content"] == [{"type": "text", "text": "smaller"}]


# --- secrets stay inside -------------------------------------------------------------------

def test_a_provider_error_that_echoes_part_of_its_key_shows_none_of_it(start_stack, mock):
    # The provider's 401 repeats the first 20 characters of the key it was sent; whatever reaches
    # the client, the events or a log holds no 8 characters of it in a row.
    key = "sk-mock-SECRET-9f3Kq2Zx7Lw4Vb8Nc1Rt6Hy"
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=key)
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    error = {"type": "error", "error": {"type": "authentication_error", "message": f"invalid x-api-key: {key[:20]}"}}
    mock.enqueue(Reply.error(401, json.dumps(error)))
    frames = send(stack, sid, skey, "hello")
    assert result(frames)["events"][-1]["payload"] == {"reason": "all_providers_failed", "attempts": 1}
    assert mock.requests[-1]["headers"]["x-api-key"] == key
    events = stack.client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200},
                              headers={"Authorization": f"Bearer {skey}"}).json()["items"]
    [failed] = [event for event in events if event["event_type"] == "provider.response"]
    assert json.loads(failed["payload"]["body"])["error"]["message"] == "invalid x-api-key: ••••••••"
    logs = "".join(log.read_text() for log in (stack.tmp / "logs").glob("*.log"))
    seen = json.dumps(frames, ensure_ascii=False) + json.dumps(events, ensure_ascii=False) + logs
    assert [key[start:start + 8] for start in range(len(key) - 7) if key[start:start + 8] in seen] == []
