"""Remote and local sandboxes through the whole stack, against a real Docker daemon."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from testkit.docker_support import (
    TEST_IMAGE,
    SandboxHostProcess,
    docker_client,
    docker_skip_reason,
    require_docker,
    sandboxes_of_hosts,
    stack_with_sandbox_hosts,
)
from testkit.live import rpc, terminal, types
from testkit.mockllm import Reply
from testkit.ports import free_port
from testkit.sandboxes import Driver, typed_payloads, wait_provisioned
from testkit.stack import mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.docker]

# Every sandbox host started here has an id with this prefix, so this module's containers are findable.
RUN = f"test-live-sandbox-{uuid.uuid4().hex[:8]}"
_stacks = itertools.count()
MISSING_IMAGE = "bae-no-such-image:1"
SHELL = {
    "name": "sh",
    "description": "run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
NOT_RUNNING = {"code": -32013, "message": "sandbox_not_running: no remote sandbox is running for this session"}
NO_SANDBOX_FOR_SH = "no remote sandbox is running for tool 'sh'; call session.startRemoteSandbox first"


@pytest.fixture(autouse=True)
def no_container_outlives_the_test():
    """After each test: its own stacks have stopped and its sessions on the shared one are closed,
    so no host of this module may still hold a container."""
    yield
    if docker_skip_reason() is not None:
        return
    left = sandboxes_of_hosts(RUN)
    for container in left:
        container.remove(force=True)
    assert [c.labels for c in left] == [], "sandbox containers outlived their stack"


@pytest.fixture
def other_image():
    """TEST_IMAGE under a second name, for a second profile's allowlist."""
    require_docker()
    name = f"bae-busybox:{RUN}"
    client = docker_client()
    try:
        client.images.get(TEST_IMAGE).tag(name)
        yield name
        client.images.remove(name)
    finally:
        client.close()


def sandbox_stack(start_stack, mock, **env):
    """A stack of the test's own, for tests that stop or replace parts of it."""
    mock.reset()
    return start_stack(config_toml=mock_provider_toml(mock.base_url), **stack_overrides(), **env)


def stack_overrides() -> dict[str, str]:
    return {"MOCK_LLM_TOKEN": "t0ken-for-tests", "BAE_SANDBOX_HOST_ID": f"{RUN}-{next(_stacks)}"}


@pytest.fixture(scope="module")
def shared(mock, tmp_path_factory):
    """One stack for the tests that only add profiles and sessions: a stack start costs seconds."""
    tmp = tmp_path_factory.mktemp("sandbox-stack")
    with stack_with_sandbox_hosts(tmp, mock.base_url, RUN, **stack_overrides()) as running:
        yield running


@pytest.fixture
def stack(shared, mock):
    mock.reset()
    return shared


def test_every_sandbox_method_requires_a_registered_driver(stack):
    driver = Driver(stack, stack.create_profile("gate", available_sandboxes=[TEST_IMAGE]))
    calls = {
        "session.startRemoteSandbox": {"image": TEST_IMAGE},
        "session.stopRemoteSandbox": {},
        "session.execRemoteSandbox": {"command": "true"},
        "session.reportLocalSandbox": {"state": "running", "image": TEST_IMAGE},
    }
    for method, params in calls.items():
        assert driver.error(method, params) == {"code": -32001, "message": f"call session.registerDriver before {method}"}
    assert not any(t.startswith("session.sandbox.") for t in types(driver.events()))


def test_provisioning_status_and_the_available_notification(stack):
    require_docker()
    with_images = stack.create_profile("with", available_sandboxes=[MISSING_IMAGE, TEST_IMAGE])
    without = stack.create_profile("without")

    items = wait_provisioned(stack)
    ids = [item["profile_id"] for item in items]
    assert ids == sorted(ids) and with_images["id"] in ids and without["id"] not in ids
    available, failed = items[ids.index(with_images["id"])]["images"]  # sorted by name
    assert available == {"name": TEST_IMAGE, "status": "available"}
    assert set(failed) == {"name", "status", "detail"}
    assert (failed["name"], failed["status"]) == (MISSING_IMAGE, "error")
    assert failed["detail"].startswith(f'cannot pull image "{MISSING_IMAGE}": ')

    driver = Driver(stack, with_images).register()
    events = driver.events()
    assert types(events)[-2:] == ["session.driver.register", "session.sandbox.available"]
    # In the profile's declared order, each with the status the admin view shows.
    assert events[-1]["payload"] == {"images": [failed, available]}

    bare = Driver(stack, without).register()
    assert types(bare.events())[-1] == "session.driver.register"
    assert "session.sandbox.available" not in types(bare.events())


