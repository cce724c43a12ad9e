"""Remote CLI subagents through the whole stack, on real Docker (SERVER-SPEC §11).

The harness is tests/harness/fake-harness inside the sandbox image: it prints,
sleeps, floods, ignores SIGTERM or exits as its prompt says.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
import uuid
from pathlib import Path

import grpc
import pytest

from bae.common.protos import sandbox_pb2, sandbox_pb2_grpc
from testkit.docker_support import (
    containers_with,
    docker_client,
    ensure_harness_image,
    require_docker,
    stack_with_sandbox_hosts,
)
from testkit.live import at, result, rpc, terminal, types
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.docker]

RUN = f"test-subagents-{uuid.uuid4().hex[:8]}"
_stacks = itertools.count()
TOOL = "launch_subagent"


def declaration(image: str, **subagent) -> dict:
    return {
        "name": TOOL,
        "description": "launch a coding agent",
        "input_schema": {"type": "object"},
        "image": image,
        "subagents": [{"harness": "fake", "command_template": "fake-harness --model {model}", **subagent},
                      {"harness": "argv", "command_template": "fake-harness --model {model} {prompt}",
                       "prompt_via": "arg"}],
    }


def overrides(**env: str) -> dict[str, str]:
    return {"MOCK_LLM_TOKEN": "t0ken-for-tests", "BAE_SANDBOX_HOST_ID": f"{RUN}-{next(_stacks)}", **env}


@pytest.fixture(scope="module")
def image():
    require_docker()
    return ensure_harness_image()


@pytest.fixture(scope="module")
def shared(mock, tmp_path_factory, image):
    with stack_with_sandbox_hosts(tmp_path_factory.mktemp("subagents"), mock.base_url, RUN,
                       **overrides(BAE_MAX_SUBAGENTS_PER_SESSION="2")) as running:
        yield running


@pytest.fixture
def stack(shared, mock):
    mock.reset()
    return shared


class Driver:
    def __init__(self, stack, image: str, *, start_sandbox: bool = True, **subagent) -> None:
        self.stack = stack
        profile = stack.create_profile(f"p{time.monotonic_ns()}", available_sandboxes=[image])
        key = stack.create_key(profile["id"])["key"]
        opened = stack.open_session(key, subagent_tools=[declaration(image, **subagent)])
        self.sid, self.skey = opened["session_id"], opened["session_key"]
        assert self.ok("session.registerDriver") == {"registered": True}
        if start_sandbox:
            self.ok("session.startRemoteSandbox", {"image": image})

    def call(self, method: str, params: dict | None = None) -> list[dict]:
        return rpc(self.stack.client, self.sid, self.skey, method, params)

    def ok(self, method: str, params: dict | None = None) -> dict:
        return result(self.call(method, params))

    def send(self, text: str) -> dict:
        return self.ok("session.sendMessage", {"message": {"content": text}})

    def events(self) -> list[dict]:
        reply = self.stack.client.get(f"/api/v1/sessions/{self.sid}/events", params={"limit": 500},
                                      headers={"Authorization": f"Bearer {self.skey}"})
        return reply.json()["items"]

    def wait_for(self, event_type: str, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.events() if e["event_type"] == event_type]
            if found:
                return found[-1]
            time.sleep(0.1)
        raise AssertionError(f"no {event_type} within {timeout}s: {types(self.events())}")

    def close(self) -> None:
        reply = self.stack.client.delete(f"/api/v1/sessions/{self.sid}",
                                         headers={"Authorization": f"Bearer {self.skey}"})
        assert reply.status_code == 200, reply.text


def assert_stopped(driver: Driver, process: str) -> None:
    """Until no process of the session's sandbox runs `process` (10 s at most)."""
    [container] = containers_with(f"bae.session_id={driver.sid}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        processes = container.exec_run(["ps", "-o", "args"]).output.decode()
        if process not in processes:
            break
        time.sleep(0.2)
    assert process not in processes


def launch(driver: Driver, mock, prompt: str, *, harness: str = "fake", model: str = "m1") -> dict:
    """One turn in which the model launches a subagent; returns the tool result's JSON."""
    mock.enqueue(Reply.tool_use([("tu_launch", TOOL, {"harness": harness, "model": model, "prompt": prompt})]))
    mock.enqueue(Reply.text("launched"))
    outcome = driver.send("go")
    results = [e for e in outcome["events"] if e["event_type"] == "tool.result"]
    assert results[0]["payload"]["dispatch"] == "subagent"
    return {"outcome": outcome, "result": json.loads(results[0]["payload"]["content"][0]["text"]),
            "is_error": results[0]["payload"]["is_error"]}


def status(driver: Driver, mock, subagent_id: str | None = None) -> tuple[dict, list[list[str]]]:
    """One turn in which the model calls the status tool; (its result, the provider requests' tool names)."""
    before = len(mock.requests)
    mock.enqueue(Reply.tool_use([("tu_status", "remote_subagent_status",
                                  {"subagent_id": subagent_id} if subagent_id else {})]))
    mock.enqueue(Reply.text("noted"))
    outcome = driver.send("how are they?")
    reply = next(e for e in outcome["events"] if e["event_type"] == "tool.result")
    offered = [[t["name"] for t in request["body"].get("tools", [])] for request in mock.requests[before:]]
    return json.loads(reply["payload"]["content"][0]["text"]), offered


def test_a_launch_is_answered_at_once_and_completes_in_the_background(stack, mock, image):
    driver = Driver(stack, image)
    launched = launch(driver, mock, "sleep 1\nprint hello from the subagent")
    started = launched["result"]
    assert started["status"] == "started" and started["harness"] == "fake" and started["model"] == "m1"
    assert started["subagent_id"].startswith("sba_") and len(started["subagent_id"]) == 36
    assert types(launched["outcome"]["events"]) == [
        "client.message.send", "provider.request", "provider.response", "tool.call",
        "session.subagent.start", "session.subagent.running", "tool.result",
        "provider.request", "provider.response", "server.message.send",
    ]
    common = {"dispatch": "remote", "subagent_id": started["subagent_id"], "harness": "fake", "model": "m1",
              "detail": None}
    start = launched["outcome"]["events"][4]
    assert start["payload"] == common
    completed = driver.wait_for("session.subagent.completed")
    assert completed["payload"] == {**common, "exit_code": 0}
    assert completed["client_key_id"] == start["client_key_id"]
    assert "hello" not in json.dumps(completed)  # output lives only in the status result

    report, offered = status(driver, mock)
    # Offered while tracked; gone from the next call once the finished entry was reported.
    assert offered == [[TOOL, "remote_subagent_status"], [TOOL]]
    assert report == {"subagents": [{**{k: common[k] for k in ("subagent_id", "harness", "model", "detail")},
                                     "status": "completed", "exit_code": 0, "stdout": "hello from the subagent\n",
                                     "stderr": "", "truncated": False, "reason": None}]}
    again, _ = status(driver, mock, started["subagent_id"])
    assert again == {"error": "unknown subagent_id"}
    driver.close()


def test_prompt_by_argument_is_shell_quoted(stack, mock, image):
    driver = Driver(stack, image)
    started = launch(driver, mock, "print it's $HOME `id` ; done", harness="argv", model="m'2")["result"]
    driver.wait_for("session.subagent.completed")
    report, _ = status(driver, mock, started["subagent_id"])
    assert report["subagents"][0]["stdout"] == "it's $HOME `id` ; done\n"
    driver.close()


def test_failures_nonzero_exit_and_timeout(stack, mock, image):
    driver = Driver(stack, image, timeout_secs=1)
    launch(driver, mock, "stderr bad things\nexit 7")
    failed = driver.wait_for("session.subagent.failed")
    assert failed["payload"]["reason"] == "nonzero_exit" and failed["payload"]["exit_code"] == 7
    launch(driver, mock, "sleep 30")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        reasons = [e["payload"]["reason"] for e in driver.events() if e["event_type"] == "session.subagent.failed"]
        if "timeout" in reasons:
            break
        time.sleep(0.2)
    timed_out = [e for e in driver.events() if e["event_type"] == "session.subagent.failed"][-1]
    assert timed_out["payload"]["reason"] == "timeout" and timed_out["payload"]["exit_code"] is None
    report, _ = status(driver, mock)
    assert [(s["status"], s["exit_code"], s["stderr"]) for s in report["subagents"]] == [
        ("failed", 7, "bad things\n"), ("timed_out", None, "")]
    driver.close()


def test_a_missing_harness_executable_is_the_commands_own_failure(stack, mock, image):
    """The template runs under `sh -c` (§11.2), so a CLI missing from the image starts a shell that
    exits 127: a non-zero exit, not a spawn failure."""
    driver = Driver(stack, image, command_template="no-such-harness --model {model}")
    started = launch(driver, mock, "print x")["result"]
    failed = driver.wait_for("session.subagent.failed")
    assert failed["payload"] == {"dispatch": "remote", "subagent_id": started["subagent_id"], "harness": "fake",
                                 "model": "m1", "detail": None, "reason": "nonzero_exit", "exit_code": 127}
    report, _ = status(driver, mock, started["subagent_id"])
    assert report["subagents"][0]["stderr"].endswith("no-such-harness: not found\n")
    driver.close()


def test_a_command_the_host_cannot_start_is_a_spawn_failure(stack, mock, image):
    """spawn_failed (§11.2): the sandbox's container died under the session (an OOM kill, an operator's
    `docker kill`), so the session still holds its handle and the launch passes every check, but the
    sandbox host cannot start the command in it."""
    driver = Driver(stack, image)
    [container] = containers_with(f"bae.session_id={driver.sid}")
    container.kill()
    deadline = time.monotonic() + 20
    while containers_with(f"bae.session_id={driver.sid}"):  # the sandbox runs with --rm: gone once it ended
        assert time.monotonic() < deadline, "the killed sandbox was not removed"
        time.sleep(0.1)

    launched = launch(driver, mock, "print never", harness="argv", model="m2")
    started = launched["result"]
    assert launched["is_error"] is False
    assert started == {"subagent_id": started["subagent_id"], "harness": "argv", "model": "m2", "status": "started"}
    failed = driver.wait_for("session.subagent.failed")
    detail = f"no such sandbox: {container.id}"
    common = {"dispatch": "remote", "subagent_id": started["subagent_id"], "harness": "argv", "model": "m2"}
    assert failed["payload"] == {**common, "detail": detail, "reason": "spawn_failed", "exit_code": None}
    lifecycle = [e for e in driver.events() if e["event_type"].startswith("session.subagent.")]
    assert [(e["event_type"], e["payload"]) for e in lifecycle] == [
        ("session.subagent.start", {**common, "detail": None}),
        ("session.subagent.running", {**common, "detail": None}),
        ("session.subagent.failed", {**common, "detail": detail, "reason": "spawn_failed", "exit_code": None}),
    ]
    assert {e["client_key_id"] for e in lifecycle} == {launched["outcome"]["events"][0]["client_key_id"]}

    report, _ = status(driver, mock)
    entry = {"subagent_id": started["subagent_id"], "harness": "argv", "model": "m2"}
    assert report == {"subagents": [{**entry, "status": "failed", "exit_code": None, "stdout": "", "stderr": "",
                                     "truncated": False, "reason": "spawn_failed", "detail": detail}]}
    driver.close()


def test_without_timeout_secs_the_servers_subagent_timeout_applies(start_stack, mock, image):
    """No `timeout_secs` in the declaration: BAE_SUBAGENT_TIMEOUT bounds the subagent (§11.2)."""
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), **overrides(BAE_SUBAGENT_TIMEOUT="1"))
    driver = Driver(stack, image)
    assert "timeout_secs" not in declaration(image)["subagents"][0]
    launched = launch(driver, mock, "print begun\nsleep 30")
    started = launched["result"]
    failed = driver.wait_for("session.subagent.failed", timeout=20)
    assert failed["payload"] == {"dispatch": "remote", "subagent_id": started["subagent_id"], "harness": "fake",
                                 "model": "m1", "detail": None, "reason": "timeout", "exit_code": None}
    running = next(e for e in launched["outcome"]["events"] if e["event_type"] == "session.subagent.running")
    # Killed at the 1 s of the setting, not at the end of the harness's 30 s sleep.
    assert 1.0 <= at(failed) - at(running) < 20
    assert_stopped(driver, "sleep 30")
    report, _ = status(driver, mock, started["subagent_id"])
    assert [(s["status"], s["exit_code"], s["reason"], s["stdout"]) for s in report["subagents"]] == [
        ("timed_out", None, "timeout", "begun\n")]
    driver.close()


