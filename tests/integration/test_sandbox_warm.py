"""Warm sandboxes (BAE_SANDBOX_WARM): started spares a session's start takes, against the real Docker daemon.

Straight to a sandbox host over gRPC for what only the host shows (List, its limits, its reaping),
and through the gateway for what a client sees.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from bae.common.grpcutil import channel as internal_channel
from bae.common.protos import sandbox_pb2, sandbox_pb2_grpc
from testkit.docker_support import (
    TEST_IMAGE,
    SandboxHostProcess,
    containers_with,
    docker_client,
    require_docker,
    stack_with_sandbox_hosts,
    start_host,  # noqa: F401 - the fixture
)
from testkit.live import result, rpc
from testkit.processes import TEST_PLANE

pytestmark = [pytest.mark.stack, pytest.mark.docker]

MISSING_IMAGE = "bae-no-such-image:1"
# What makes two containers the same sandbox: everything the host sets but the session label.
HOST_CONFIG_KEYS = (
    "AutoRemove", "Memory", "MemorySwap", "NanoCpus", "PidsLimit", "NetworkMode", "CapDrop", "CapAdd",
    "SecurityOpt", "Init", "ReadonlyRootfs", "Tmpfs", "Binds", "Mounts", "Privileged",
)


def spares(host_id: str) -> set[str]:
    """Ids of the running containers of the host labelled as spares (taken ones included)."""
    client = docker_client()
    try:  # one listing call: containers of other tests may vanish meanwhile
        found = client.api.containers(filters={"label": ["bae.spare=1", f"bae.host={host_id}"]})
    finally:
        client.close()
    return {item["Id"] for item in found}


def wait_for(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


async def wait_for_async(condition, what: str, timeout: float = 30.0):
    return await asyncio.to_thread(wait_for, condition, what, timeout)


class Host:
    """A stub to a host that was allowed `images`, as the session service does first."""

    def __init__(self, host: SandboxHostProcess) -> None:
        self.process = host
        self.channel = internal_channel(host.address, TEST_PLANE)
        self.stub = sandbox_pb2_grpc.SandboxStub(self.channel)

    async def allow(self, *images: str) -> None:
        await self.stub.AllowImages(sandbox_pb2.AllowImagesRequest(images=list(images)), timeout=10)

    async def start(self, session_id: str) -> str:
        reply = await self.stub.Start(sandbox_pb2.StartRequest(session_id=session_id, image=TEST_IMAGE), timeout=30)
        return reply.sandbox_id

    async def listed(self) -> dict[str, str]:
        reply = await self.stub.List(sandbox_pb2.ListRequest(), timeout=10)
        return {item.sandbox_id: item.session_id for item in reply.sandboxes}

    async def spares(self, count: int) -> set[str]:
        """Once the host runs `count` spares no session holds: their ids."""
        def free() -> set[str] | None:
            found = spares(self.process.host_id) - held
            return found if len(found) == count else None
        held = set(await self.listed())
        return await wait_for_async(free, f"{count} warm spare(s)")


@pytest.fixture
async def connect():
    made: list[Host] = []

    def connect(host: SandboxHostProcess) -> Host:
        made.append(Host(host))
        return made[-1]

    yield connect
    for host in made:
        await host.channel.close()


async def test_start_takes_a_spare_that_list_then_reports_and_the_pool_refills(start_host, connect):  # noqa: F811 - the fixture
    host = connect(start_host(BAE_SANDBOX_WARM="1"))
    await host.allow(TEST_IMAGE)
    [spare] = await host.spares(1)
    assert await host.listed() == {}, "a spare no session holds is nobody's sandbox"

    sandbox_id = await host.start("ses_warm")
    assert sandbox_id == spare
    reply = await host.stub.Exec(sandbox_pb2.ExecRequest(sandbox_id=sandbox_id, command="echo hi"), timeout=30)
    assert (reply.stdout, reply.exit_code) == ("hi\n", 0)

    [refill] = await host.spares(1)
    assert refill != spare
    # What the session service's reconciliation reads after a restart: the taken spare is the session's.
    assert await host.listed() == {spare: "ses_warm"}
    await host.stub.Stop(sandbox_pb2.StopRequest(sandbox_id=sandbox_id), timeout=30)
    assert await host.listed() == {}
    assert await host.spares(1) == {refill}


async def test_concurrent_starts_never_share_a_container(start_host, connect):  # noqa: F811 - the fixture
    host = connect(start_host(BAE_SANDBOX_WARM="2"))
    await host.allow(TEST_IMAGE)
    ready = await host.spares(2)
    sessions = [f"ses_race{n}" for n in range(6)]
    started = await asyncio.gather(*(host.start(session) for session in sessions))
    assert len(set(started)) == len(sessions)
    assert ready <= set(started), "both spares were handed out"
    assert await host.listed() == dict(zip(started, sessions))


async def test_a_spare_is_the_same_sandbox_as_a_cold_one(start_host, connect):  # noqa: F811 - the fixture
    limits = {
        "BAE_SANDBOX_MEMORY": "64m", "BAE_SANDBOX_CPUS": "0.5", "BAE_SANDBOX_PIDS_LIMIT": "32",
        "BAE_SANDBOX_NETWORK": "none", "BAE_SANDBOX_READ_ONLY": "1",
    }
    warm = connect(start_host(BAE_SANDBOX_WARM="1", **limits))
    cold = connect(start_host(**limits))
    await warm.allow(TEST_IMAGE)
    await cold.allow(TEST_IMAGE)
    [spare] = await warm.spares(1)
    assert await warm.start("ses_same") == spare
    cold_id = await cold.start("ses_same")

    client = docker_client()
    try:
        spare_attrs, cold_attrs = (client.containers.get(c).attrs for c in (spare, cold_id))
    finally:
        client.close()
    assert {k: spare_attrs["HostConfig"].get(k) for k in HOST_CONFIG_KEYS} == {
        k: cold_attrs["HostConfig"].get(k) for k in HOST_CONFIG_KEYS
    }
    assert spare_attrs["HostConfig"]["Memory"] == 64 * 1024 * 1024
    for key in ("Image", "Cmd", "WorkingDir", "Env", "User"):
        assert spare_attrs["Config"][key] == cold_attrs["Config"][key], key
    assert spare_attrs["Config"]["Labels"] == {"bae.sandbox": "1", "bae.spare": "1", "bae.host": warm.process.host_id}
    assert cold_attrs["Config"]["Labels"] == {
        "bae.sandbox": "1", "bae.session_id": "ses_same", "bae.host": cold.process.host_id
    }


async def test_spares_of_an_image_no_longer_allowed_are_removed(start_host, connect):  # noqa: F811 - the fixture
    host = connect(start_host(BAE_SANDBOX_WARM="1"))
    await host.allow(TEST_IMAGE)
    [spare] = await host.spares(1)
    await host.allow(MISSING_IMAGE)  # allowed, but not present: no spare of it can start
    await wait_for_async(lambda: spare not in spares(host.process.host_id), "the spare's removal")
    await asyncio.sleep(0.5)
    assert spares(host.process.host_id) == set()


async def test_shutdown_removes_spares_and_taken_spares(start_host, connect):  # noqa: F811 - the fixture
    host = connect(start_host(BAE_SANDBOX_WARM="2"))
    await host.allow(TEST_IMAGE)
    await host.spares(2)
    await host.start("ses_shutdown")
    await host.spares(2)
    assert len(containers_with(host.process.label)) == 3
    host.process.terminate()
    assert host.process.process.returncode == 0
    assert containers_with(host.process.label) == []


async def test_a_restarted_host_removes_the_spares_of_its_previous_run(start_host, connect):  # noqa: F811 - the fixture
    host = connect(start_host(BAE_SANDBOX_WARM="1"))
    await host.allow(TEST_IMAGE)
    [spare] = await host.spares(1)
    host.process.kill()
    assert spare in spares(host.process.host_id)
    start_host(host.process.host_id)  # no BAE_SANDBOX_WARM: it keeps no spares, and removes the old
    assert containers_with(host.process.label) == []


async def test_without_warm_no_container_runs_before_a_start(start_host, connect):  # noqa: F811 - the fixture
    host = connect(start_host())
    await host.allow(TEST_IMAGE)
    await host.stub.EnsureImage(sandbox_pb2.EnsureImageRequest(image=TEST_IMAGE), timeout=30)
    await asyncio.sleep(1)
    assert containers_with(host.process.label) == []
    sandbox_id = await host.start("ses_cold")
    await asyncio.sleep(1)
    assert [c.id for c in containers_with(host.process.label)] == [sandbox_id]


# -- through the gateway ------------------------------------------------------------------------


@pytest.fixture
def warm_stack(mock, tmp_path):
    require_docker()
    mock.reset()
    host_id = f"test-warm-{uuid.uuid4().hex[:12]}"
    with stack_with_sandbox_hosts(
        tmp_path, mock.base_url, host_id, MOCK_LLM_TOKEN="t0ken-for-tests", BAE_SANDBOX_HOST_ID=host_id,
        BAE_SANDBOX_WARM="1",
    ) as running:
        yield running, host_id


class Session:
    def __init__(self, stack, key: str) -> None:
        self.stack = stack
        opened = stack.open_session(key)
        self.sid, self.skey = opened["session_id"], opened["session_key"]
        self.ok("session.registerDriver")

    def ok(self, method: str, params: dict | None = None) -> dict:
        return result(rpc(self.stack.client, self.sid, self.skey, method, params))

    def start(self) -> str:
        return self.ok("session.startRemoteSandbox", {"image": TEST_IMAGE})["sandbox_id"]

    def echo(self, text: str) -> str:
        return self.ok("session.execRemoteSandbox", {"command": f"echo {text}"})["stdout"]


def test_a_session_start_is_served_from_the_pool_which_refills(warm_stack):
    stack, host_id = warm_stack
    key = stack.create_key(stack.create_profile("warm", available_sandboxes=[TEST_IMAGE])["id"])["key"]
    # The profile's provisioning told the host its images: a spare is started before any session asks.
    [spare] = wait_for(lambda: spares(host_id) or None, "a warm spare")
    session = Session(stack, key)
    assert session.start() == spare
    assert session.echo("warm") == "warm\n"
    refill = wait_for(lambda: spares(host_id) - {spare} or None, "a new spare")
    assert len(refill) == 1
    assert session.ok("session.stopRemoteSandbox")["sandbox_id"] == spare
    wait_for(lambda: spares(host_id) == refill, "the taken spare's removal")


def test_two_sessions_starting_at_once_get_different_containers(warm_stack):
    stack, host_id = warm_stack
    key = stack.create_key(stack.create_profile("race", available_sandboxes=[TEST_IMAGE])["id"])["key"]
    [spare] = wait_for(lambda: spares(host_id) or None, "a warm spare")
    sessions = [Session(stack, key) for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(Session.start, sessions))
    assert len(set(started)) == 2 and spare in started
    for n, session in enumerate(sessions):
        assert session.echo(f"s{n}") == f"s{n}\n"


def test_a_session_service_restart_adopts_taken_spares_and_leaves_free_ones(warm_stack):
    stack, host_id = warm_stack
    key = stack.create_key(stack.create_profile("restart", available_sandboxes=[TEST_IMAGE])["id"])["key"]
    wait_for(lambda: spares(host_id) or None, "a warm spare")
    first = Session(stack, key)
    taken = first.start()
    [free] = wait_for(lambda: spares(host_id) - {taken} or None, "a new spare")

    stack.stack.restart("session")
    # The driver's registration is in the log: it goes on without registering again.
    assert first.echo("again") == "again\n", "the taken spare is the session's after the restart"
    assert spares(host_id) == {taken, free}, "reconciliation stopped a spare"
    assert Session(stack, key).start() == free