def test_profiles_see_and_start_only_their_own_images(stack, other_image):
    profile_a = stack.create_profile("a", available_sandboxes=[TEST_IMAGE])
    profile_b = stack.create_profile("b", available_sandboxes=[other_image])
    wait_provisioned(stack)

    for profile, own, foreign in ((profile_a, TEST_IMAGE, other_image), (profile_b, other_image, TEST_IMAGE)):
        driver = Driver(stack, profile).register()
        listed = driver.events()[-1]
        assert listed["event_type"] == "session.sandbox.available"
        assert listed["payload"] == {"images": [{"name": own, "status": "available"}]}
        before = len(driver.events())

        assert driver.error("session.startRemoteSandbox", {"image": foreign}) == {
            "code": -32011,
            "message": f'sandbox_image_not_allowed: image "{foreign}" is not in this session profile\'s available_sandboxes',
        }
        assert driver.error("session.startRemoteSandbox", {"image": " "}) == {
            "code": -32602, "message": 'Invalid params: missing "image"',
        }
        assert driver.events_after(before) == []  # refused before the lifecycle began
        assert driver.containers() == []  # and no container was started

        started = driver.ok("session.startRemoteSandbox", {"image": own})
        (container,) = driver.containers()
        assert container.id == started["sandbox_id"]
        assert container.attrs["Config"]["Image"] == own
        driver.close()
        assert driver.containers() == []


def test_remote_lifecycle_events_results_and_refusals(stack):
    require_docker()
    driver = Driver(stack, stack.create_profile("life", available_sandboxes=[TEST_IMAGE])).register()
    assert driver.error("session.stopRemoteSandbox") == NOT_RUNNING
    assert driver.error("session.execRemoteSandbox", {"command": "true"}) == NOT_RUNNING
    before = len(driver.events())

    started = driver.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})
    sandbox_id = started["sandbox_id"]
    events = driver.events_after(before)
    assert typed_payloads(events) == [
        ("session.sandbox.start", {"image": TEST_IMAGE, "dispatch": "remote"}),
        ("session.sandbox.running",
         {"image": TEST_IMAGE, "sandbox_id": sandbox_id, "dispatch": "remote", "unsandboxed": False}),
    ]
    assert started == {"sandbox_id": sandbox_id, "image": TEST_IMAGE, "started_at": events[1]["created_at"]}
    (container,) = driver.containers()
    assert container.id == sandbox_id and container.status == "running"

    assert driver.error("session.startRemoteSandbox", {"image": TEST_IMAGE}) == {
        "code": -32000,
        "message": "a remote sandbox is already running for this session; call session.stopRemoteSandbox first",
    }
    assert driver.ok("session.execRemoteSandbox", {"command": "echo out; echo err >&2; exit 3"}) == {
        "stdout": "out\n", "stderr": "err\n", "exit_code": 3,
    }
    assert driver.ok("session.execRemoteSandbox", {"command": "echo $((6 * 7)) > /tmp/x; cat /tmp/x"}) == {
        "stdout": "42\n", "stderr": "", "exit_code": 0,
    }
    assert driver.error("session.execRemoteSandbox", {}) == {"code": -32602, "message": 'Invalid params: missing "command"'}
    assert len(driver.events()) == before + 2  # execs are utility calls: no events

    stopped = driver.ok("session.stopRemoteSandbox")
    assert stopped == {"stopped": True, "image": TEST_IMAGE, "sandbox_id": sandbox_id}
    stop = {"image": TEST_IMAGE, "sandbox_id": sandbox_id, "reason": "explicit", "dispatch": "remote"}
    assert typed_payloads(driver.events_after(before + 2)) == [
        ("session.sandbox.stop", stop),
        ("session.sandbox.stopped", {**stop, "unsandboxed": False}),
    ]
    assert driver.containers() == []
    assert driver.error("session.stopRemoteSandbox") == NOT_RUNNING
    assert driver.error("session.execRemoteSandbox", {"command": "true"}) == NOT_RUNNING


