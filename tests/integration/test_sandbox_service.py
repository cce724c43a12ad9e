"""The sandbox host over real gRPC, against the real Docker daemon."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid

import grpc
import pytest

from bae.common.grpcutil import channel as internal_channel
from bae.common.protos import sandbox_pb2, sandbox_pb2_grpc
from bae.services.sandbox.docker_driver import SHELL_CAPABILITIES
from testkit import ROOT
from testkit.docker_support import (
    TEST_IMAGE,
    SandboxHostProcess,
    containers_with,
    docker_client,
    remove_containers,
    require_docker,
    start_host,  # noqa: F401 - the fixture
)
from testkit.processes import TEST_PLANE
from testkit.sandboxes import image_refusals

pytestmark = [pytest.mark.stack, pytest.mark.docker]


@pytest.fixture
def host(start_host):  # noqa: F811 - the fixture
    return start_host()


async def _stub(address: str, *images: str):
    """A stub to the host, which is first allowed TEST_IMAGE and `images` (as the session service would)."""
    channel = internal_channel(address, TEST_PLANE)
    stub = sandbox_pb2_grpc.SandboxStub(channel)
    await stub.AllowImages(sandbox_pb2.AllowImagesRequest(images=[TEST_IMAGE, *images]), timeout=10)
    return channel, stub


@pytest.fixture
async def stub(host):
    channel, stub = await _stub(host.address)
    yield stub
    await channel.close()


async def _start(stub, session_id: str = "ses_test") -> str:
    reply = await stub.Start(sandbox_pb2.StartRequest(session_id=session_id, image=TEST_IMAGE), timeout=30)
    assert reply.sandbox_id
    return reply.sandbox_id


async def _exec(stub, sandbox_id: str, command: str, timeout: float = 0) -> sandbox_pb2.ExecResponse:
    request = sandbox_pb2.ExecRequest(sandbox_id=sandbox_id, command=command, timeout_seconds=timeout)
    return await stub.Exec(request, timeout=30)


async def test_ensure_image_present_is_ok_without_pull(stub):
    reply = await stub.EnsureImage(sandbox_pb2.EnsureImageRequest(image=TEST_IMAGE), timeout=30)
    assert reply.pulled is False


async def test_ensure_image_that_cannot_be_pulled_is_a_clear_error(stub):
    image = f"bae-no-such-image-{uuid.uuid4().hex[:8]}:never"
    await stub.AllowImages(sandbox_pb2.AllowImagesRequest(images=[image]), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.EnsureImage(sandbox_pb2.EnsureImageRequest(image=image), timeout=60)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details().startswith(f'cannot pull image "{image}": ')


async def test_start_exec_stop_lifecycle(stub, host):
    sandbox_id = await _start(stub, "ses_lifecycle")
    listed = await stub.List(sandbox_pb2.ListRequest(), timeout=10)
    assert [(s.sandbox_id, s.session_id, s.state) for s in listed.sandboxes] == [
        (sandbox_id, "ses_lifecycle", "running")
    ]

    reply = await _exec(stub, sandbox_id, "echo hello; echo $((6 * 7)) > /tmp/x; cat /tmp/x")
    assert (reply.stdout, reply.stderr, reply.exit_code) == ("hello\n42\n", "", 0)

    stopped = await stub.Stop(sandbox_pb2.StopRequest(sandbox_id=sandbox_id), timeout=30)
    assert stopped.was_running is True
    assert containers_with(host.label) == []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _exec(stub, sandbox_id, "true")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == f"no such sandbox: {sandbox_id}"


async def test_exec_stderr_and_nonzero_exit_are_a_result(stub):
    sandbox_id = await _start(stub)
    reply = await _exec(stub, sandbox_id, "echo out; echo oops >&2; exit 3")
    assert (reply.stdout, reply.stderr, reply.exit_code) == ("out\n", "oops\n", 3)
    reply = await _exec(stub, sandbox_id, "no-such-command-here")
    assert reply.exit_code == 127 and "not found" in reply.stderr
    await stub.Stop(sandbox_pb2.StopRequest(sandbox_id=sandbox_id), timeout=30)


async def test_exec_timeout_is_a_clear_error_and_kills_the_command(stub):
    sandbox_id = await _start(stub)
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _exec(stub, sandbox_id, "sleep 30 & sleep 31; echo never", timeout=1)
    assert time.monotonic() - started < 6
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert caught.value.details() == "command timed out after 1s"
    # The sandbox still works, and the timed-out command is gone, its children too.
    reply = await _exec(stub, sandbox_id, "ps -o args | grep -c '^sleep 3[01]' || true")
    assert reply.stdout.strip() == "0"
    await stub.Stop(sandbox_pb2.StopRequest(sandbox_id=sandbox_id), timeout=30)


async def test_host_default_exec_timeout_applies(start_host):  # noqa: F811 - the fixture
    host = start_host(BAE_SANDBOX_EXEC_TIMEOUT="1")
    channel, stub = await _stub(host.address)
    sandbox_id = await _start(stub)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _exec(stub, sandbox_id, "sleep 20")
    assert caught.value.details() == "command timed out after 1s"
    await channel.close()


async def test_stop_of_a_gone_sandbox_is_success(stub):
    sandbox_id = await _start(stub)
    assert (await stub.Stop(sandbox_pb2.StopRequest(sandbox_id=sandbox_id), timeout=30)).was_running
    again = await stub.Stop(sandbox_pb2.StopRequest(sandbox_id=sandbox_id), timeout=30)
    assert again.was_running is False
    never = await stub.Stop(sandbox_pb2.StopRequest(sandbox_id="0" * 64), timeout=30)
    assert never.was_running is False


async def test_container_has_labels_and_limits_and_no_mounts(stub, host):
    sandbox_id = await _start(stub, "ses_labels")
    client = docker_client()
    try:
        attrs = client.containers.get(sandbox_id).attrs
    finally:
        client.close()
    assert attrs["Config"]["Labels"] == {"bae.sandbox": "1", "bae.session_id": "ses_labels", "bae.host": host.host_id}
    config = attrs["HostConfig"]
    assert config["Memory"] == 512 * 1024 * 1024
    assert config["NanoCpus"] == 1_000_000_000
    assert config["PidsLimit"] == 256
    assert config["NetworkMode"] == "bridge"
    assert config["AutoRemove"] is True
    assert not config.get("Binds") and attrs["Mounts"] == []
    assert attrs["Config"]["Cmd"] == ["sleep", "infinity"]
    # Hardened by default (docs/security.md).
    assert config["CapDrop"] == ["ALL"]
    assert sorted(config["CapAdd"]) == sorted(SHELL_CAPABILITIES)
    assert "NET_RAW" not in config["CapAdd"] and "MKNOD" not in config["CapAdd"]
    assert config["SecurityOpt"] == ["no-new-privileges:true"]
    assert config["MemorySwap"] == config["Memory"]
    assert config["Init"] is True
    assert config["ReadonlyRootfs"] is False and not config.get("Tmpfs")
    # What the workload sees: the reduced capability set, and the init process as PID 1.
    reply = await _exec(stub, sandbox_id, "grep CapEff /proc/self/status; cat /proc/1/cmdline | tr '\\0' ' '")
    effective, init = reply.stdout.splitlines()
    assert int(effective.split()[1], 16) == capability_mask(SHELL_CAPABILITIES)
    assert init.startswith("/sbin/docker-init -- sleep infinity")
    await stub.Stop(sandbox_pb2.StopRequest(sandbox_id=sandbox_id), timeout=30)


# Linux capability numbers (linux/capability.h) of the capabilities a sandbox keeps.
CAPABILITY_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7,
                   "NET_BIND_SERVICE": 10}


def capability_mask(names) -> int:
    return sum(1 << CAPABILITY_BITS[name] for name in names)


async def container_of(sandbox_id: str) -> dict:
    client = docker_client()
    try:
        return client.containers.get(sandbox_id).attrs
    finally:
        client.close()


async def test_read_only_root_with_a_writable_workspace_and_tmp(start_host):  # noqa: F811 - the fixture
    host = start_host(BAE_SANDBOX_READ_ONLY="1", BAE_SANDBOX_MEMORY="64m")
    channel, stub = await _stub(host.address)
    sandbox_id = await _start(stub)
    attrs = await container_of(sandbox_id)
    assert attrs["HostConfig"]["ReadonlyRootfs"] is True
    assert sorted(attrs["HostConfig"]["Tmpfs"]) == ["/tmp", "/workspace"]
    assert attrs["Config"]["WorkingDir"] == "/workspace"
    reply = await _exec(stub, sandbox_id, "pwd; echo a > file && cat file; echo b > /tmp/t && cat /tmp/t; touch /etc/x")
    assert reply.stdout == "/workspace\na\nb\n"
    assert reply.exit_code == 1 and "Read-only file system" in reply.stderr
    await stub.Stop(sandbox_pb2.StopRequest(sandbox_id=sandbox_id), timeout=30)
    await channel.close()


async def test_a_named_network(start_host):  # noqa: F811 - the fixture
    name = f"bae-test-net-{uuid.uuid4().hex[:8]}"
    client = docker_client()
    network = client.networks.create(name, internal=True)
    try:
        host = start_host(BAE_SANDBOX_NETWORK=name)
        channel, stub = await _stub(host.address)
        sandbox_id = await _start(stub)
        attrs = await container_of(sandbox_id)
        assert attrs["HostConfig"]["NetworkMode"] == name
        assert list(attrs["NetworkSettings"]["Networks"]) == [name]
        await stub.Stop(sandbox_pb2.StopRequest(sandbox_id=sandbox_id), timeout=30)
        await channel.close()
    finally:
        network.remove()
        client.close()


async def test_only_allowed_images_are_pulled_or_started(start_host, host):  # noqa: F811 - the fixture
    channel = internal_channel(host.address, TEST_PLANE)
    stub = sandbox_pb2_grpc.SandboxStub(channel)
    try:
        # A host that was never told (fresh or restarted) refuses every image, so the caller sends the set.
        assert {(error.code(), error.details()) for error in await image_refusals(stub, TEST_IMAGE)} == {
            (grpc.StatusCode.ABORTED, "this sandbox host has not been told which images are allowed yet")
        }
        await stub.AllowImages(sandbox_pb2.AllowImagesRequest(images=[TEST_IMAGE]), timeout=10)
        # Any other name is refused before the Docker daemon is asked: nothing is pulled or run.
        other = f"bae-not-allowed-{uuid.uuid4().hex[:8]}:1"
        assert {(error.code(), error.details()) for error in await image_refusals(stub, other)} == {
            (grpc.StatusCode.PERMISSION_DENIED, f'image "{other}" is not allowed on this sandbox host: no profile declares it')
        }
        assert containers_with(host.label) == []
        sandbox_id = await _start(stub)
        await stub.Stop(sandbox_pb2.StopRequest(sandbox_id=sandbox_id), timeout=30)
        # The set is replaced, not extended.
        await stub.AllowImages(sandbox_pb2.AllowImagesRequest(images=[other]), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _start(stub)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await channel.close()


async def test_limits_and_network_follow_the_environment(start_host):  # noqa: F811 - the fixture
    host = start_host(
        BAE_SANDBOX_MEMORY="64m", BAE_SANDBOX_CPUS="0.5", BAE_SANDBOX_PIDS_LIMIT="32", BAE_SANDBOX_NETWORK="none"
    )
    channel, stub = await _stub(host.address)
    sandbox_id = await _start(stub)
    client = docker_client()
    try:
        config = client.containers.get(sandbox_id).attrs["HostConfig"]
    finally:
        client.close()
    assert (config["Memory"], config["NanoCpus"], config["PidsLimit"], config["NetworkMode"]) == (
        64 * 1024 * 1024, 500_000_000, 32, "none"
    )
    await channel.close()


async def test_orphans_of_this_host_are_removed_at_start_up():
    require_docker()
    host_id = f"test-{uuid.uuid4().hex[:12]}"
    other_id = f"test-{uuid.uuid4().hex[:12]}"
    client = docker_client()
    try:
        for owner in (host_id, other_id):
            client.containers.run(
                TEST_IMAGE, ["sleep", "infinity"], detach=True, auto_remove=True,
                labels={"bae.sandbox": "1", "bae.session_id": "ses_orphan", "bae.host": owner},
            )
    finally:
        client.close()
    host = SandboxHostProcess(host_id)
    try:
        assert len(containers_with(f"bae.host={host_id}")) == 1
        host.wait_serving()
        assert containers_with(f"bae.host={host_id}") == []
        assert len(containers_with(f"bae.host={other_id}")) == 1
    finally:
        host.stop()
        remove_containers(f"bae.host={other_id}")


async def test_shutdown_removes_this_hosts_sandboxes(stub, host):
    sandbox_ids = {await _start(stub, f"ses_shutdown{n}") for n in range(2)}
    assert {c.id for c in containers_with(host.label)} == sandbox_ids
    host.terminate()
    assert host.process.returncode == 0
    assert containers_with(host.label) == []


def _run_host(**env: str) -> subprocess.CompletedProcess:
    """Run a sandbox host with only `env` (and PATH) set; for start-up failures."""
    return subprocess.run(
        [sys.executable, "-m", "bae.services.sandbox"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_unknown_driver_exits_2():
    result = _run_host(BAE_SANDBOX_DRIVER="podman")
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        'BAE_SANDBOX_DRIVER: "podman" is not a supported sandbox driver (expected "docker" or "apple-container")'
    )


def test_invalid_limit_exits_2():
    result = _run_host(BAE_SANDBOX_MEMORY="lots")
    assert result.returncode == 2
    assert 'BAE_SANDBOX_MEMORY: "lots" is not a memory size' in result.stderr


async def test_apple_container_driver_fails_every_call_as_unsupported(tmp_path):
    host = SandboxHostProcess("test-apple", BAE_SANDBOX_DRIVER="apple-container")
    try:
        host.wait_serving()
        channel, stub = await _stub(host.address)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _start(stub)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert caught.value.details() == 'the "apple-container" sandbox driver is not supported on this host'
        await channel.close()
    finally:
        host.terminate()


async def test_unreachable_docker_reports_not_serving_and_fails_calls(tmp_path):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    host = SandboxHostProcess("test-no-docker", DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    try:
        channel = internal_channel(host.address, TEST_PLANE)
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="baeproto.v1.Sandbox")
        async with asyncio.timeout(20):
            while True:
                try:
                    reply = await health.Check(request, timeout=1)
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        await stub.AllowImages(sandbox_pb2.AllowImagesRequest(images=[TEST_IMAGE]), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _start(stub)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert caught.value.details().startswith("docker engine is not reachable: ")
        await channel.close()
    finally:
        host.terminate()
