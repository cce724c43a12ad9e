"""Sandbox host authority and the idle lifetime, through the whole stack with real Docker."""

from __future__ import annotations

import time
import uuid

import docker.errors
import grpc
import pytest

from bae.common.grpcutil import channel as internal_channel
from bae.common.protos import sandbox_pb2_grpc
from bae.services.sandbox.docker_driver import SHELL_CAPABILITIES
from testkit.docker_support import TEST_IMAGE, containers_with, docker_client, require_docker
from testkit.processes import TEST_PLANE
from testkit.sandboxes import Driver, image_refusals, typed_payloads, wait_provisioned
from testkit.stack import mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.docker]


def isolation_stack(start_stack, mock, **env: str):
    require_docker()
    mock.reset()
    return start_stack(
        config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN="t0ken",
        BAE_SANDBOX_HOST_ID=f"test-isolation-{uuid.uuid4().hex[:8]}", **env,
    )


@pytest.fixture
def idle_stack(start_stack, mock):
    return isolation_stack(start_stack, mock, BAE_SANDBOX_IDLE_TIMEOUT="2")


def test_sandboxes_of_the_stack_run_hardened_with_the_deployment_options(start_stack, mock):
    stack = isolation_stack(start_stack, mock, BAE_SANDBOX_READ_ONLY="true", BAE_SANDBOX_NETWORK="none")
    driver = Driver(stack, stack.create_profile("hardened", available_sandboxes=[TEST_IMAGE])).register()
    sandbox_id = driver.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})["sandbox_id"]
    client = docker_client()
    try:
        attrs = client.containers.get(sandbox_id).attrs
    finally:
        client.close()
    config = attrs["HostConfig"]
    assert config["CapDrop"] == ["ALL"] and sorted(config["CapAdd"]) == sorted(SHELL_CAPABILITIES)
    assert config["SecurityOpt"] == ["no-new-privileges:true"]
    assert (config["Init"], config["PidsLimit"], config["MemorySwap"]) == (True, 256, config["Memory"])
    assert (config["ReadonlyRootfs"], sorted(config["Tmpfs"]), config["NetworkMode"]) == (
        True, ["/tmp", "/workspace"], "none"
    )
    # No log is kept of the container's own output, which a command can write to as well.
    assert (config["LogConfig"], attrs["LogPath"]) == ({"Type": "none", "Config": {}}, "")
    ran = driver.ok("session.execRemoteSandbox", {"command": "echo kept > note && cat note; touch /etc/x; ip -o link"})
    assert ran["stdout"].startswith("kept\n") and "Read-only file system" in ran["stderr"]
    assert [line.split(":")[1].strip() for line in ran["stdout"].splitlines()[1:]] == ["lo"]  # network none
    flood = driver.ok("session.execRemoteSandbox", {"command": "head -c 64000000 /dev/zero >/proc/1/fd/1 && echo written"})
    assert flood["stdout"] == "written\n"
    client = docker_client()
    try:
        assert client.containers.get(sandbox_id).attrs["LogPath"] == ""
        with pytest.raises(docker.errors.APIError, match="does not support reading"):
            client.containers.get(sandbox_id).logs()
    finally:
        client.close()
    driver.close()
    assert driver.containers() == []


def wait_for(condition, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return value


def test_an_unused_sandbox_is_stopped_after_the_idle_lifetime(idle_stack):
    driver = Driver(idle_stack, idle_stack.create_profile("idle", available_sandboxes=[TEST_IMAGE])).register()
    started = driver.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})
    sandbox_id = started["sandbox_id"]
    # A command that runs past the lifetime keeps the sandbox in use: it is not stopped under it.
    assert driver.ok("session.execRemoteSandbox", {"command": "sleep 3; echo done"})["stdout"] == "done\n"
    assert "session.sandbox.stop" not in [kind for kind, _ in typed_payloads(driver.events())]

    stopped = wait_for(lambda: [p for kind, p in typed_payloads(driver.events()) if kind == "session.sandbox.stopped"])
    stop = {"image": TEST_IMAGE, "sandbox_id": sandbox_id, "reason": "idle_timeout", "dispatch": "remote"}
    tail = [(e["event_type"], e["payload"], e["client_key_id"]) for e in driver.events()[-2:]]
    assert tail == [
        ("session.sandbox.stop", stop, None),
        ("session.sandbox.stopped", {**stop, "unsandboxed": False}, None),
    ]
    assert stopped == [{**stop, "unsandboxed": False}]
    assert driver.containers() == []
    assert driver.error("session.execRemoteSandbox", {"command": "true"})["code"] == -32013
    # The session stays open and can start a new one.
    again = driver.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})
    assert again["sandbox_id"] != sandbox_id
    driver.close()
    assert containers_with(f"bae.session_id={driver.sid}") == []


async def test_the_sandbox_host_refuses_images_no_profile_declares(idle_stack):
    idle_stack.create_profile("declares", available_sandboxes=[TEST_IMAGE])
    wait_provisioned(idle_stack)
    address = idle_stack.stack.settings.sandbox_grpc_addrs[0]
    channel = internal_channel(address, TEST_PLANE)
    stub = sandbox_pb2_grpc.SandboxStub(channel)
    try:
        undeclared = f"bae-undeclared-{uuid.uuid4().hex[:8]}:latest"
        refusals = await image_refusals(stub, undeclared)
        assert [error.code() for error in refusals] == [grpc.StatusCode.PERMISSION_DENIED] * 2
        assert containers_with("bae.session_id=ses_refused") == []
    finally:
        await channel.close()
