"""End to end through docker-compose: the real images, talked to only through the published port.

Run by deploy/compose-test/run.sh (`make compose-test`), which builds the images
and sets the environment (testkit/compose.py). The tests run in file order and share one
deployment of docker-compose.yml (one session replica, SQLite); the last one tears
it down and checks nothing is left behind. test_replicas.py does the same for
docker-compose.replicas.yml.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import docker
import httpx
import pytest

pytestmark = pytest.mark.compose

if "BAE_E2E_PROJECT" not in os.environ:
    pytest.skip("run through `make compose-test`", allow_module_level=True)

from testkit.compose import IMAGE, STOP_SECONDS, Deployment, Project, progress, wait_until  # noqa: E402
from testkit.live import notifications, result, rpc, types  # noqa: E402

# A setting given only in the project's .env (run.sh does not set it) reaches the service that reads it.
BODY_LIMIT = 100_000
ENV_FILE = Path(tempfile.mkdtemp(prefix="bae-e2e-")) / ".env"
ENV_FILE.write_text(f"BAE_MAX_BODY_BYTES={BODY_LIMIT}\n")
PROJECT = Project(os.environ["BAE_E2E_PROJECT"], ["docker-compose.yml", "deploy/compose-test/docker-compose.test.yml"],
                  env_file=str(ENV_FILE))
GATEWAY_URL = f"http://{os.environ['BAE_PUBLISH_ADDR']}"
compose, containers, all_healthy = PROJECT.compose, PROJECT.containers, PROJECT.all_healthy


def baectl(*args: str) -> dict:
    return json.loads(compose("exec", "-T", "gateway", "baectl", *args, "--json").stdout)


@pytest.fixture(scope="module")
def stack(request):
    progress(f"docker-compose up ({PROJECT.name})")
    compose("down", "-v", "--remove-orphans", "-t", "5", check=False)  # leftovers of an interrupted run
    deployment = Deployment(GATEWAY_URL)
    try:
        compose("up", "-d")
        wait_until("every service healthy", lambda: all_healthy(
            {"gateway": 1, "session": 1, "runner": 1, "sandbox": 1, "mockllm": 1}))
        progress("stack healthy")
        yield deployment
    finally:
        if request.session.testsfailed:
            print(compose("logs", "--no-color", "--tail", "150", check=False).stdout, file=sys.stderr)
        compose("down", "-v", "--remove-orphans", "-t", STOP_SECONDS, check=False)
        deployment.close()
        shutil.rmtree(ENV_FILE.parent, ignore_errors=True)


def test_admin_cli_in_the_gateway_creates_a_profile_and_a_key(stack):
    profile = baectl("profiles", "create", "--name", "e2e", "--primary-provider", "mock",
                     "--allowed-tool", "get_time", "--sandbox-image", IMAGE)
    assert profile["name"] == "e2e" and profile["id"].startswith("pro_")
    key = baectl("keys", "create", "--name", "e2e", "--profile-id", profile["id"])
    assert key["key"].startswith("bae_") and key["profile_id"] == profile["id"]
    stack.profile, stack.key = profile, key["key"]
    # The admin port is loopback inside the gateway container: only the client port is published.
    (gateway,) = containers("gateway")
    assert {port for port, bindings in gateway.ports.items() if bindings} == {"8080/tcp"}


# Run inside the gateway container: one call to each internal service without the token, with a
# wrong one, and with the container's own; prints each call's outcome (status and details).
INTERNAL_PROBE = """
import asyncio, os, grpc
from bae.common.protos import admin_api_pb2, runner_pb2, runner_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc, session_pb2_grpc
calls = {
    "session:50051": (session_pb2_grpc.SessionServiceStub, "GetConfig", admin_api_pb2.AdminRequest()),
    "runner:50052": (runner_pb2_grpc.RunnerStub, "RunSteps", [runner_pb2.StepCalls(calls=[runner_pb2.StepCall(
        step_id=1, start=runner_pb2.StepStart(request=runner_pb2.StepRequest(session_id="ses_x")))])]),
    "sandbox:50053": (sandbox_pb2_grpc.SandboxStub, "List", sandbox_pb2.ListRequest()),
}
async def outcome(address, stub, method, request, token):
    metadata = () if token is None else (("bae-internal-token", token),)
    async with grpc.aio.insecure_channel(address) as channel:
        call = getattr(stub(channel), method)(request, metadata=metadata, timeout=10)
        try:
            if hasattr(call, "__aiter__"):
                async for _ in call:
                    pass
            else:
                await call
        except grpc.aio.AioRpcError as error:
            return f"{error.code().name}: {error.details()}"
    return "OK"