def test_auto_dispatch_renders_output_and_close_stops_the_sandbox(stack, mock):
    require_docker()
    profile = stack.create_profile("auto", available_sandboxes=[TEST_IMAGE])
    driver = Driver(stack, profile, sandbox_tools=[SHELL]).register()
    sandbox_id = driver.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})["sandbox_id"]

    mock.enqueue(
        Reply.tool_use([("tu_1", "sh", {"command": "echo hi; echo oops >&2; exit 2"}), ("tu_2", "sh", {"cmd": "ls"})]),
        Reply.text("done"),
    )
    outcome = driver.ok("session.sendMessage", {"message": {"content": "run it"}})
    assert outcome["message"] == {"role": "assistant", "content": [{"type": "text", "text": "done"}]}
    assert types(outcome["events"]) == [
        "client.message.send", "provider.request", "provider.response", "tool.call", "tool.call",
        "sandbox.request", "sandbox.response", "tool.result",
        "sandbox.request", "sandbox.response", "tool.result",
        "provider.request", "provider.response", "server.message.send",
    ]
    dispatched = typed_payloads(outcome["events"][5:11])
    rendered = "hi\n[stderr]\noops\n[exit_code: 2]"
    missing = "sandbox tool 'sh' input is missing the required string \"command\""
    assert dispatched == [
        ("sandbox.request", {"tool": "sh", "input": {"command": "echo hi; echo oops >&2; exit 2"},
                             "command": "echo hi; echo oops >&2; exit 2"}),
        ("sandbox.response", {"sandbox_id": sandbox_id, "ok": False,
                              "result": {"stdout": "hi\n", "stderr": "oops\n", "exit_code": 2}}),
        ("tool.result", {"tool_use_id": "tu_1", "dispatch": "sandbox", "server_name": None, "is_error": True,
                         "content": [{"type": "text", "text": rendered}]}),
        ("sandbox.request", {"tool": "sh", "input": {"cmd": "ls"}, "command": None}),
        ("sandbox.response", {"sandbox_id": None, "ok": False, "error": missing}),
        ("tool.result", {"tool_use_id": "tu_2", "dispatch": "sandbox", "server_name": None, "is_error": True,
                         "content": [{"type": "text", "text": f"sandbox error: {missing}"}]}),
    ]
    answered = mock.requests[-1]["body"]["messages"][-1]["content"]
    assert [(block["tool_use_id"], block["is_error"]) for block in answered] == [("tu_1", True), ("tu_2", True)]
    assert answered[0]["content"] == [{"type": "text", "text": rendered}]

    assert len(driver.containers()) == 1
    driver.close()
    assert driver.containers() == []
    stop = {"image": TEST_IMAGE, "sandbox_id": sandbox_id, "reason": "session_close", "dispatch": "remote"}
    closing = driver.events()[-3:]
    assert types(closing) == ["session.close", "session.sandbox.stop", "session.sandbox.stopped"]
    assert typed_payloads(closing[1:]) == [("session.sandbox.stop", stop), ("session.sandbox.stopped", {**stop, "unsandboxed": False})]


def test_a_subscriber_sees_the_close_and_the_sandbox_stop_before_its_stream_ends(stack):
    # §14 item 13: session.close, session.sandbox.stop, session.sandbox.stopped; subscriber streams then end.
    require_docker()
    profile = stack.create_profile("watched", available_sandboxes=[TEST_IMAGE])
    driver = Driver(stack, profile).register()
    sandbox_id = driver.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})["sandbox_id"]
    seen: list[dict] = []
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe", "params": {}}

    def watch() -> None:
        with httpx.Client(base_url=stack.stack.client_url, timeout=60) as client:
            headers = {"Authorization": f"Bearer {driver.skey}"}
            with client.stream("POST", f"/api/v1/sessions/{driver.sid}/rpc", json=body, headers=headers) as reply:
                for line in reply.iter_lines():
                    frame = json.loads(line)
                    if frame.get("method") == "session.event":
                        seen.append(frame["params"])

    with ThreadPoolExecutor(1) as pool:
        watching = pool.submit(watch)
        # A marker event the subscription must see: from then on it is attached.
        marker = {"state": "start", "subagent_id": "marker", "harness": "h", "model": "m"}
        deadline = time.monotonic() + 30
        while not any(event["event_type"] == "session.subagent.start" for event in list(seen)):
            assert time.monotonic() < deadline, "the subscription never saw the marker"
            driver.ok("session.reportLocalSubagent", marker)
            time.sleep(0.2)
        driver.close()
        watching.result(timeout=30)  # the stream ends after the close
    closing = [event for event in seen if event["event_type"].startswith(("session.close", "session.sandbox"))]
    stop = {"image": TEST_IMAGE, "sandbox_id": sandbox_id, "reason": "session_close", "dispatch": "remote"}
    assert typed_payloads(closing) == [
        ("session.close", {"reason": "client_close"}),
        ("session.sandbox.stop", stop),
        ("session.sandbox.stopped", {**stop, "unsandboxed": False}),
    ]
    assert [event["id"] for event in closing] == [event["id"] for event in driver.events()[-3:]]


