"""SandboxPool (session side) against two real sandbox host processes and real Docker."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from bae.services.session.engine.ports import ExecResult
from bae.common.errors import BaeError, DeadlineExceeded, Forbidden
from bae.services.session.remote.sandbox_pool import SandboxPool
from testkit.docker_support import TEST_IMAGE, SandboxHostProcess, containers_with, require_docker
from testkit.processes import TEST_PLANE

pytestmark = [pytest.mark.stack, pytest.mark.docker]

TEST_PROFILE = "pro_tests"


@pytest.fixture
def hosts():
    """Two serving sandbox hosts; every container they started is removed afterwards."""
    require_docker()
    started = [SandboxHostProcess(f"test-{uuid.uuid4().hex[:12]}") for _ in range(2)]
    try:
        for host in started:
            host.wait_serving()
        yield started
    finally:
        for host in started:
            host.stop()
            assert containers_with(host.label) == [], "a test left a container behind"


@pytest.fixture
async def pool(hosts):
    pool = SandboxPool([host.address for host in hosts], plane=TEST_PLANE, rpc_timeout=5, poll_interval=0.5)
    # The images hosts may start are the ones some profile declares.
    pool.provision(TEST_PROFILE, [TEST_IMAGE])
    yield pool
    await pool.close()


async def test_placement_goes_to_the_least_loaded_host(pool, hosts):
    first = await pool.start("ses_a", TEST_IMAGE)
    second = await pool.start("ses_b", TEST_IMAGE)
    assert {first.host, second.host} == {hosts[0].address, hosts[1].address}
    await pool.stop(first)
    third = await pool.start("ses_c", TEST_IMAGE)
    assert third.host == first.host  # the host that became empty again
    assert pool.running_counts() == {hosts[0].address: 1, hosts[1].address: 1}

    result = await pool.exec(third, "echo hi; echo err >&2; exit 4")
    assert result == ExecResult(stdout="hi\n", stderr="err\n", exit_code=4)
    for handle in (second, third):
        await pool.stop(handle)
    assert pool.running_counts() == {hosts[0].address: 0, hosts[1].address: 0}


async def test_concurrent_starts_spread_over_the_hosts(pool, hosts):
    handles = await asyncio.gather(*(pool.start(f"ses_{n}", TEST_IMAGE) for n in range(4)))
    assert sorted(handle.host for handle in handles) == sorted([hosts[0].address, hosts[1].address] * 2)
    await asyncio.gather(*(pool.stop(handle) for handle in handles))


async def test_the_hosts_own_exec_timeout_applies():
    """The pool sends no timeout of its own: the host's BAE_SANDBOX_EXEC_TIMEOUT decides."""
    require_docker()
    host = SandboxHostProcess(f"test-{uuid.uuid4().hex[:12]}", BAE_SANDBOX_EXEC_TIMEOUT="1")
    try:
        host.wait_serving()
        pool = SandboxPool([host.address], plane=TEST_PLANE, rpc_timeout=5, poll_interval=0.5)
        pool.provision(TEST_PROFILE, [TEST_IMAGE])
        handle = await pool.start("ses_t", TEST_IMAGE)
        started = time.monotonic()
        with pytest.raises(BaeError) as caught:
            await pool.exec(handle, "sleep 20")
        assert isinstance(caught.value, DeadlineExceeded) and caught.value.detail == "command timed out after 1s"
        assert time.monotonic() - started < 10
        await pool.stop(handle)
        await pool.close()
    finally:
        host.stop()
        assert containers_with(host.label) == []


async def test_a_killed_host_fails_its_calls_fast_and_new_sandboxes_go_elsewhere(pool, hosts):
    handles = [await pool.start(f"ses_{n}", TEST_IMAGE) for n in range(2)]
    victim = next(h for h in handles if h.host == hosts[0].address)
    survivor = next(h for h in handles if h.host == hosts[1].address)
    hosts[0].kill()

    for call in (pool.exec(victim, "echo still here?"), pool.stop(victim)):
        started = time.monotonic()
        with pytest.raises(BaeError) as caught:
            await call
        assert time.monotonic() - started < 2
        assert caught.value.detail == "the sandbox host is unavailable"

    placed = [await pool.start(f"ses_new{n}", TEST_IMAGE) for n in range(2)]
    assert {handle.host for handle in placed} == {hosts[1].address}
    assert (await pool.exec(survivor, "echo ok")).stdout == "ok\n"
    for handle in (survivor, *placed):
        await pool.stop(handle)