@pytest.mark.parametrize(
    "tool_input,error",
    [
        ({"harness": "fake", "model": "m"}, 'launch_subagent requires string "harness", "model", and "prompt"'),
        ({"harness": "nope", "model": "m", "prompt": "x"}, 'unknown harness "nope"'),
    ],
)
def test_refused_launches_are_error_results_without_lifecycle_events(stack, mock, image, tool_input, error):
    driver = Driver(stack, image)
    mock.enqueue(Reply.tool_use([("tu_1", TOOL, tool_input)]))
    mock.enqueue(Reply.text("ok"))
    events = driver.send("go")["events"]
    assert not [e for e in events if e["event_type"].startswith("session.subagent.")]
    reply = next(e for e in events if e["event_type"] == "tool.result")["payload"]
    assert reply["is_error"] is True
    assert reply["content"] == [{"type": "text", "text": json.dumps({"error": error}, separators=(",", ":"))}]
    driver.close()


def test_no_sandbox_and_image_mismatch_are_refused(stack, mock, image):
    idle = Driver(stack, image, start_sandbox=False)
    refused = launch(idle, mock, "print x")
    assert refused["is_error"] and refused["result"] == {
        "error": f"no remote sandbox is running for tool '{TOOL}'; call session.startRemoteSandbox first"}
    idle.close()

    other = f"bae-harness:{RUN}"
    client = docker_client()
    client.images.get(image).tag(other)
    try:
        profile = stack.create_profile(f"p{time.monotonic_ns()}", available_sandboxes=[image, other])
        key = stack.create_key(profile["id"])["key"]
        opened = stack.open_session(key, subagent_tools=[declaration(other)])
        driver = Driver.__new__(Driver)
        driver.stack, driver.sid, driver.skey = stack, opened["session_id"], opened["session_key"]
        driver.ok("session.registerDriver")
        driver.ok("session.startRemoteSandbox", {"image": image})
        mismatch = launch(driver, mock, "print x")
        assert mismatch["result"] == {"error": f'remote sandbox image mismatch: subagent declared "{other}" '
                                               f'but the running sandbox uses "{image}"'}
        driver.close()
    finally:
        client.images.remove(other)
        client.close()