def test_auto_dispatch_without_a_sandbox_is_an_error_result(stack, mock):
    driver = Driver(stack, stack.create_profile("nosbx", available_sandboxes=[TEST_IMAGE]), sandbox_tools=[SHELL])
    driver.register()
    mock.enqueue(Reply.tool_use([("tu_1", "sh", {"command": "echo hi"})]), Reply.text("no sandbox"))
    outcome = driver.ok("session.sendMessage", {"message": {"content": "run it"}})
    assert types(outcome["events"]) == [
        "client.message.send", "provider.request", "provider.response", "tool.call", "sandbox.request",
        "sandbox.response", "tool.result", "provider.request", "provider.response", "server.message.send",
    ]
    assert typed_payloads(outcome["events"][4:7]) == [
        ("sandbox.request", {"tool": "sh", "input": {"command": "echo hi"}, "command": "echo hi"}),
        ("sandbox.response", {"sandbox_id": None, "ok": False, "error": NO_SANDBOX_FOR_SH}),
        ("tool.result", {"tool_use_id": "tu_1", "dispatch": "sandbox", "server_name": None, "is_error": True,
                         "content": [{"type": "text", "text": f"sandbox error: {NO_SANDBOX_FOR_SH}"}]}),
    ]


def test_manual_dispatch_round_trip(stack, mock):
    require_docker()
    profile = stack.create_profile("manual", allowed_tools=["sh"], available_sandboxes=[TEST_IMAGE])
    driver = Driver(stack, profile, tools=[SHELL]).register()
    driver.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})

    mock.enqueue(Reply.tool_use([("tu_1", "sh", {"command": "echo manual; exit 1"})]), Reply.text("seen it"))
    paused = driver.ok("session.sendMessage", {"message": {"content": "run it yourself"}})
    assert paused["message"]["content"] == [
        {"type": "tool_use", "id": "tu_1", "name": "sh", "input": {"command": "echo manual; exit 1"}, "dispatch": "client"}
    ]
    assert types(paused["events"]) == [
        "client.message.send", "provider.request", "provider.response", "tool.call", "server.message.send",
    ]
    ran = driver.ok("session.execRemoteSandbox", {"command": "echo manual; exit 1"})
    assert ran == {"stdout": "manual\n", "stderr": "", "exit_code": 1}

    answer = {"type": "tool_result", "tool_use_id": "tu_1", "content": "manual\n[exit_code: 1]", "is_error": True}
    resumed = driver.ok("session.sendMessage", {"message": {"role": "user", "content": [answer]}})
    assert resumed["message"]["content"] == [{"type": "text", "text": "seen it"}]
    assert types(resumed["events"]) == [
        "client.message.send", "tool.result", "provider.request", "provider.response", "server.message.send",
    ]
    assert "sandbox.request" not in types(driver.events())  # the server never dispatched it
    (sent,) = mock.requests[-1]["body"]["messages"][-1]["content"]
    assert (sent["tool_use_id"], sent["is_error"]) == ("tu_1", True)
    assert "manual\n[exit_code: 1]" in str(sent["content"])
    driver.close()


