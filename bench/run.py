"""Benchmarks: start a private stack on loopback and print latency/throughput figures.

    make bench                 # everything
    make bench ARGS="rest"     # only the REST figures; also "turns", "observers", "compaction",
                               # "replicas", "sandbox" (bench/sandbox.py), "limits" (bench/limits.py),
                               # "storage" (bench/storage.py), "retention" (bench/retention.py),
                               # "webhooks" (bench/webhooks.py), "console" (bench/console.py),
                               # "streaming" (bench/streaming.py), "cpu" or "telemetry"
    .venv/bin/python -m bench.run rest     # the same, from the repository root

The load generator shares the stack's cores, so the client side is kept lean: REST GETs,
turns and observers go through bench/http1.py (a bare HTTP/1.1 connection); one GET line
goes through httpx too, for comparison with figures taken that way.

REST: authenticated GET /api/v1/sessions/{id}/events and POST /api/v1/sessions
with 1 and 16 concurrent clients, next to one Argon2id verification
(64 MiB, t=3) — what a per-request slow hash would cost.
Turns: a simple text turn through gateway -> session -> runner -> mock LLM,
against the same mock called directly with the anthropic SDK: one session at a
time (new sessions of 10 turns, so the history stays small), then 8 and 64
concurrent sessions; and a session with 2,000 prior events against fresh ones,
each less its own provider call made directly (the body grows with the history),
after the latency of the 500 turns that build it (their tail shows writes held up
by the database, such as a checkpoint inside a commit).
Compaction: a session of about 2,000 events before and after `session.compact`:
the provider request body, the turn's added latency, and what one compaction
run costs over the same provider call made directly.
Replicas (bench/replicas.py): on a PostgreSQL server it starts, REST p50 against
SQLite, turns per second across 64 sessions with 1 and 2 session replicas, and
the failover time after a replica is killed.
Observers: 100 `session.subscribe` streams on one session, each event's arrival
against the driver's own stream, both stamped when the bytes are read (not after the
load generator parsed them), and the gateway's and session service's CPU time per event
delivered to one observer.
CPU: the CPU time each process (gateway, session service, runner, mock LLM and the load
generator itself) spends per authenticated GET with 16 clients and per text turn across 64
sessions, read from /proc: where the cores go when they are the limit.
Streaming (bench/streaming.py): time to the first `session.delta` through the stack against the
same streaming call made directly with the SDK, the streaming turn's added latency next to the
non-streaming turn's (same answer), and deltas per second to 1 and to 100 delta subscribers.
Console (bench/console.py): what the web console watching a session (an SSE subscriber on the admin
port, with and without deltas) adds to its text turns, in alternating runs, next to an A/A figure.
Telemetry (only when asked for): REST p50 and text-turn latency with [telemetry]
off, and on at sample ratio 1.0 exporting to the tests' OTLP receiver; two rounds,
alternating, on fresh stacks.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bae.launcher.stack import Stack
from bench.http1 import Connection, StampedStream, rpc as lean_rpc, timed_rpc
from bench.common import (
    TOKEN,
    MockProcess,
    client_key,
    load,
    ms,
    open_session,
    percentile,
    report,
    rpc,
    start_stack,
)
from bench.table import print_table, record
from bae.services.runner.clients import ANTHROPIC, ProviderClients
from testkit import ROOT
from testkit.ports import free_port
from testkit.stack import launch_stack, mock_provider_toml


async def health_floor(address: str) -> list[float]:
    """A bare gRPC health call to the session service: the floor of any call through the gateway."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest()
        for _ in range(200):
            await stub.Check(request, timeout=5)
        samples, _ = await load(lambda _: stub.Check(request, timeout=5), 1, 2000)
    return samples


