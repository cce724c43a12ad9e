"""Limits: what the checks cost on the turn path, and what one key at its quotas costs the others.

Checks: a request spends its key's token bucket in the gateway (bae/services/gateway/rate_limit.py);
a provider call of a session with budgets first checks the session's usage totals and the key's
of today as the replica follows them (bae/services/session/engine/budgets.py: read once, then kept
by the charges it records; the key's day read again once KEY_TOTALS_MAX_AGE old).
Both are timed here in this process, on a real SQLite store with a month of usage rows: the p50
of each and of the two together, per provider call; and, apart, a check that reads the key's
day (a key's first call after KEY_TOTALS_MAX_AGE).

Isolation: on a stack with the [limits] defaults (50 requests per second per key, burst 100; two
open sessions per key here), another key's authenticated GET p50 while idle, then while one key,
from a process of its own (`python -m bench.limits hammer`), sends 10 times its rate over 8
connections (most answered 429 `rate_limited`) and opens sessions past its quota (429
`quota_exceeded`); rounds alternate, idle first.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

from bae.common.limits import Limits
from bench.common import TOKEN, client_key, load, ms, open_session, percentile
from bench.http1 import Connection
from bench.table import record
from bae.services.gateway.rate_limit import Bucket, RateLimit
from bae.services.session.engine.budgets import KEY_TOTALS_MAX_AGE, KeySpends, Spend, exhausted
from sqlalchemy import insert

from bae.common.timefmt import now
from bae.services.session.store import Store
from bae.services.session.store.schema import usage_totals
from testkit.stack import launch_stack, mock_provider_toml

BUDGETS = Limits(session_tokens=10**9, session_cost_usd=1000.0, key_daily_tokens=10**10, key_daily_cost_usd=10_000.0)
ISOLATION_LIMITS = "\n[limits]\nmax_open_sessions_per_key = 2\n"
ROUNDS = 3
# Requests per second each of the greedy key's 8 connections sends: 10 times its rate in all.
HAMMER_RATE = 60


async def _budget_samples(store: Store, session_id: str, key_id: str, count: int, key_max_age: float) -> list[float]:
    # What a turn's check holds: the live session's totals and this replica's view of the key's day.
    session_spend, key_spends = Spend(), KeySpends(max_age=key_max_age)
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        spent = await exhausted(store, BUDGETS, session_id, key_id,
                                session_spend=session_spend, key_spends=key_spends)
        assert spent is None
        samples.append(time.perf_counter() - started)
    return samples


def _bucket_samples(count: int) -> list[float]:
    limiter = RateLimit(None, Limits(requests_per_second_per_key=1e9, burst=10**9), None)  # type: ignore[arg-type]
    header = b"Bearer bae_" + b"x" * 43
    known = Bucket(1e9, 10**9, time.monotonic())
    known.asked_at = time.monotonic()  # a key whose policy is known: no question to the session service
    limiter.buckets[hashlib.blake2b(header, digest_size=16).digest()] = known
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        limiter._bucket(header, time.monotonic()).take(time.monotonic())
        samples.append(time.perf_counter() - started)
    return samples


async def bench_checks() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(f"sqlite:///{tmp}/bench.db")
        try:
            # 30 days of usage of 20 sessions of one key (today's among them).
            today = now()[:10]
            days = [today] + [f"2026-01-{day:02d}" for day in range(1, 30)]
            rows = [{"session_id": f"ses_{session}", "day": day, "client_key_id": "key_bench",
                     "profile_id": "pro_bench", "input_tokens": 1000, "output_tokens": 200,
                     "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0, "provider_calls": 1,
                     "turns": 1, "cost_nanousd": 10_000_000} for day in days for session in range(20)]
            await store.write(lambda conn: conn.execute(insert(usage_totals), rows))
            await _budget_samples(store, "ses_0", "key_bench", 200, KEY_TOTALS_MAX_AGE)  # warm
            # A key making calls: its day was read within the last KEY_TOTALS_MAX_AGE.
            budget = await _budget_samples(store, "ses_0", "key_bench", 2000, KEY_TOTALS_MAX_AGE)
            # A key's first call in a while: its day is read.
            reading = await _budget_samples(store, "ses_0", "key_bench", 2000, 0.0)
        finally:
            await store.close()
    bucket = _bucket_samples(100_000)
    p50 = percentile(budget, 0.5) + percentile(bucket, 0.5)
    print(f"{'limit checks: rate bucket (gateway, per request)':<52} p50 {percentile(bucket, 0.5) * 1e6:7.2f} µs")
    print(f"{'limit checks: budgets, key day read < 1 s ago':<52} p50 {ms(budget)}   p99 {ms(budget, 0.99)}")
    print(f"{'limit checks: budgets, reading the key day':<52} p50 {ms(reading)}   p99 {ms(reading, 0.99)}")
    record("limit checks on the turn path (rate bucket + all four budgets, per provider call)",
           f"p50 {p50 * 1000:.3f} ms", "-", "≤ 0.2 ms p50")


async def bench_isolation(mock) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        running = launch_stack(Path(tmp), mock_provider_toml(mock.base_url) + ISOLATION_LIMITS,
                               MOCK_LLM_TOKEN=TOKEN, BAE_LOG="warning")
        try:
            import httpx

            async with httpx.AsyncClient(base_url=running.client_url, timeout=30) as client:
                greedy = client_key(running)
                # The other key's own rate is far above what one client sends; the greedy one has the defaults.
                polite = client_key(running, limits={"requests_per_second_per_key": 1e6, "burst": 10**6})
                sid, skey = await open_session(client, polite)
                for _ in range(2):
                    await open_session(client, greedy)
            path = f"/api/v1/sessions/{sid}/events?limit=5"
            await asyncio.sleep(0.5)  # the gateway learned the polite key's policy from its first request

            async def polite_get(connection: Connection) -> None:
                status, _ = await connection.request("GET", path, token=skey)
                assert status == 200, status

            idle: list[float] = []
            loaded: list[float] = []
            refused = {"rate_limited": 0, "quota_exceeded": 0}
            for _ in range(ROUNDS):
                samples, _ = await load(polite_get, 1, 300, running.client_url, lean=True)
                idle += samples
                # The greedy key's client is a process of its own, as it would be another machine's
                # (it still shares this host's cores): its work never delays this loop's timing.
                hammering = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "bench.limits", "hammer", running.client_url, path, greedy,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                )
                assert hammering.stdout is not None
                assert await hammering.stdout.readline() == b"hammering\n"
                await asyncio.sleep(0.5)
                samples, _ = await load(polite_get, 1, 300, running.client_url, lean=True)
                loaded += samples
                counted, _ = await hammering.communicate(b"stop\n")
                for kind, count in json.loads(counted).items():
                    refused[kind] += count
        finally:
            running.close()
    ratio = percentile(loaded, 0.5) / percentile(idle, 0.5)
    print(f"{'another key, GET events, idle':<52} p50 {ms(idle)}   p99 {ms(idle, 0.99)}")
    print(f"{'another key, GET events, one key at its quotas':<52} p50 {ms(loaded)}   p99 {ms(loaded, 0.99)}"
          f"   ({(ratio - 1) * 100:+.1f}%; refused {refused['rate_limited']} rate_limited, "
          f"{refused['quota_exceeded']} quota_exceeded)")
    record("another key's GET p50 while one key is at its quotas", f"{ms(loaded)} ({(ratio - 1) * 100:+.1f}%)",
           f"idle {ms(idle)}", "within 20 %")


async def bench_limits(mock) -> None:
    await bench_checks()
    await bench_isolation(mock)


async def hammer(url: str, path: str, token: str) -> None:
    """The greedy key: 8 connections at HAMMER_RATE each, six reading events and two opening
    sessions; says "hammering" once they are open, stops when a line arrives on stdin, and
    prints the refusals it got, as JSON."""
    refused = {"rate_limited": 0, "quota_exceeded": 0}
    stop = asyncio.Event()

    async def one(kind: str, connection: Connection) -> None:
        try:
            while not stop.is_set():
                await asyncio.sleep(1 / HAMMER_RATE)
                if kind == "rest":
                    status, body = await connection.request("GET", path, token=token)
                else:
                    status, body = await connection.request("POST", "/api/v1/sessions", token=token, body={})
                if status == 429:
                    refused["quota_exceeded" if b"quota_exceeded" in body else "rate_limited"] += 1
        finally:
            await connection.close()

    connections = [await Connection.open(url) for _ in range(8)]
    hammers = [asyncio.create_task(one("rest" if index % 4 else "open", connection))
               for index, connection in enumerate(connections)]
    print("hammering", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    stop.set()
    await asyncio.gather(*hammers)
    print(json.dumps(refused))


if __name__ == "__main__" and sys.argv[1:2] == ["hammer"]:
    asyncio.run(hammer(*sys.argv[2:5]))