def test_the_per_session_cap_counts_running_subagents(stack, mock, image):
    driver = Driver(stack, image)
    first = launch(driver, mock, "sleep 30")["result"]
    launch(driver, mock, "sleep 30")
    third = launch(driver, mock, "print x")
    assert third["is_error"] and third["result"] == {"error": "subagent limit reached (max 2 per session)"}
    assert driver.ok("session.cancelSubagent", {"subagent_id": first["subagent_id"]})["was_running"] is True
    assert launch(driver, mock, "print x")["result"]["status"] == "started"
    driver.close()


def test_cancel_kills_the_whole_process_tree(stack, mock, image):
    driver = Driver(stack, image)
    started = launch(driver, mock, "ignore-term\nsleep 300")["result"]
    time.sleep(0.5)
    reply = driver.ok("session.cancelSubagent", {"subagent_id": started["subagent_id"]})
    assert reply == {"cancelled": True, "subagent_id": started["subagent_id"], "was_running": True}
    cancelled = driver.wait_for("session.subagent.cancelled")
    assert cancelled["payload"]["reason"] == "explicit" and cancelled["payload"]["exit_code"] is None
    assert_stopped(driver, "sleep 300")
    again = driver.ok("session.cancelSubagent", {"subagent_id": started["subagent_id"]})
    assert again["was_running"] is False
    assert len([e for e in driver.events() if e["event_type"] == "session.subagent.cancelled"]) == 1
    report, _ = status(driver, mock)
    assert report["subagents"][0]["status"] == "cancelled" and report["subagents"][0]["reason"] == "explicit"
    gone = terminal(driver.call("session.cancelSubagent", {"subagent_id": started["subagent_id"]}))["error"]
    assert gone["code"] == -32014
    driver.close()