async def bench_rest(stack: Stack, key: str) -> None:
    print("\n== REST ==")
    floor = await health_floor(stack.settings.session_grpc_addr)
    report("gRPC health call straight to the session service", floor, sum(floor))
    async with httpx.AsyncClient(base_url=stack.client_url, timeout=30) as client:
        sid, skey = await open_session(client, key)
        auth = {"Authorization": f"Bearer {skey}"}
        events = f"/api/v1/sessions/{sid}/events?limit=1"
        for _ in range(200):  # warm up
            await client.get(events, headers=auth)
        url = stack.client_url
        samples, wall = await load(lambda c: c.get(events, headers=auth), 1, 3000, url)
        report("GET events?limit=1 (authenticated), 1 httpx client", samples, wall)
        for concurrency in (1, 16):
            samples, wall = await load(lambda c: c.request("GET", events, token=skey), concurrency, 3000, url, lean=True)
            report(f"GET events?limit=1 (authenticated), {concurrency} client(s)", samples, wall)
            if concurrency == 1:
                record("authenticated `GET …/events?limit=1`, 1 client", f"p50 {ms(samples)}",
                       f"a bare gRPC health call, p50 {ms(floor)}", "p50 ≤ 1.0 ms")
            else:
                record("same, 16 clients", f"{len(samples) / wall:,.0f} req/s", "-", "≥ 2,000 req/s")
        for concurrency in (1, 16):
            samples, wall = await load(lambda c: open_session(c, key), concurrency, 1000, url)
            report(f"POST /api/v1/sessions, {concurrency} client(s)", samples, wall)

    from argon2 import PasswordHasher

    hasher = PasswordHasher(time_cost=3, memory_cost=65536, parallelism=1, hash_len=32)
    digest = hasher.hash("bae_" + "0" * 48)
    samples = []
    for _ in range(5):
        started = time.perf_counter()
        hasher.verify(digest, "bae_" + "0" * 48)
        samples.append(time.perf_counter() - started)
    print(f"{'one Argon2id verification (64 MiB, t=3)':<52} p50 {statistics.median(samples) * 1000:7.2f} ms")



def print_added(samples: list[float], baseline: float, baseline_p99: float) -> None:
    """Latency the stack adds on top of calling the mock directly, at p50 and p99."""
    p50 = (percentile(samples, 0.5) - baseline) * 1000
    p99 = (percentile(samples, 0.99) - baseline_p99) * 1000
    print(f"{'  added latency vs direct SDK call':<52} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms")


SEND = {"message": {"content": "hi"}}


async def turn_drivers(url: str, pairs: list[tuple[str, str]]) -> list[Connection]:
    """One connection per (session id, key) pair, as separate clients would have, each registered
    as its session's driver and warmed up with one turn."""
    drivers = [await Connection.open(url) for _ in pairs]
    for driver, (sid, skey) in zip(drivers, pairs):
        await lean_rpc(driver, sid, skey, "session.registerDriver")
        await lean_rpc(driver, sid, skey, "session.sendMessage", SEND)
    return drivers


async def text_turns(drivers: list[Connection], pairs: list[tuple[str, str]], per_session: int,
                     samples: list[float] | None = None) -> float:
    """`per_session` text turns in every session at once; each turn's latency goes to `samples`.
    Returns the wall time."""
    async def drive(driver: Connection, sid: str, skey: str) -> None:
        for _ in range(per_session):
            elapsed, _ = await timed_rpc(driver, sid, skey, "session.sendMessage", SEND)
            if samples is not None:
                samples.append(elapsed)

    started = time.perf_counter()
    await asyncio.gather(*(drive(d, s, k) for d, (s, k) in zip(drivers, pairs)))
    return time.perf_counter() - started


async def close_all(connections: list[Connection]) -> None:
    for connection in connections:
        await connection.close()


TURNS_PER_SHORT_SESSION = 10
LONG_HISTORY_TURNS = 500  # each text turn writes 4 events: about 2,000
# Alternating rounds of 10 turns of each kind: the ratio of two medians of 50 turns each moved by
# about ±0.1 from one run to the next, more than the changes it is meant to show.
LONG_HISTORY_ROUNDS = 10