async def test_no_healthy_host_is_a_clean_error():
    pool = SandboxPool(["127.0.0.1:1"], plane=TEST_PLANE, rpc_timeout=2, poll_interval=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(BaeError) as caught:
            await pool.start("ses_x", TEST_IMAGE)
        assert caught.value.detail == "no sandbox host is available"
        assert time.monotonic() - started < 3
    finally:
        await pool.close()


async def test_provisioning_goes_from_pending_to_available_or_error(pool):
    pool.forget(TEST_PROFILE)
    missing = f"bae-no-such-image-{uuid.uuid4().hex[:8]}:never"
    pool.provision("pro_b", [TEST_IMAGE, missing])
    pool.provision("pro_a", [TEST_IMAGE])
    pool.provision("pro_empty", [])
    assert pool.status_for("pro_b") == [
        {"name": TEST_IMAGE, "status": "pending"},
        {"name": missing, "status": "pending"},
    ]

    async def settled() -> bool:
        return all(e["status"] != "pending" for p in ("pro_a", "pro_b") for e in pool.status_for(p))

    async with asyncio.timeout(30):
        while not await settled():
            await asyncio.sleep(0.1)

    view = pool.status_view()
    assert [item["profile_id"] for item in view["items"]] == ["pro_a", "pro_b"]
    assert view["items"][0]["images"] == [{"name": TEST_IMAGE, "status": "available"}]
    images_b = view["items"][1]["images"]
    assert [image["name"] for image in images_b] == sorted([TEST_IMAGE, missing])
    by_name = {image["name"]: image for image in images_b}
    assert by_name[TEST_IMAGE] == {"name": TEST_IMAGE, "status": "available"}
    assert by_name[missing]["status"] == "error"
    assert by_name[missing]["detail"].startswith(f'cannot pull image "{missing}": ')

    pool.provision("pro_b", [TEST_IMAGE])  # a replace resets the set
    assert pool.status_for("pro_b") == [{"name": TEST_IMAGE, "status": "pending"}]
    pool.forget("pro_a")
    assert [item["profile_id"] for item in pool.status_view()["items"]] == ["pro_b"]


async def test_set_addrs_adds_and_retires_hosts(pool, hosts):
    pool.set_addrs([hosts[1].address])
    handle = await pool.start("ses_only", TEST_IMAGE)
    assert handle.host == hosts[1].address
    pool.set_addrs([hosts[0].address])
    with pytest.raises(BaeError) as caught:
        await pool.exec(handle, "true")
    assert caught.value.detail == "the sandbox's host is no longer configured"
    placed = await pool.start("ses_back", TEST_IMAGE)
    assert placed.host == hosts[0].address
    await pool.stop(placed)


async def test_hosts_start_only_images_some_profile_declares(pool, hosts):
    other = f"bae-undeclared-{uuid.uuid4().hex[:8]}:1"
    with pytest.raises(BaeError) as caught:
        await pool.start("ses_other", other)
    assert isinstance(caught.value, Forbidden)  # the host's own kind, raised again here
    assert caught.value.detail == f'image "{other}" is not allowed on this sandbox host: no profile declares it'
    pool.forget(TEST_PROFILE)  # no profile declares TEST_IMAGE any more
    with pytest.raises(BaeError) as caught:
        await pool.start("ses_gone", TEST_IMAGE)
    assert "is not allowed on this sandbox host" in caught.value.detail
    assert all(containers_with(host.label) == [] for host in hosts)


async def test_a_restarted_host_is_told_the_allowed_images_again(pool, hosts):
    pool.set_addrs([hosts[0].address])
    await pool.stop(await pool.start("ses_before", TEST_IMAGE))
    hosts[0].kill()
    hosts[0] = SandboxHostProcess(hosts[0].host_id, address=hosts[0].address)
    hosts[0].wait_serving()
    await pool.poll()
    handle = await pool.start("ses_after", TEST_IMAGE)  # the fresh host knows no images: the pool re-sends them
    assert handle.host == hosts[0].address
    await pool.stop(handle)


async def test_provisioning_without_any_host_ends_in_error():
    pool = SandboxPool(["127.0.0.1:1"], plane=TEST_PLANE, rpc_timeout=1, poll_interval=0.2, host_wait=0.5)
    try:
        pool.provision("pro_x", [TEST_IMAGE])
        assert pool.status_for("pro_x") == [{"name": TEST_IMAGE, "status": "pending"}]
        async with asyncio.timeout(10):
            while pool.status_for("pro_x")[0]["status"] == "pending":
                await asyncio.sleep(0.1)
        assert pool.status_for("pro_x") == [
            {"name": TEST_IMAGE, "status": "error", "detail": "no sandbox host is available"}
        ]
    finally:
        await pool.close()
