"""Discovery (bae/common/discovery.py): names resolved to every address, handed to a real SandboxPool."""

from __future__ import annotations

import asyncio
import socket

import pytest

from bae.common.internal import InternalPlane
from bae.common.discovery import Discovery, needs_discovery, resolve_all
from bae.services.session.remote.sandbox_pool import SandboxPool

pytestmark = pytest.mark.unit


class ScriptedDns:
    """Answers per name; a missing name fails like a real NXDOMAIN."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.answers[host])


@pytest.fixture
async def pool():
    pool = SandboxPool([], rpc_timeout=1.0, plane=InternalPlane("t" * 32, keepalive=30.0))
    yield pool
    await pool.close()


def hosts(pool: SandboxPool) -> list[str]:
    return list(pool.running_counts())


async def test_names_become_every_address_and_literals_pass_through(pool):
    dns = ScriptedDns({"sandbox": ["10.0.0.2", "10.0.0.1", "fd00::3"]})
    targets = ["sandbox:50053", "127.0.0.1:7000", "[::1]:7001"]
    discovery = Discovery(pool, targets, what="sandbox hosts", resolve=dns)
    expected = ["10.0.0.1:50053", "10.0.0.2:50053", "[fd00::3]:50053", "127.0.0.1:7000", "[::1]:7001"]
    assert await discovery.refresh() == expected
    assert hosts(pool) == expected
    assert dns.asked == [("sandbox", 50053)]  # literals are never looked up


async def test_scaling_up_and_down_replaces_the_pool_hosts(pool):
    dns = ScriptedDns({"sandbox": ["10.0.0.1"]})
    discovery = Discovery(pool, ["sandbox:50053"], what="sandbox hosts", resolve=dns)
    await discovery.refresh()
    dns.answers["sandbox"] = ["10.0.0.1", "10.0.0.7", "10.0.0.4"]
    await discovery.refresh()
    assert hosts(pool) == ["10.0.0.1:50053", "10.0.0.4:50053", "10.0.0.7:50053"]
    dns.answers["sandbox"] = ["10.0.0.7"]
    await discovery.refresh()
    assert hosts(pool) == ["10.0.0.7:50053"]


async def test_a_failed_lookup_keeps_the_last_answer_and_an_unknown_name_stays_a_name(pool):
    dns = ScriptedDns({"sandbox": ["10.0.0.1", "10.0.0.2"]})
    discovery = Discovery(pool, ["sandbox:50053", "later:50053"], what="sandbox hosts", resolve=dns)
    await discovery.refresh()
    assert hosts(pool) == ["10.0.0.1:50053", "10.0.0.2:50053", "later:50053"]
    del dns.answers["sandbox"]
    await discovery.refresh()
    assert hosts(pool) == ["10.0.0.1:50053", "10.0.0.2:50053", "later:50053"]
    dns.answers["later"] = ["10.0.1.1"]
    await discovery.refresh()
    assert hosts(pool) == ["10.0.0.1:50053", "10.0.0.2:50053", "10.0.1.1:50053"]


async def test_the_periodic_task_follows_changes_until_closed(pool):
    dns = ScriptedDns({"sandbox": ["10.0.0.1"]})
    discovery = Discovery(pool, ["sandbox:50053"], what="sandbox hosts", interval=0.02, resolve=dns)
    await discovery.refresh()
    discovery.start()
    dns.answers["sandbox"] = ["10.0.0.1", "10.0.0.2"]
    async with asyncio.timeout(2):
        while hosts(pool) != ["10.0.0.1:50053", "10.0.0.2:50053"]:
            await asyncio.sleep(0.01)
    await discovery.close()
    dns.answers["sandbox"] = ["10.0.0.9"]
    await asyncio.sleep(0.1)
    assert hosts(pool) == ["10.0.0.1:50053", "10.0.0.2:50053"]


async def test_the_real_resolver_answers_for_localhost():
    assert "127.0.0.1" in await resolve_all("localhost", 50053)
    with pytest.raises(OSError):
        await resolve_all("no-such-host.invalid", 50053)


def test_only_names_need_discovery():
    # localhost is one machine: gRPC tries its addresses (127.0.0.1, ::1) as one peer.
    assert not needs_discovery(["127.0.0.1:50053", "[::1]:50053", "localhost:50053", "LOCALHOST:50053"])
    assert needs_discovery(["127.0.0.1:50053", "sandbox:50053"])


async def test_a_name_that_keeps_failing_is_warned_about_once_until_it_resolves(pool, caplog):
    dns = ScriptedDns({})
    discovery = Discovery(pool, ["sandbox:50053"], what="sandbox hosts", resolve=dns)
    for _ in range(3):
        await discovery.refresh()
    dns.answers["sandbox"] = ["10.0.0.1"]
    await discovery.refresh()
    del dns.answers["sandbox"]
    await discovery.refresh()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "cannot resolve" in r.getMessage()]
    assert len(warnings) == 2, warnings