def test_report_local_sandbox_maps_states_without_an_allowlist(stack):
    driver = Driver(stack, stack.create_profile("local")).register()  # declares no images at all
    actor = driver.events()[-1]["client_key_id"]
    before = len(driver.events())

    invalid = {
        "state": ({"state": "paused", "image": "x:1"}, 'Invalid params: "state" must be "running", "stopped", or "error"'),
        "no state": ({"image": "x:1"}, 'Invalid params: "state" must be "running", "stopped", or "error"'),
        "no image": ({"state": "running"}, 'Invalid params: missing "image"'),
        "image type": ({"state": "running", "image": 5}, 'Invalid params: "image" must be a string or null'),
        "unsandboxed type": ({"state": "running", "image": "x:1", "unsandboxed": "yes"},
                             'Invalid params: "unsandboxed" must be a boolean'),
        "unsandboxed image": ({"state": "running", "image": "x:1", "unsandboxed": True},
                              'Invalid params: "image" must be null when "unsandboxed" is true'),
    }
    for case, (params, message) in invalid.items():
        assert driver.error("session.reportLocalSandbox", params) == {"code": -32602, "message": message}, case
    assert driver.events_after(before) == []

    reports = [
        {"state": "running", "image": "never-declared:7", "container_id": "c0ffee"},
        {"state": "error", "image": "never-declared:7", "container_id": "c0ffee", "detail": "oom"},
        {"state": "stopped", "image": "never-declared:7"},
        {"state": "running", "image": None, "unsandboxed": True},
    ]
    for params in reports:
        assert driver.ok("session.reportLocalSandbox", params) == {"reported": True}
    events = driver.events_after(before)
    assert {e["client_key_id"] for e in events} == {actor}
    local = {"dispatch": "local", "unsandboxed": False, "container_id": None, "detail": None}
    assert typed_payloads(events) == [
        ("session.sandbox.running", {**local, "image": "never-declared:7", "container_id": "c0ffee"}),
        ("session.sandbox.error", {**local, "image": "never-declared:7", "container_id": "c0ffee", "detail": "oom"}),
        ("session.sandbox.stopped", {**local, "image": "never-declared:7"}),
        ("session.sandbox.running", {**local, "image": None, "unsandboxed": True}),
    ]


def assert_no_process(driver: Driver, process: str) -> None:
    """Until no process of the session's sandbox runs `process` (10 s at most)."""
    (container,) = driver.containers()
    deadline = time.monotonic() + 10
    while process in (running := container.exec_run(["ps", "-o", "args"]).output.decode()):
        assert time.monotonic() < deadline, running
        time.sleep(0.2)