def test_cancel_kills_a_child_that_dropped_its_environment_and_session(stack, mock, image):
    """What the command started is killed however it hid: `env -i` drops the environment, setsid the
    process group and session, and the subshell's exit leaves it to PID 1."""
    driver = Driver(stack, image)
    loops = "spawn env -i sh -c 'while :; do sleep 1; done'\nspawn (setsid env -i sh -c 'while :; do sleep 2; done' &)"
    started = launch(driver, mock, f"{loops}\nsleep 300")["result"]
    [container] = containers_with(f"bae.session_id={driver.sid}")
    deadline = time.monotonic() + 10
    while (running := container.exec_run(["ps", "-o", "args"]).output.decode()).count("\nsh -c while :") < 2:
        assert time.monotonic() < deadline, running
        time.sleep(0.1)
    reply = driver.ok("session.cancelSubagent", {"subagent_id": started["subagent_id"]})
    assert reply["was_running"] is True
    assert_stopped(driver, "while :")
    assert_stopped(driver, "sleep 300")
    driver.close()


def test_output_is_capped_at_64_kib(stack, mock, image):
    driver = Driver(stack, image)
    started = launch(driver, mock, "flood 300000")["result"]
    driver.wait_for("session.subagent.completed")
    report, _ = status(driver, mock, started["subagent_id"])
    entry = report["subagents"][0]
    assert len(entry["stdout"].encode()) == 65_536 and entry["truncated"] is True
    driver.close()