async def main():
    for address, (stub, method, request) in calls.items():
        for token in (None, "x" * 64, os.environ["BAE_INTERNAL_TOKEN"]):
            print(address, "|", await outcome(address, stub, method, request, token))
asyncio.run(main())
"""
REFUSED = "UNAUTHENTICATED: missing or invalid internal token"


def test_a_setting_in_the_env_file_reaches_its_service(stack):
    response = stack.client.post("/api/v1/sessions", content=b" " * (BODY_LIMIT + 1),
                                 headers={"Content-Type": "application/json"})
    assert response.status_code == 413, response.text
    assert response.json()["detail"] == f"request body exceeds the limit of {BODY_LIMIT} bytes (BAE_MAX_BODY_BYTES)"


def test_internal_services_refuse_calls_without_the_token(stack):
    probed = compose("exec", "-T", "gateway", "python", "-c", INTERNAL_PROBE).stdout.splitlines()
    outcomes: dict[str, list[str]] = {}
    for line in probed:
        address, _, outcome = line.partition(" | ")
        outcomes.setdefault(address, []).append(outcome)
    assert set(outcomes) == {"session:50051", "runner:50052", "sandbox:50053"}, probed
    for address, (without, wrong, right) in outcomes.items():
        assert (without, wrong) == (REFUSED, REFUSED), address
        assert right != REFUSED, address
    # The token is no admin key: the session service still asks for one.
    assert outcomes["session:50051"][2] == "UNAUTHENTICATED: missing Authorization header"


def test_text_turn(stack):
    sid, skey = stack.open_session()
    stack.script({"text": "It is noon."})
    frames = stack.send(sid, skey, "What time is it?")
    outcome = result(frames)
    assert outcome["message"] == {"role": "assistant", "content": [{"type": "text", "text": "It is noon."}]}
    assert types(outcome["events"]) == [
        "client.message.send", "provider.request", "provider.response", "server.message.send",
    ]
    assert types(notifications(frames)) == ["provider.request", "provider.response", "server.message.send"]
    sent = stack.mock.get("/_mock/requests").json()[-1]
    assert sent["headers"]["x-api-key"] == os.environ["MOCK_LLM_TOKEN"]
    assert os.environ["MOCK_LLM_TOKEN"] not in json.dumps(stack.events(sid, skey))


def test_client_tool_round_trip(stack):
    sid, skey = stack.open_session()
    stack.script({"tool_use": [["tu_1", "get_time", {}]]}, {"text": "Noon."})
    first = result(stack.send(sid, skey, "time?"))
    assert first["message"]["content"] == [
        {"type": "tool_use", "id": "tu_1", "name": "get_time", "input": {}, "dispatch": "client"}
    ]
    second = result(stack.send(sid, skey, [{"type": "tool_result", "tool_use_id": "tu_1", "content": "12:00"}]))
    assert types(second["events"]) == [
        "client.message.send", "tool.result", "provider.request", "provider.response", "server.message.send",
    ]
    assert second["message"]["content"] == [{"type": "text", "text": "Noon."}]


def test_remote_sandbox_auto_tool_then_session_restart_keeps_every_event(stack):
    sid, skey = stack.open_session()
    started = result(rpc(stack.client, sid, skey, "session.startRemoteSandbox", {"image": IMAGE}))
    assert started["image"] == IMAGE
    stack.script({"tool_use": [["tu_1", "sh", {"command": "echo hi from $(hostname)"}]]}, {"text": "done"})
    outcome = result(stack.send(sid, skey, "run it"))
    assert types(outcome["events"]) == [
        "client.message.send", "provider.request", "provider.response", "tool.call", "sandbox.request",
        "sandbox.response", "tool.result", "provider.request", "provider.response", "server.message.send",
    ]
    rendered = outcome["events"][6]["payload"]
    assert rendered["is_error"] is False
    assert rendered["content"][0]["text"].startswith("hi from ")
    stack.sandbox_host(sid)  # exactly one container carries the session's label

    before = stack.events(sid, skey)
    progress("restarting the session container")
    compose("restart", "-t", STOP_SECONDS, "session")
    wait_until("session healthy again", lambda: all_healthy({"session": 1}))
    after = wait_until("the gateway reaching the restarted session", lambda: _events_or_none(stack, sid, skey))
    assert after == before  # nothing lost, nothing added
    # The sandbox outlived the restart on its host, and the restarted service took it back:
    # the driver registers again (live state is memory) and runs a command in the same container.
    container = stack.sandbox_host(sid)
    result(rpc(stack.client, sid, skey, "session.registerDriver"))
    ran = result(rpc(stack.client, sid, skey, "session.execRemoteSandbox", {"command": "hostname"}))
    assert ran["stdout"].strip() == rendered["content"][0]["text"].removeprefix("hi from ").strip()
    assert stack.sandbox_host(sid) == container
    closed = stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"})
    assert closed.status_code == 200, closed.text
    assert docker.from_env().containers.list(all=True, filters={"label": f"bae.session_id={sid}"}) == []


def _events_or_none(stack, sid: str, skey: str) -> list[dict] | None:
    try:
        return stack.events(sid, skey)
    except (AssertionError, httpx.HTTPError):
        return None


def test_scaled_sandbox_hosts_share_the_placements(stack):
    progress("scaling sandbox to 2")
    compose("up", "-d", "--no-recreate", "--scale", "sandbox=2")
    wait_until("two healthy sandbox replicas", lambda: all_healthy({"sandbox": 2}))
    replicas = {c.id[:12] for c in containers("sandbox")}

    def placed_on_both() -> set[str] | None:
        # The session service re-resolves `sandbox` every few seconds; a new host,
        # running nothing yet, is the least loaded and gets the next sandbox.
        sid, skey = stack.open_session()
        result(rpc(stack.client, sid, skey, "session.startRemoteSandbox", {"image": IMAGE}))
        hosts = {stack.sandbox_host(s) for s in stack.session_ids if _has_sandbox(s)}
        return hosts if len(hosts) == 2 else None

    hosts = wait_until("sandboxes placed on both replicas", placed_on_both, timeout=60, every=2)
    # Host ids default to `<container hostname>-<listen address>`: one per replica.
    assert {host.split("-")[0] for host in hosts} == replicas


def _has_sandbox(sid: str) -> bool:
    return bool(docker.from_env().containers.list(filters={"label": f"bae.session_id={sid}"}))


def test_down_finishes_the_turn_in_flight_and_leaves_nothing_behind(stack):
    sid, skey = stack.open_session()
    result(rpc(stack.client, sid, skey, "session.startRemoteSandbox", {"image": IMAGE}))
    stack.script({"hang": 4}, {"text": "unused"})
    received = len(stack.mock.get("/_mock/requests").json())
    frames: list[dict] = []
    turn = threading.Thread(target=lambda: frames.extend(stack.send(sid, skey, "slow one")))
    turn.start()
    wait_until("the slow provider call to start",
               lambda: len(stack.mock.get("/_mock/requests").json()) > received, timeout=20, every=0.2)
    progress("docker-compose down with a turn in flight")
    compose("down", "-v", "--remove-orphans", "-t", STOP_SECONDS)
    turn.join(30)
    assert not turn.is_alive()
    assert result(frames)["message"]["content"] == [{"type": "text", "text": "ok"}]  # the hang's answer
    assert containers(all=True) == []
    leftover = [c for s in stack.session_ids for c in docker.from_env().containers.list(
        all=True, filters={"label": f"bae.session_id={s}"})]
    assert leftover == []
    assert PROJECT.volumes() == set()