def test_the_hosts_output_limit_and_exec_timeout_reach_clients(start_stack, mock):
    """BAE_SANDBOX_OUTPUT_LIMIT and BAE_SANDBOX_EXEC_TIMEOUT of the sandbox host, as a client sees them
    through session.execRemoteSandbox and an Auto-mode sandbox tool."""
    require_docker()
    stack = sandbox_stack(start_stack, mock, BAE_SANDBOX_OUTPUT_LIMIT="1000", BAE_SANDBOX_EXEC_TIMEOUT="2")
    profile = stack.create_profile("caps", available_sandboxes=[TEST_IMAGE])
    driver = Driver(stack, profile, sandbox_tools=[SHELL]).register()
    sandbox_id = driver.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})["sandbox_id"]

    flood = "head -c 5000 /dev/zero | tr '\\0' x; head -c 1500 /dev/zero | tr '\\0' y >&2"
    capped = {"stdout": "x" * 1000 + "\n[output truncated: 4000 bytes omitted]\n",
              "stderr": "y" * 1000 + "\n[output truncated: 500 bytes omitted]\n", "exit_code": 0}
    assert driver.ok("session.execRemoteSandbox", {"command": flood}) == capped
    assert driver.ok("session.execRemoteSandbox", {"command": "head -c 1000 /dev/zero | tr '\\0' x"}) == {
        "stdout": "x" * 1000, "stderr": "", "exit_code": 0}  # at the limit: nothing is cut

    mock.enqueue(Reply.tool_use([("tu_1", "sh", {"command": flood})]), Reply.text("seen"))
    outcome = driver.ok("session.sendMessage", {"message": {"content": "flood"}})
    rendered = capped["stdout"] + "[stderr]\n" + capped["stderr"]
    assert typed_payloads(outcome["events"][4:7]) == [
        ("sandbox.request", {"tool": "sh", "input": {"command": flood}, "command": flood}),
        ("sandbox.response", {"sandbox_id": sandbox_id, "ok": True, "result": capped}),
        ("tool.result", {"tool_use_id": "tu_1", "dispatch": "sandbox", "server_name": None, "is_error": False,
                         "content": [{"type": "text", "text": rendered}]}),
    ]
    (answered,) = mock.requests[-1]["body"]["messages"][-1]["content"]
    assert answered["content"] == [{"type": "text", "text": rendered}]

    # The host's own exec timeout applies (the session service sends none of its own).
    timed_out = "command timed out after 2s"
    error_event = ("session.sandbox.error", {"image": TEST_IMAGE, "sandbox_id": sandbox_id, "phase": "exec",
                                             "detail": timed_out, "dispatch": "remote", "unsandboxed": False})
    before = len(driver.events())
    began = time.monotonic()
    # Killed at the timeout with what it started, even a child that dropped its environment.
    hiding = "env -i sh -c 'while :; do sleep 1; done' & sleep 30"
    assert driver.error("session.execRemoteSandbox", {"command": hiding}) == {
        "code": -32000, "message": f"sandbox exec failed: {timed_out}"}
    assert 2 <= time.monotonic() - began < 20
    assert typed_payloads(driver.events_after(before)) == [error_event]
    assert_no_process(driver, "sleep 30")
    assert_no_process(driver, "while :")

    mock.enqueue(Reply.tool_use([("tu_2", "sh", {"command": "sleep 31"})]), Reply.text("too slow"))
    outcome = driver.ok("session.sendMessage", {"message": {"content": "wait"}})
    assert typed_payloads(outcome["events"][4:8]) == [
        ("sandbox.request", {"tool": "sh", "input": {"command": "sleep 31"}, "command": "sleep 31"}),
        error_event,
        ("sandbox.response", {"sandbox_id": sandbox_id, "ok": False, "error": timed_out}),
        ("tool.result", {"tool_use_id": "tu_2", "dispatch": "sandbox", "server_name": None, "is_error": True,
                         "content": [{"type": "text", "text": f"sandbox error: {timed_out}"}]}),
    ]
    assert_no_process(driver, "sleep 31")
    assert driver.ok("session.execRemoteSandbox", {"command": "echo still usable"})["stdout"] == "still usable\n"
    driver.close()


SHELL_PARENT = "grep -c 'bae resident shell' /proc/$PPID/cmdline 2>/dev/null || true"
SAME_EITHER_WAY = {
    "printf 'a\\\\b %s\\n' \"$0\"; echo é >&2; exit 7": {"stdout": "a\\b sh\n", "stderr": "é\n", "exit_code": 7},
    "echo before; kill 0; echo after": {"stdout": "before\n", "stderr": "", "exit_code": 143},
    "(sleep 0.2; echo late) & echo early": {"stdout": "early\nlate\n", "stderr": "", "exit_code": 0},
}


@pytest.mark.parametrize("resident", ["1", "0"])
def test_commands_go_to_the_resident_shell_unless_it_is_off_and_answer_alike(start_stack, mock, resident):
    """BAE_SANDBOX_RESIDENT_RUNNER as a client sees it: where a command's shell was started from,
    and the same answers either way."""
    require_docker()
    stack = sandbox_stack(start_stack, mock, BAE_SANDBOX_RESIDENT_RUNNER=resident)
    driver = Driver(stack, stack.create_profile("resident", available_sandboxes=[TEST_IMAGE])).register()
    driver.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})
    # An exec's shell has no parent inside the container ($PPID is 0); one the resident shell started has.
    expected_parent = "1\n" if resident == "1" else ""
    assert driver.ok("session.execRemoteSandbox", {"command": SHELL_PARENT})["stdout"] == expected_parent
    for command, answer in SAME_EITHER_WAY.items():
        assert driver.ok("session.execRemoteSandbox", {"command": command}) == answer, command
    driver.close()


