"""The docker driver's two exec paths against the real engine: straight over the unix socket
(engine_socket.py, what a host on the default engine uses) and through the SDK (any other
engine address). Both must answer alike: output, exit code, caps, timeout kill, a missing sandbox.
"""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from docker_support import TEST_IMAGE, containers_with, require_docker
from services.sandbox.config import SandboxConfig
from services.sandbox.docker_driver import DockerDriver
from services.sandbox.driver import SandboxFailure
from services.sandbox.engine_socket import unix_socket_path

LIMIT = 64


@pytest.fixture(params=["socket", "sdk"])
async def sandbox(request):
    require_docker()
    host_id = f"test-exec-{uuid.uuid4().hex[:12]}"
    config = SandboxConfig(
        driver="docker", listen_addr="unused", host_id=host_id, memory="256m", cpus=1, pids_limit=64,
        network="none", read_only=False, exec_timeout=30, output_limit=LIMIT, health_interval=2,
    )
    driver = DockerDriver(config)
    sandbox_id = await driver.start("ses_paths", TEST_IMAGE)
    if request.param == "sdk":
        driver._socket = None  # what a host does when the engine is not on a unix socket
    else:
        assert driver._socket is not None, "the test engine is on a unix socket"
    try:
        yield driver, sandbox_id
    finally:
        await driver.remove_all()
        await driver.close()
        assert containers_with(f"bae.host={host_id}") == []


async def test_output_and_exit_code(sandbox):
    driver, sandbox_id = sandbox
    output = await driver.exec(sandbox_id, "echo out; echo err >&2; exit 3", 10)
    assert (output.stdout, output.stderr, output.exit_code) == ("out\n", "err\n", 3)
    assert not output.stdout_truncated and not output.stderr_truncated


async def test_each_stream_is_capped(sandbox):
    driver, sandbox_id = sandbox
    output = await driver.exec(sandbox_id, "yes a | head -c 100000; yes b | head -c 300 >&2", 10)
    assert output.stdout == "a\n" * (LIMIT // 2) + "\n[output truncated: 99936 bytes omitted]\n"
    assert output.stderr.startswith("b\n" * (LIMIT // 2)) and output.stderr_truncated


async def test_a_timed_out_command_is_killed_with_its_children(sandbox):
    driver, sandbox_id = sandbox
    with pytest.raises(SandboxFailure) as caught:
        await driver.exec(sandbox_id, "sleep 300 & sleep 301", 0.5)
    assert (caught.value.code, caught.value.detail) == (grpc.StatusCode.DEADLINE_EXCEEDED, "command timed out after 0.5s")
    left = await driver.exec(sandbox_id, "ps -o args | grep '^sleep 30' || true", 10)
    assert left.stdout == ""
    assert (await driver.exec(sandbox_id, "echo still usable", 10)).stdout == "still usable\n"


async def test_a_missing_sandbox_is_not_found(sandbox):
    driver, _ = sandbox
    with pytest.raises(SandboxFailure) as caught:
        await driver.exec("0" * 64, "true", 10)
    assert (caught.value.code, caught.value.detail) == (grpc.StatusCode.NOT_FOUND, f"no such sandbox: {'0' * 64}")


def test_the_socket_path_follows_docker_host():
    assert unix_socket_path({}) == "/var/run/docker.sock"
    assert unix_socket_path({"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}) == "/run/user/1000/docker.sock"
    assert unix_socket_path({"DOCKER_HOST": "tcp://10.0.0.2:2376", "DOCKER_TLS_VERIFY": "1"}) is None
    assert unix_socket_path({"DOCKER_HOST": "ssh://user@builder"}) is None


@pytest.mark.parametrize("sandbox", ["socket"], indirect=True)  # the SDK path keeps its own connections
async def test_connections_are_reused_and_one_the_engine_closed_is_replaced(sandbox, tmp_path):
    driver, sandbox_id = sandbox
    engine = driver._socket
    assert engine is not None
    await driver.exec(sandbox_id, "true", 10)
    assert engine._idle, "the create and inspect connection is kept for the next exec"

    async def hang_up(reader, writer) -> None:
        writer.close()

    # Stands in for an idle connection the engine closed: it answers nothing.
    server = await asyncio.start_unix_server(hang_up, path=str(tmp_path / "closed.sock"))
    try:
        engine.close()
        engine._idle.append(await asyncio.open_unix_connection(str(tmp_path / "closed.sock")))
        await asyncio.sleep(0.05)  # the hang-up has arrived
        assert (await driver.exec(sandbox_id, "echo again", 10)).stdout == "again\n"
    finally:
        server.close()
