"""Scale-out figures on PostgreSQL (a server the benchmark starts, as the tests do).

- REST: authenticated GET events, 1 client, p50 on SQLite against PostgreSQL;
- turns per second across 64 sessions with 1 and with 2 session replicas;
- failover: SIGKILL the replica that owns a session, then time until the next
  turn on that session succeeds (lease of FAILOVER_LEASE seconds).
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
import time
from pathlib import Path

import httpx

from testkit.ports import consecutive_ports
from testkit.postgres_support import server as postgres_server
from testkit.stack import launch_stack, mock_provider_toml

SESSIONS = 64
TURNS_PER_SESSION = 8
FAILOVER_LEASE = 3


def _launch(tmp: Path, name: str, mock, token: str, **env: str):
    path = tmp / name
    path.mkdir()
    return launch_stack(path, mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=token, BAE_LOG="warning", **env)


def _replicated_env(url: str, replicas: int, **extra: str) -> dict[str, str]:
    return {"BAE_DATABASE_URL": url, "BAE_SESSION_REPLICAS": str(replicas),
            "BAE_SESSION_GRPC_ADDR": f"127.0.0.1:{consecutive_ports(2)}", **extra}


async def _rest_p50(running, key: str, open_session, load, percentile) -> float:
    async with httpx.AsyncClient(base_url=running.stack.client_url, timeout=30) as client:
        sid, skey = await open_session(client, key)
        auth = {"Authorization": f"Bearer {skey}"}
        for _ in range(200):
            await client.get(f"/api/v1/sessions/{sid}/events", headers=auth)
        samples, _ = await load(lambda c: c.get(f"/api/v1/sessions/{sid}/events", headers=auth), 1, 2000,
                                running.stack.client_url)
    return percentile(samples, 0.5) * 1000


async def _turns_per_second(running, key: str, open_session, rpc) -> float:
    url = running.stack.client_url
    drivers = [httpx.AsyncClient(base_url=url, timeout=120) for _ in range(SESSIONS)]
    pairs = [await open_session(driver, key) for driver in drivers]
    for driver, (sid, skey) in zip(drivers, pairs):
        await rpc(driver, sid, skey, "session.registerDriver")
        await rpc(driver, sid, skey, "session.sendMessage", {"message": {"content": "hi"}})

    async def drive(driver, sid, skey):
        for _ in range(TURNS_PER_SESSION):
            await rpc(driver, sid, skey, "session.sendMessage", {"message": {"content": "hi"}})

    started = time.perf_counter()
    await asyncio.gather(*(drive(d, s, k) for d, (s, k) in zip(drivers, pairs)))
    wall = time.perf_counter() - started
    for driver in drivers:
        await driver.aclose()
    return SESSIONS * TURNS_PER_SESSION / wall


async def _failover_seconds(running, key: str, open_session, rpc) -> float:
    """SIGKILL the owner of a fresh session; seconds until a turn on it succeeds again."""
    url = running.stack.client_url
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        sessions = [await open_session(client, key) for _ in range(2)]  # one on each replica
        sid, skey = sessions[-1]
        await rpc(client, sid, skey, "session.registerDriver")
        await rpc(client, sid, skey, "session.sendMessage", {"message": {"content": "hi"}})
        owner = await _owner_of(running, sid)
        process = running.stack.processes[owner]
        killed = time.perf_counter()
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        while True:
            try:
                await rpc(client, sid, skey, "session.registerDriver")
                await rpc(client, sid, skey, "session.sendMessage", {"message": {"content": "after"}})
                return time.perf_counter() - killed
            except (AssertionError, KeyError, ValueError, httpx.HTTPError):
                await asyncio.sleep(0.05)


async def _owner_of(running, sid: str) -> str:
    import asyncpg

    conn = await asyncpg.connect(running.stack.env["BAE_DATABASE_URL"])
    try:
        address = await conn.fetchval("SELECT replica_id FROM session_leases WHERE session_id = $1", sid)
    finally:
        await conn.close()
    host, _, port = running.stack.env["BAE_SESSION_GRPC_ADDR"].rpartition(":")
    return "session" if address == f"{host}:{port}" else "session-1"


async def bench_replicas(mock, token: str, *, client_key, open_session, rpc, load, percentile) -> None:
    print("\n== Scale-out (PostgreSQL) ==")
    try:
        postgres = postgres_server()
    except BaseException as exc:  # pytest's skip outside pytest: no PostgreSQL here
        print(f"  skipped: {exc}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sqlite = _launch(root, "sqlite", mock, token)
        try:
            sqlite_p50 = await _rest_p50(sqlite, client_key(sqlite), open_session, load, percentile)
        finally:
            sqlite.close()
        throughput: dict[int, float] = {}
        for replicas in (1, 2):
            url = postgres.database_url(f"bench-replicas-{replicas}-{time.time_ns()}")
            running = _launch(root, f"pg{replicas}", mock, token, **_replicated_env(url, replicas))
            try:
                key = client_key(running)
                if replicas == 1:
                    pg_p50 = await _rest_p50(running, key, open_session, load, percentile)
                throughput[replicas] = await _turns_per_second(running, key, open_session, rpc)
            finally:
                running.close()
        url = postgres.database_url(f"bench-failover-{time.time_ns()}")
        running = _launch(root, "failover", mock, token,
                          **_replicated_env(url, 2, BAE_SESSION_LEASE_SECONDS=str(FAILOVER_LEASE)))
        try:
            failover = await _failover_seconds(running, client_key(running), open_session, rpc)
        finally:
            running.close()
    print(f"{'REST GET events, 1 client, p50':<52} SQLite {sqlite_p50:6.2f} ms   PostgreSQL {pg_p50:6.2f} ms")
    for replicas, rate in throughput.items():
        print(f"{f'text turns across {SESSIONS} sessions, {replicas} replica(s)':<52} {rate:7.1f} turns/s")
    print(f"{f'failover (lease {FAILOVER_LEASE}s): kill -9 to next turn':<52} {failover:7.2f} s")