def test_two_hosts_placement_a_killed_host_and_its_restart(start_stack, mock):
    require_docker()
    addresses = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    stack = sandbox_stack(start_stack, mock, BAE_SANDBOX_GRPC_ADDRS=",".join(addresses))
    host_ids = [stack.stack.env["BAE_SANDBOX_HOST_ID"], stack.stack.env["BAE_SANDBOX_HOST_ID"] + "-1"]
    # The session service polls host health every 2 s, and it started before the hosts did: let
    # one poll see both serving, or both sandboxes may go to whichever host it saw first.
    time.sleep(2.5)
    profile = stack.create_profile("two", available_sandboxes=[TEST_IMAGE])
    first, second = (Driver(stack, profile).register() for _ in range(2))
    handles = [d.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})["sandbox_id"] for d in (first, second)]

    placed = {}
    for driver, sandbox_id in zip((first, second), handles):
        (container,) = driver.containers()
        assert container.id == sandbox_id
        placed[driver.sid] = container.labels["bae.host"]
    assert sorted(placed.values()) == sorted(host_ids)  # one sandbox on each host

    index = host_ids.index(placed[first.sid])
    before = len(first.events())
    with ThreadPoolExecutor(1) as background:
        in_flight = background.submit(first.error, "session.execRemoteSandbox", {"command": "sleep 60"})
        time.sleep(1)
        started = time.monotonic()
        stack.stack.processes["sandbox-1" if index else "sandbox"].kill()
        cut_off = in_flight.result(timeout=10)
    assert time.monotonic() - started < 5
    unavailable = "the sandbox host is unavailable"  # its address stays in the session service's log
    assert cut_off["code"] == -32000
    assert cut_off["message"].startswith(f"sandbox exec failed: {unavailable}")
    (cut_event,) = first.events_after(before)
    assert cut_event["payload"]["phase"] == "exec"
    before += 1

    started = time.monotonic()
    failed_exec = first.error("session.execRemoteSandbox", {"command": "echo still there?"})
    failed_stop = first.error("session.stopRemoteSandbox")
    assert time.monotonic() - started < 5
    assert failed_exec["code"] == -32000
    assert failed_exec["message"].startswith(f"sandbox exec failed: {unavailable}")
    assert failed_stop["code"] == -32000
    assert failed_stop["message"].startswith(f"sandbox stop failed: {unavailable}")
    base = {"image": TEST_IMAGE, "sandbox_id": handles[0]}
    events = first.events_after(before)
    assert [(e["event_type"], e["payload"].get("phase")) for e in events] == [
        ("session.sandbox.error", "exec"), ("session.sandbox.stop", None), ("session.sandbox.error", "stop"),
    ]
    assert events[0]["payload"] == {**base, "phase": "exec", "detail": failed_exec["message"].removeprefix(
        "sandbox exec failed: "), "dispatch": "remote", "unsandboxed": False}
    assert events[1]["payload"] == {**base, "reason": "explicit", "dispatch": "remote"}
    assert events[2]["payload"] == {**base, "phase": "stop", "detail": failed_stop["message"].removeprefix(
        "sandbox stop failed: "), "dispatch": "remote", "unsandboxed": False}
    assert first.error("session.execRemoteSandbox", {"command": "true"}) == NOT_RUNNING  # the handle is gone

    assert second.ok("session.execRemoteSandbox", {"command": "echo ok"}) == {"stdout": "ok\n", "stderr": "", "exit_code": 0}
    assert len(first.containers()) == 1  # orphaned by the kill, until its host comes back

    # The same host id on the same address again: its orphan goes before it serves.
    replacement = SandboxHostProcess(host_ids[index], address=addresses[index])
    try:
        replacement.wait_serving()
        assert first.containers() == []
        again = first.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})["sandbox_id"]
        assert first.ok("session.execRemoteSandbox", {"command": "echo back"})["stdout"] == "back\n"
        first.close()
        second.close()
        assert first.containers() == [] and second.containers() == []
        assert again not in {c.id for c in sandboxes_of_hosts(RUN)}
    finally:
        replacement.stop()


def test_stopping_the_stack_leaves_no_container(start_stack, mock):
    require_docker()
    stack = sandbox_stack(start_stack, mock)
    driver = Driver(stack, stack.create_profile("stop", available_sandboxes=[TEST_IMAGE])).register()
    driver.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})
    assert len(driver.containers()) == 1
    assert stack.close() == {"gateway": 0, "runner": 0, "sandbox": 0, "session": 0}
    assert driver.containers() == []