async def short_session_turns(client: httpx.AsyncClient, url: str, key: str, total: int) -> tuple[list[float], float]:
    """`total` text turns, one at a time, in new sessions of TURNS_PER_SHORT_SESSION turns each, so
    that every turn is a simple one: its history stays under 25 messages. Returns (samples, wall)."""
    samples: list[float] = []
    wall = 0.0
    for _ in range(total // TURNS_PER_SHORT_SESSION):
        pair = await open_session(client, key)
        drivers = await turn_drivers(url, [pair])
        wall += await text_turns(drivers, [pair], TURNS_PER_SHORT_SESSION, samples)
        await close_all(drivers)
    return samples, wall


async def provider_calls(clients: ProviderClients, mock: MockProcess, messages: list, count: int) -> list[float]:
    """The provider call of a turn with `messages`, made directly the way the runner makes it: the
    runner's own client (bae/services/runner/clients.py) posting the same body through the SDK."""
    body = {"model": "mock-model", "max_tokens": 4096, "messages": messages}
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await clients.post(ANTHROPIC, mock.base_url, TOKEN, body)
        samples.append(time.perf_counter() - started)
    return samples


async def bench_turns(stack: Stack, key: str, mock: MockProcess) -> None:
    print("\n== Turns ==")
    from anthropic import AsyncAnthropic

    direct = AsyncAnthropic(base_url=mock.base_url, api_key=TOKEN, max_retries=0)
    body = {"model": "mock-model", "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(50):
        await direct.messages.create(**body)
    samples, wall = await load(lambda _: direct.messages.create(**body), 1, 300)
    report("mock LLM called directly with the anthropic SDK", samples, wall)
    baseline, baseline_p99 = percentile(samples, 0.5), percentile(samples, 0.99)

    url = stack.client_url
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        samples, wall = await short_session_turns(client, url, key, 300)
        report(f"text turn through the stack, 1 session at a time ({TURNS_PER_SHORT_SESSION} turns each)",
               samples, wall)
        print_added(samples, baseline, baseline_p99)
        added = (percentile(samples, 0.5) - baseline) * 1000
        added99 = (percentile(samples, 0.99) - baseline_p99) * 1000
        record("simple text turn, added over the same provider call made directly",
               f"+{added:.2f} ms p50; +{added99:.1f} ms p99", "0", "≤ 3 ms p50, p99 ≤ 15 ms")
        for sessions in (8, 64):
            pairs = [await open_session(client, key) for _ in range(sessions)]
            per_session = max(300 // sessions, 10)
            all_samples: list[float] = []
            drivers = await turn_drivers(url, pairs)
            wall = await text_turns(drivers, pairs, per_session, all_samples)
            await close_all(drivers)
            report(f"text turn through the stack, {sessions} sessions", all_samples, wall)
            print_added(all_samples, baseline, baseline_p99)
            if sessions == 64:
                record("simple turns across 64 sessions", f"{len(all_samples) / wall:.0f} turns/s", "-",
                       "≥ 400 turns/s")
        await bench_long_history(client, url, key, mock)


async def bench_long_history(client: httpx.AsyncClient, url: str, key: str, mock: MockProcess) -> None:
    """What a session of 2,000 events adds to a turn, against a fresh session. The provider call
    itself grows with the history it carries (the mock reads a body of about 60 KB), so the
    stack's added latency is each turn less the same provider call made directly; both kinds
    of turn and both direct calls are measured in alternating rounds."""
    sid, skey = await open_session(client, key)
    driver = await Connection.open(url)
    await lean_rpc(driver, sid, skey, "session.registerDriver")
    print("  building a session with 2,000 prior events ...", flush=True)
    building = [(await timed_rpc(driver, sid, skey, "session.sendMessage", SEND))[0] for _ in range(LONG_HISTORY_TURNS)]
    report(f"text turns building it (history 0 -> {LONG_HISTORY_TURNS * 2} messages)", building[1:], sum(building[1:]))
    long_history = await last_request_messages(client, sid, skey)
    freeze_heap()
    fresh: list[float] = []
    long: list[float] = []
    direct_fresh: list[float] = []
    direct_long: list[float] = []
    clients = ProviderClients(timeout=30)
    await provider_calls(clients, mock, long_history, 10)  # warm up
    for _ in range(LONG_HISTORY_ROUNDS):
        fresh += (await short_session_turns(client, url, key, TURNS_PER_SHORT_SESSION))[0]
        for _ in range(TURNS_PER_SHORT_SESSION):
            long.append((await timed_rpc(driver, sid, skey, "session.sendMessage", SEND))[0])
        direct_fresh += await provider_calls(clients, mock, [{"role": "user", "content": "hi"}], 20)
        direct_long += await provider_calls(clients, mock, long_history, 20)
    await clients.close()
    await driver.close()
    report("text turn on a fresh session", fresh, sum(fresh))
    report("text turn on a session with 2,000+ prior events", long, sum(long))
    report("  its provider call made directly, fresh", direct_fresh, sum(direct_fresh))
    report(f"  its provider call made directly, {len(long_history)} messages", direct_long, sum(direct_long))
    added_fresh = percentile(fresh, 0.5) - percentile(direct_fresh, 0.5)
    added_long = percentile(long, 0.5) - percentile(direct_long, 0.5)
    whole = percentile(long, 0.5) / percentile(fresh, 0.5)
    call = percentile(direct_long, 0.5) / percentile(direct_fresh, 0.5)
    print(f"{'  added latency at p50, fresh -> 2,000 events':<52} {added_fresh * 1000:7.2f} ms -> "
          f"{added_long * 1000:.2f} ms   (×{added_long / added_fresh:.2f})")
    print(f"{'  whole turn at p50, 2,000 events against fresh':<52} ×{whole:.2f}   "
          f"(the provider call alone ×{call:.2f})")
    record("added latency, 2,000-event session against a fresh one",
           f"×{added_long / added_fresh:.2f} (whole turn ×{whole:.2f})",
           f"×1.0 (the provider call alone ×{call:.2f})", "≤ ×1.1")


OBSERVERS = 100
OBSERVED_TURNS = 30


async def bench_observers(stack: Stack, key: str) -> None:
    """100 `session.subscribe` streams on one session: how long after the driver's own stream
    each observer receives the same event, both stamped when the load generator's event loop
    reads the bytes (bench/http1.py StampedStream), not after it parsed them."""
    print("\n== Observers ==")
    url = stack.client_url
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        sid, skey = await open_session(client, key)
        await rpc(client, sid, skey, "session.registerDriver")
    path = f"/api/v1/sessions/{sid}/rpc"
    subscribe = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe", "params": {}}
    observers = [await StampedStream.open(url, path, token=skey, body=subscribe) for _ in range(OBSERVERS)]
    turns: list[StampedStream] = []
    try:
        await asyncio.sleep(0.5)  # every subscription is in
        send = {"jsonrpc": "2.0", "id": 2, "method": "session.sendMessage", "params": {"message": {"content": "hi"}}}
        # /proc is Linux's: elsewhere the CPU line is left out.
        pids = {name: stack.processes[name].pid for name in ("gateway", "session") if sys.platform.startswith("linux")}
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        for _ in range(OBSERVED_TURNS):
            turns.append(await StampedStream.open(url, path, token=skey, body=send))
            await asyncio.wait_for(turns[-1].ended, 60)
        await asyncio.sleep(0.5)
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    finally:
        for stream in [*observers, *turns]:
            stream.close()

    def events(stream: StampedStream) -> dict[str, float]:
        return {frame["params"]["id"]: at for at, frame in stream.frames() if frame.get("method") == "session.event"}

    sent = {event_id: at for turn in turns for event_id, at in events(turn).items()}
    arrivals = [events(observer) for observer in observers]
    lags = [seen[event_id] - at for seen in arrivals for event_id, at in sent.items() if event_id in seen]
    missing = OBSERVERS * len(sent) - len(lags)
    print(f"{f'{OBSERVERS} observers, lag behind the driver':<52} p50 {ms(lags)}   p99 {ms(lags, 0.99)}"
          f"   ({len(sent)} events each, {missing} not received)")
    delivered = max(len(lags), 1)
    if cpu:
        print(f"{'  CPU per event delivered to an observer':<52} "
              + "  ".join(f"{name} {seconds / delivered * 1e6:.1f} µs" for name, seconds in cpu.items()))
    record(f"{OBSERVERS} observers on one session, lag behind the driver", f"p99 {ms(lags, 0.99)}", "-",
           "p99 ≤ 5 ms")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_cpu(stack: Stack, key: str, mock: MockProcess) -> None:
    print("\n== CPU per operation ==")
    if not sys.platform.startswith("linux"):
        print("  skipped: reads /proc, which only Linux has")
        return
    pids = {name: process.pid for name, process in stack.processes.items() if name != "sandbox"}
    pids["mock LLM"] = mock.process.pid
    url = stack.client_url

    async def measure(label: str, work, operations: int) -> None:
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        own = time.process_time()
        await work()
        spent = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
        spent["load generator"] = time.process_time() - own
        print(f"{label:<52} " + "  ".join(f"{name} {seconds / operations * 1000:.2f}" for name, seconds in spent.items())
              + "  (ms per operation)")

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        sid, skey = await open_session(client, key)
        pairs = [await open_session(client, key) for _ in range(64)]
    events = f"/api/v1/sessions/{sid}/events?limit=1"
    await load(lambda c: c.request("GET", events, token=skey), 16, 500, url, lean=True)  # warm up
    await measure("GET events?limit=1, 16 clients", lambda: load(
        lambda c: c.request("GET", events, token=skey), 16, 4000, url, lean=True), 4000)

    drivers = await turn_drivers(url, pairs)
    await measure("text turn, 64 sessions", lambda: text_turns(drivers, pairs, 10), 640)
    await close_all(drivers)


FILLER = "Here is some context the conversation has accumulated. " * 4


async def session_with_history(client: httpx.AsyncClient, key: str) -> tuple[str, str]:
    sid, skey = await open_session(client, key)
    await rpc(client, sid, skey, "session.registerDriver")
    for index in range(LONG_HISTORY_TURNS):
        await rpc(client, sid, skey, "session.sendMessage", {"message": {"content": f"{index}: {FILLER}"}})
    return sid, skey


async def last_request_messages(client: httpx.AsyncClient, sid: str, skey: str) -> list:
    """The `messages` of the session's newest provider.request, as the provider received them."""
    auth = {"Authorization": f"Bearer {skey}"}
    cursor, newest = None, None
    while True:
        page = (await client.get(f"/api/v1/sessions/{sid}/events", headers=auth,
                                 params={"limit": 200, **({"cursor": cursor} if cursor else {})})).json()
        newest = next((e for e in reversed(page["items"]) if e["event_type"] == "provider.request"), newest)
        cursor = page.get("next_cursor")
        if not cursor:
            return newest["payload"]["messages"]


async def timed_turns(client: httpx.AsyncClient, sid: str, skey: str, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await rpc(client, sid, skey, "session.sendMessage", {"message": {"content": "one more question"}})
        samples.append(time.perf_counter() - started)
    return samples


async def bench_compaction(stack: Stack, key: str, mock: MockProcess) -> None:
    print("\n== Compaction ==")
    from anthropic import AsyncAnthropic

    direct = AsyncAnthropic(base_url=mock.base_url, api_key=TOKEN, max_retries=0)
    small = {"model": "mock-model", "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(20):
        await direct.messages.create(**small)
    baseline_samples, _ = await load(lambda _: direct.messages.create(**small), 1, 100)
    baseline, baseline_p99 = percentile(baseline_samples, 0.5), percentile(baseline_samples, 0.99)

    async with httpx.AsyncClient(base_url=stack.client_url, timeout=300) as client:
        runs, direct_calls, sizes = [], [], []
        for round_ in range(3):
            print(f"  building session {round_ + 1}/3 with about 2,000 events ...", flush=True)
            sid, skey = await session_with_history(client, key)
            before = await timed_turns(client, sid, skey, 30)
            messages = await last_request_messages(client, sid, skey)
            sizes.append(len(json.dumps(messages, separators=(",", ":")).encode()))
            # The compaction's own provider call, made directly: the same history plus an instruction.
            big = {"model": "mock-model", "max_tokens": 4096,
                   "messages": [*messages, {"role": "user", "content": "Summarize."}]}
            for _ in range(3):
                started = time.perf_counter()
                await direct.messages.create(**big)
                direct_calls.append(time.perf_counter() - started)
            started = time.perf_counter()
            await rpc(client, sid, skey, "session.compact")
            runs.append(time.perf_counter() - started)
            after = await timed_turns(client, sid, skey, 30)
            after_messages = await last_request_messages(client, sid, skey)
        print(f"{'provider request body before compaction':<52} {statistics.median(sizes) / 1024:9.1f} KiB")
        after_size = len(json.dumps(after_messages, separators=(",", ":")).encode())
        print(f"{'provider request body after compaction':<52} {after_size / 1024:9.1f} KiB")
        report("text turn, ~2,000-event session, before compaction", before, sum(before))
        print_added(before, baseline, baseline_p99)
        report("text turn, same session after compaction", after, sum(after))
        print_added(after, baseline, baseline_p99)
        run, call = statistics.median(runs), statistics.median(direct_calls)
        print(f"{'session.compact, ~2,000-event history':<52} p50 {run * 1000:7.2f} ms   (n={len(runs)})")
        print(f"{'  the same provider call made directly':<52} p50 {call * 1000:7.2f} ms")
        print(f"{'  compaction cost over the provider call':<52} p50 {(run - call) * 1000:7.2f} ms")


async def measure_stack(stack: Stack, key: str) -> tuple[list[float], list[float]]:
    """(REST GET events samples, single-session text turn samples), after a warm-up."""
    async with httpx.AsyncClient(base_url=stack.client_url, timeout=60) as client:
        sid, skey = await open_session(client, key)
        await rpc(client, sid, skey, "session.registerDriver")
        auth = {"Authorization": f"Bearer {skey}"}
        for _ in range(200):
            await client.get(f"/api/v1/sessions/{sid}/events", headers=auth)
        for _ in range(20):
            await rpc(client, sid, skey, "session.sendMessage", {"message": {"content": "hi"}})
        rest, _ = await load(lambda c: c.get(f"/api/v1/sessions/{sid}/events", headers=auth), 1, 2000,
                             stack.client_url)
        turns = []
        for _ in range(200):
            started = time.perf_counter()
            await rpc(client, sid, skey, "session.sendMessage", {"message": {"content": "hi"}})
            turns.append(time.perf_counter() - started)
    return rest, turns


async def bench_telemetry(mock: MockProcess) -> None:
    print("\n== Telemetry off vs on (sample ratio 1.0, traces and metrics to an OTLP receiver) ==")
    port = free_port()
    # The receiver in a process of its own: decoding spans must not slow the load generator.
    receiver = subprocess.Popen([sys.executable, "-m", "testkit.otlp_receiver", "--port", str(port)], cwd=ROOT)
    figures: dict[str, tuple[list[float], list[float]]] = {"off": ([], []), "on": ([], [])}
    with tempfile.TemporaryDirectory() as tmp:
        on_toml = f'[telemetry]\nenabled = true\notlp_endpoint = "http://127.0.0.1:{port}"\nsample_ratio = 1.0\n'
        for round_ in range(2):
            for mode in ("off", "on"):
                path = Path(tmp) / f"{mode}{round_}"
                path.mkdir()
                config = mock_provider_toml(mock.base_url) + (on_toml if mode == "on" else "")
                running = launch_stack(path, config, MOCK_LLM_TOKEN=TOKEN, BAE_LOG="warning")
                try:
                    rest, turns = await measure_stack(running.stack, client_key(running))
                finally:
                    running.close()
                figures[mode][0].extend(rest)
                figures[mode][1].extend(turns)
    receiver.terminate()
    receiver.wait(10)
    for index, what in enumerate(("REST GET events, 1 client", "text turn, 1 session")):
        off, on = (percentile(figures[mode][index], 0.5) * 1000 for mode in ("off", "on"))
        off99, on99 = (percentile(figures[mode][index], 0.99) * 1000 for mode in ("off", "on"))
        print(f"{what:<30} off p50 {off:7.2f} ms  on p50 {on:7.2f} ms  ({(on / off - 1) * 100:+5.1f}%)"
              f"   off p99 {off99:7.2f} ms  on p99 {on99:7.2f} ms")


def freeze_heap() -> None:
    """Leave what the load generator holds now out of its collector's full passes, as the services
    do after start-up (bae/common/entry.py): with the SDKs imported, a full pass here takes 100 ms or more,
    and it would land in whichever sample it interrupts."""
    gc.collect()
    gc.freeze()


async def main(which: list[str]) -> None:
    freeze_heap()
    mock = MockProcess()
    if which == ["telemetry"]:
        try:
            await bench_telemetry(mock)
        finally:
            mock.stop()
        return
    with tempfile.TemporaryDirectory() as tmp:
        running = start_stack(Path(tmp), mock)
        try:
            key = client_key(running)
            if not which or "rest" in which:
                await bench_rest(running.stack, key)
            if not which or "turns" in which:
                await bench_turns(running.stack, key, mock)
            if not which or "observers" in which:
                await bench_observers(running.stack, key)
            if not which or "compaction" in which:
                await bench_compaction(running.stack, key, mock)
            if not which or "cpu" in which:
                await bench_cpu(running.stack, key, mock)
        finally:
            running.close()
    try:
        if not which or "replicas" in which:
            from bench.replicas import bench_replicas

            await bench_replicas(mock, TOKEN, client_key=client_key, open_session=open_session, rpc=rpc,
                                 load=load, percentile=percentile)
    finally:
        mock.stop()
    if not which or "limits" in which:
        from bench.limits import bench_limits

        mock = MockProcess()
        try:
            await bench_limits(mock)
        finally:
            mock.stop()
    if not which or "storage" in which:
        from bench.storage import bench_storage

        mock = MockProcess()
        try:
            await bench_storage(mock)
        finally:
            mock.stop()
    if not which or "retention" in which:
        from bench.retention import bench_retention

        mock = MockProcess()
        try:
            await bench_retention(mock, (turn_drivers, text_turns, close_all))
        finally:
            mock.stop()
    if not which or "webhooks" in which:
        from bench.webhooks import bench_webhooks

        mock = MockProcess()
        try:
            await bench_webhooks(mock, (turn_drivers, text_turns, close_all))
        finally:
            mock.stop()
    if not which or "console" in which:
        from bench.console import bench_console

        mock = MockProcess()
        try:
            await bench_console(mock)
        finally:
            mock.stop()
    if not which or "streaming" in which:
        from bench.streaming import bench_streaming

        await bench_streaming()
    if not which or "sandbox" in which:
        from bench.sandbox import bench_all

        await bench_all()
    print_table()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