def test_close_cancels_running_subagents_before_the_sandbox_stops(stack, mock, image):
    driver = Driver(stack, image)
    launch(driver, mock, "sleep 300")
    before = len(driver.events())
    driver.close()
    page = stack.admin.get(f"/admin/v1/sessions/{driver.sid}/events", params={"limit": 500}).json()["items"]
    tail = page[before:]
    assert types(tail) == ["session.close", "session.subagent.cancelled", "session.sandbox.stop",
                           "session.sandbox.stopped"]
    assert tail[1]["payload"]["reason"] == "session_close"


@pytest.mark.parametrize("host_silent", [False, True], ids=["host answering", "host silent at start-up"])
def test_a_subagent_survives_a_session_service_restart(start_stack, mock, image, host_silent):
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), **overrides())
    driver = Driver(stack, image)
    started = launch(driver, mock, "sleep 4\nprint after the restart")["result"]
    session = stack.stack.processes["session"]
    session.send_signal(signal.SIGKILL)
    session.wait(10)
    host = stack.stack.processes["sandbox"]
    if host_silent:  # the restarted service finds the host frozen; the next health poll sees it up
        host.send_signal(signal.SIGSTOP)
    try:
        stack.stack.restart("session")
    finally:
        host.send_signal(signal.SIGCONT)
    completed = driver.wait_for("session.subagent.completed", timeout=30)
    assert completed["payload"]["subagent_id"] == started["subagent_id"]
    driver.ok("session.registerDriver")
    report, _ = status(driver, mock, started["subagent_id"])
    assert report["subagents"][0]["stdout"] == "after the restart\n"
    # The sandbox was re-attached too: it still runs commands without a new start.
    assert driver.ok("session.execRemoteSandbox", {"command": "echo still mine"})["stdout"] == "still mine\n"
    kinds = types(driver.events())
    assert kinds.count("session.subagent.completed") == 1
    assert kinds.count("session.sandbox.start") == 1
    driver.close()