def test_cancel_turn_kills_the_command_the_turn_runs(stack, mock):
    """session.cancelTurn during an Auto-dispatched command: the command and what it started are
    killed, the turn's calls get synthetic results, and the next turn sends a valid history."""
    require_docker()
    driver = Driver(stack, stack.create_profile("cancel", available_sandboxes=[TEST_IMAGE]), sandbox_tools=[SHELL])
    driver.register()
    driver.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})
    (container,) = driver.containers()
    command = "sleep 300 & sleep 301; echo never"
    mock.enqueue(Reply.tool_use([("tu_1", "sh", {"command": command}), ("tu_2", "sh", {"command": "echo next"})]))
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(driver.call, "session.sendMessage", {"message": {"content": "wait for it"}})
        deadline = time.monotonic() + 30
        while "sleep 301" not in container.exec_run(["ps", "-o", "args"]).output.decode():
            assert time.monotonic() < deadline and not turn.done(), "the command never started"
            time.sleep(0.1)
        assert driver.ok("session.cancelTurn") == {"cancelled": True}
        frames = turn.result(timeout=30)
    assert terminal(frames)["error"] == {"code": -32052, "message": "turn cancelled"}
    assert_no_process(driver, "sleep 30")  # the command and the child it started

    events = driver.events()
    actor = events[0]["client_key_id"]
    assert types(events)[-10:] == [
        "provider.request", "provider.response", "tool.call", "tool.call", "sandbox.request",
        "server.message.send", "server.message.send", "tool.result", "tool.result", "session.turn.cancelled",
    ]
    calls = [{"type": "tool_use", "id": "tu_1", "name": "sh", "input": {"command": command}},
             {"type": "tool_use", "id": "tu_2", "name": "sh", "input": {"command": "echo next"}}]
    text = "Tool call was cancelled before returning a result."
    assert typed_payloads(events[-5:]) == [
        ("server.message.send", {"role": "assistant", "content": [{**call, "dispatch": "sandbox"} for call in calls]}),
        ("server.message.send", {"role": "user", "synthetic": "cancelled_tool_results", "content": [
            {"type": "tool_result", "tool_use_id": call["id"], "content": text, "is_error": True} for call in calls]}),
        *[("tool.result", {"tool_use_id": call["id"], "dispatch": "sandbox", "server_name": None, "is_error": True,
                           "content": text}) for call in calls],
        ("session.turn.cancelled", {"cancelled_by": actor, "tool_use_ids": ["tu_1", "tu_2"]}),
    ]

    mock.enqueue(Reply.text("stopped"))
    reply = driver.ok("session.sendMessage", {"message": {"content": "never mind"}})
    assert reply["message"]["content"] == [{"type": "text", "text": "stopped"}]
    sent = mock.requests[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"] and sent[1]["content"] == calls
    driver.close()


def test_a_keys_sandboxes_stop_at_its_quota_whichever_session_starts_them(stack):
    require_docker()
    profile = stack.create_profile("quota", available_sandboxes=[TEST_IMAGE], limits={"max_sandboxes_per_key": 1})
    wait_provisioned(stack)
    key = stack.create_key(profile["id"])["key"]
    sessions = [stack.open_session(key) for _ in range(2)]

    def call(opened: dict, method: str, params: dict | None = None) -> dict:
        return terminal(rpc(stack.client, opened["session_id"], opened["session_key"], method, params))

    for opened in sessions:
        assert call(opened, "session.registerDriver")["result"] == {"registered": True}
    first, second = sessions
    assert "result" in call(first, "session.startRemoteSandbox", {"image": TEST_IMAGE})
    assert call(second, "session.startRemoteSandbox", {"image": TEST_IMAGE})["error"] == {
        "code": -32050, "message": "quota_exceeded: max_sandboxes_per_key 1 reached"}
    log = stack.client.get(f"/api/v1/sessions/{second['session_id']}/events",
                           headers={"Authorization": f"Bearer {second['session_key']}"}).json()["items"]
    assert not [e for e in types(log) if e.startswith("session.sandbox.") and e != "session.sandbox.available"]
    assert call(first, "session.stopRemoteSandbox")["result"]["stopped"] is True
    assert "result" in call(second, "session.startRemoteSandbox", {"image": TEST_IMAGE})  # the place is free again
    for opened in sessions:
        closed = stack.client.delete(f"/api/v1/sessions/{opened['session_id']}",
                                     headers={"Authorization": f"Bearer {opened['session_key']}"})
        assert closed.status_code == 200