def test_orphan_sandboxes_are_stopped_at_start_up(start_stack, mock, image):
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), **overrides())
    address = stack.stack.settings.sandbox_grpc_addrs[0]
    with grpc.insecure_channel(address) as channel:
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        metadata = (("bae-internal-token", stack.stack.env["BAE_INTERNAL_TOKEN"]),)
        stub.AllowImages(sandbox_pb2.AllowImagesRequest(images=[image]), metadata=metadata, timeout=10)
        orphan = stub.Start(sandbox_pb2.StartRequest(session_id="ses_unknown", image=image),
                            metadata=metadata, timeout=30).sandbox_id
    assert containers_with("bae.session_id=ses_unknown")
    stack.stack.restart("session")
    deadline = time.monotonic() + 20
    while containers_with("bae.session_id=ses_unknown") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not containers_with("bae.session_id=ses_unknown"), f"orphan {orphan} still runs"


def wait_for_line(log: Path, text: str, start: int = 0, timeout: float = 20.0) -> None:
    """Until `text` appears in `log` past byte `start`."""
    deadline = time.monotonic() + timeout
    while text not in log.read_bytes()[start:].decode(errors="replace"):
        assert time.monotonic() < deadline, f"no {text!r} in {log.name} within {timeout}s"
        time.sleep(0.1)


def test_a_closed_sessions_sandbox_left_running_is_stopped_at_start_up(start_stack, mock, image):
    """A close whose sandbox stop failed (the host did not answer then) leaves the container running;
    the next start of the session service finds it on the host and stops it, its session being closed."""
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), **overrides())
    driver = Driver(stack, image)
    [container] = containers_with(f"bae.session_id={driver.sid}")
    host = stack.stack.processes["sandbox"]
    address = stack.stack.settings.sandbox_grpc_addrs[0]
    session_log = stack.tmp / "logs" / "session.log"
    before = len(driver.events())

    stopped_at = session_log.stat().st_size
    host.send_signal(signal.SIGSTOP)  # frozen: it answers nothing, health checks included
    try:
        # Once the session service has seen it down, the close's stop fails at once instead of timing out.
        wait_for_line(session_log, f"sandbox host {address} is down", stopped_at)
        driver.close()
    finally:
        host.send_signal(signal.SIGCONT)
    closing = stack.admin.get(f"/admin/v1/sessions/{driver.sid}/events", params={"limit": 500}).json()["items"]
    stop = {"image": image, "sandbox_id": container.id, "dispatch": "remote"}
    assert [(e["event_type"], e["payload"]) for e in closing[before:]] == [
        ("session.close", closing[before]["payload"]),
        ("session.sandbox.stop", {**stop, "reason": "session_close"}),
        ("session.sandbox.error", {**stop, "phase": "stop", "detail": "the sandbox host is unavailable",
                                   "unsandboxed": False}),
    ]
    wait_for_line(session_log, f"sandbox host {address} is up", stopped_at)
    container.reload()
    assert container.status == "running"  # nothing else will stop it: the host does not know the session closed

    restarted_at = session_log.stat().st_size
    stack.stack.restart("session")
    deadline = time.monotonic() + 20
    while containers_with(f"bae.session_id={driver.sid}"):
        assert time.monotonic() < deadline, f"the closed session's sandbox {container.id} still runs"
        time.sleep(0.2)
    wait_for_line(session_log, f"stopping sandbox {container.id} of closed session {driver.sid}", restarted_at)
    after = stack.admin.get(f"/admin/v1/sessions/{driver.sid}/events", params={"limit": 500}).json()["items"]
    assert after == closing  # a closed session's log is not written to


def test_a_close_is_not_held_by_a_frozen_sandbox_host(start_stack, mock, image):
    """DELETE while the sandbox host is frozen and not yet seen down: the sandbox stop cannot be
    answered, and its deadline (BAE_RPC_TIMEOUT) is the gateway's own for the DELETE. The close
    answers 200 well before it, with the session closed and its subagent cancelled; the stop goes
    on, and once the host runs again it stops the container and logs `stopped`, in the close's order."""
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), **overrides())
    driver = Driver(stack, image)
    started = launch(driver, mock, "sleep 300")["result"]
    [container] = containers_with(f"bae.session_id={driver.sid}")
    host = stack.stack.processes["sandbox"]
    before = len(driver.events())
    deadline = stack.stack.settings.rpc_timeout

    host.send_signal(signal.SIGSTOP)  # frozen: calls to it are sent and never answered
    try:
        began = time.monotonic()
        reply = stack.client.delete(f"/api/v1/sessions/{driver.sid}", headers={"Authorization": f"Bearer {driver.skey}"})
        took = time.monotonic() - began
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"session_id": driver.sid, "state": "closed"}
        assert took < deadline * 0.7, f"the close took {took:.1f}s of the {deadline:g}s deadline"
        answered = driver.events()[before:]
    finally:
        host.send_signal(signal.SIGCONT)

    stop = {"image": image, "sandbox_id": container.id, "dispatch": "remote"}
    cancelled = {"dispatch": "remote", "subagent_id": started["subagent_id"], "harness": "fake", "model": "m1",
                 "detail": None, "reason": "session_close", "exit_code": None}
    closing = [
        ("session.close", {"reason": "client_close"}),
        ("session.subagent.cancelled", cancelled),
        ("session.sandbox.stop", {**stop, "reason": "session_close"}),
    ]
    # At the answer the stop was still waiting for the host, so nothing came after its `stop` event.
    assert [(e["event_type"], e["payload"]) for e in answered] == closing

    # The host runs again and answers the stop it was sent: the container goes, and `stopped` ends the close.
    driver.wait_for("session.sandbox.stopped")
    give_up = time.monotonic() + 20
    while containers_with(f"bae.session_id={driver.sid}"):
        assert time.monotonic() < give_up, f"the closed session's sandbox {container.id} still runs"
        time.sleep(0.2)
    after = driver.events()[before:]
    assert [(e["event_type"], e["payload"]) for e in after] == [
        *closing, ("session.sandbox.stopped", {**stop, "reason": "session_close", "unsandboxed": False})]
    assert len({e["client_key_id"] for e in after}) == 1  # all the session creator's (O-7)


def test_a_stop_a_frozen_host_never_answers_fails_after_the_close_and_is_redone_at_start_up(start_stack, mock, image):
    """The host stays frozen past the stop's own deadline: the close still answered 200 at once, the
    stop then ends in `session.sandbox.error`, and the next start of the session service stops the
    container, writing nothing more to the closed session's log."""
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), **overrides())
    driver = Driver(stack, image)
    [container] = containers_with(f"bae.session_id={driver.sid}")
    host = stack.stack.processes["sandbox"]
    before = len(driver.events())
    deadline = stack.stack.settings.rpc_timeout

    host.send_signal(signal.SIGSTOP)
    try:
        driver.close()
        assert types(driver.events()[before:]) == ["session.close", "session.sandbox.stop"]
        driver.wait_for("session.sandbox.error", timeout=deadline + 10)
    finally:
        host.send_signal(signal.SIGCONT)
    closing = driver.events()[before:]
    stop = {"image": image, "sandbox_id": container.id, "dispatch": "remote"}
    assert [(e["event_type"], e["payload"]) for e in closing] == [
        ("session.close", {"reason": "client_close"}),
        ("session.sandbox.stop", {**stop, "reason": "session_close"}),
        ("session.sandbox.error", {**stop, "phase": "stop", "unsandboxed": False,
                                   "detail": f"the sandbox host did not answer within {deadline:g}s"}),
    ]
    container.reload()
    assert container.status == "running"

    stack.stack.restart("session")
    give_up = time.monotonic() + 20
    while containers_with(f"bae.session_id={driver.sid}"):
        assert time.monotonic() < give_up, f"the closed session's sandbox {container.id} still runs"
        time.sleep(0.2)
    assert driver.events()[before:] == closing
