"""Sandbox benchmark: a private stack on loopback against the local Docker daemon.

    .venv/bin/python -m bench.sandbox

Prints, each as p50/p99 over sequential runs:
- start a sandbox and run `echo` in it through the gateway
  (session.startRemoteSandbox + session.execRemoteSandbox on the client port);
- session.startRemoteSandbox alone through the gateway, with no warm container
  (BAE_SANDBOX_WARM=0) and with one ready (a second stack, BAE_SANDBOX_WARM=1,
  each start once the pool has refilled);
- `docker run --rm bae-busybox:test echo hi` with the docker CLI, the floor to compare with;
- one session.execRemoteSandbox round trip in a running sandbox (which the
  host hands to the sandbox's resident shell, unless the stack runs with
  BAE_SANDBOX_RESIDENT_RUNNER=0), next to the same exec (create, start,
  inspect) in the same container straight through the docker SDK (the floor),
  the same Exec sent straight to the sandbox host over gRPC, and
  execRemoteSandbox in a session without a sandbox (the gateway and session
  service alone); the four are interleaved.

Remote subagents through the gateway:
- one launch: from the model's `tool.call` to the tool's `started` result (the
  turn goes on without waiting), over sequential launches;
- 20 at once in one sandbox: one model turn calls the subagent tool 20 times;
  each launch's `tool.call` to its `started` result, the turn's first `tool.call`
  to its last `started`, and to the last `session.subagent.completed` (each
  subagent sleeps 1 s), all from the events' own timestamps.

And straight to a sandbox host over gRPC (no gateway, no session service):
- the host's resident memory while a command prints 300 MB, as a background
  command and as an Exec (it must stay flat: output is kept up to the limit);
- 20 background commands started at once in one sandbox: StartCommand latency
  (until the command runs) and the wall time until all 20 have ended.

`python -m bench.sandbox subagents` runs the subagent figures alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from bae.common.grpcutil import channel as internal_channel
from bae.common.protos import sandbox_pb2, sandbox_pb2_grpc
from bench.http1 import Connection, rpc as lean_rpc
from bench.common import TOKEN, client_key, ms, open_session, report, rpc, start_stack
from bench.table import print_table, record
from testkit.docker_support import TEST_IMAGE, SandboxHostProcess, docker_client, docker_skip_reason
from testkit.mockllm import MockLLM, Reply
from testkit.processes import TEST_PLANE, PeakRss
from testkit.stack import launch_stack, mock_provider_toml

STARTS = 30
EXECS = 200
FLOOD_BYTES = 300 * 1024 * 1024
CONCURRENT_COMMANDS = 20
CONCURRENT_ROUNDS = 5
# BAE_SANDBOX_RESIDENT_RUNNER=0 in this environment measures every command as an exec of its own.
RESIDENT_ENV = {key: os.environ[key] for key in ("BAE_SANDBOX_RESIDENT_RUNNER",) if key in os.environ}
RESIDENT_ON = RESIDENT_ENV.get("BAE_SANDBOX_RESIDENT_RUNNER", "1").strip().lower() in ("1", "true")


async def seconds(make_call) -> float:
    began = time.perf_counter()
    await make_call()
    return time.perf_counter() - began


async def timed(make_call, runs: int) -> tuple[list[float], float]:
    started = time.perf_counter()
    samples = [await seconds(make_call) for _ in range(runs)]
    return samples, time.perf_counter() - started


def docker_run_echo() -> None:
    subprocess.run(["docker", "run", "--rm", TEST_IMAGE, "echo", "hi"], check=True, capture_output=True)


def sdk_exec(api, container_id: str) -> None:
    """What the sandbox host does per exec (create, start, inspect), without gRPC, the session service or the gateway."""
    exec_id = api.exec_create(container_id, ["sh", "-c", "echo hi"])["Id"]
    api.exec_start(exec_id, demux=True)
    api.exec_inspect(exec_id)


async def exec_round_trips(stack, sid: str, skey: str, sandbox_id: str, idle: tuple[str, str]) -> None:
    """One exec of `echo hi` four ways, interleaved so that a noisy machine weighs on each alike.

    The client's calls go through a bare HTTP/1.1 connection (bench/http1.py), as the REST figures do."""
    docker = docker_client()
    client = await Connection.open(stack.client_url)
    host = internal_channel(stack.env["BAE_SANDBOX_GRPC_ADDRS"].split(",")[0], TEST_PLANE)
    stub = sandbox_pb2_grpc.SandboxStub(host)
    request = sandbox_pb2.ExecRequest(sandbox_id=sandbox_id, command="echo hi")

    async def through_gateway() -> None:
        await lean_rpc(client, sid, skey, "session.execRemoteSandbox", {"command": "echo hi"})

    async def to_the_host() -> None:
        await stub.Exec(request, timeout=30)

    async def through_the_sdk() -> None:
        await asyncio.to_thread(sdk_exec, docker.api, sandbox_id)

    async def without_a_sandbox() -> None:
        """The same call in a session without a sandbox: the gateway and the session service alone."""
        body = {"jsonrpc": "2.0", "id": 1, "method": "session.execRemoteSandbox", "params": {"command": "echo hi"}}
        _, reply = await client.request("POST", f"/api/v1/sessions/{idle[0]}/rpc", token=idle[1], body=body)
        assert b'"error"' in reply, reply

    ways = {
        "exec round trip in a running sandbox": through_gateway,
        "  the same exec through the docker SDK directly": through_the_sdk,
        "  the same Exec straight to the sandbox host (gRPC)": to_the_host,
        "  execRemoteSandbox without a sandbox (no host call)": without_a_sandbox,
    }
    samples: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for round_ in range(EXECS + 20):
            for name, way in ways.items():
                took = await seconds(way)
                if round_ >= 20:  # warm-up rounds first
                    samples[name].append(took)
    finally:
        await client.close()
        await host.close()
        docker.close()
    for name, taken in samples.items():
        report(name, taken, sum(taken))
    record("exec round trip in a running sandbox", f"p50 {ms(samples['exec round trip in a running sandbox'])}",
           f"the same exec through the docker SDK, {ms(samples['  the same exec through the docker SDK directly'])}",
           "≤ SDK + 2 ms; ≤ 10 ms with the resident shell")
    # Each round's difference, then its median: steadier than a difference of p50s on a busy machine.
    floor = samples["  the same exec through the docker SDK directly"]
    for name, label in (("exec round trip in a running sandbox", "gateway"),
                        ("  the same Exec straight to the sandbox host (gRPC)", "sandbox host")):
        added = sorted(way - sdk for way, sdk in zip(samples[name], floor))
        print(f"  added over the SDK, {label}: median of the rounds' differences {added[len(added) // 2] * 1000:.2f} ms",
              flush=True)


async def bench_sandboxes(stack, key: str, tmp: Path, mock) -> None:
    async with httpx.AsyncClient(base_url=stack.client_url, timeout=120) as client:
        sid, skey = await open_session(client, key)
        await rpc(client, sid, skey, "session.registerDriver")

        async def start_and_echo() -> None:
            await rpc(client, sid, skey, "session.startRemoteSandbox", {"image": TEST_IMAGE})
            ran = await rpc(client, sid, skey, "session.execRemoteSandbox", {"command": "echo hi"})
            assert ran["stdout"] == "hi\n", ran

        async def stop() -> None:
            await rpc(client, sid, skey, "session.stopRemoteSandbox")

        await start_and_echo()  # warm up: image check, channels, first container
        await stop()
        starts, stops = [], []
        for _ in range(STARTS):
            starts.append(await seconds(start_and_echo))
            stops.append(await seconds(stop))
        report("start sandbox + echo through the gateway", starts, sum(starts))
        report("  then stop it through the gateway", stops, sum(stops))
        samples = await sandbox_starts(client, sid, skey)
        report("startRemoteSandbox through the gateway, cold", samples, sum(samples))
        warm = await bench_warm_starts(tmp, mock)

        runs, wall = await timed(lambda: asyncio.to_thread(docker_run_echo), STARTS)
        report(f"docker run --rm {TEST_IMAGE} echo hi (CLI)", runs, wall)
        record("start a sandbox through the gateway", f"p50 {ms(samples)}; {ms(warm)} with a warm container",
               f"`docker run --rm`, {ms(runs)}", "≤ 50 ms with a warm container")

        started = await rpc(client, sid, skey, "session.startRemoteSandbox", {"image": TEST_IMAGE})
        idle = await open_session(client, key)
        await rpc(client, *idle, "session.registerDriver")
        await exec_round_trips(stack, sid, skey, started["sandbox_id"], idle)
        await stop()


async def sandbox_starts(client, sid: str, skey: str, ready=None) -> list[float]:
    """session.startRemoteSandbox alone, each after `ready()` (when given) and followed by a stop."""
    samples = []
    for _ in range(STARTS):
        if ready is not None:
            await ready()
        samples.append(await seconds(
            lambda: rpc(client, sid, skey, "session.startRemoteSandbox", {"image": TEST_IMAGE})
        ))
        await rpc(client, sid, skey, "session.stopRemoteSandbox")
    return samples


async def bench_warm_starts(tmp: Path, mock) -> list[float]:
    """startRemoteSandbox on a stack whose sandbox host keeps one warm container (BAE_SANDBOX_WARM=1)."""
    running = launch_stack(tmp, mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN, BAE_LOG="warning",
                           BAE_SANDBOX_WARM="1", **RESIDENT_ENV)
    host_id = running.stack.env["BAE_SANDBOX_HOST_ID"]
    docker = docker_client()

    async def spare_ready() -> None:
        """Until the host offers a spare again: held ones are stopped after each start, so any is free.

        A spare is offered once its resident shell is ready (it shows in the container's
        processes, and a moment after, its first line has been read)."""
        def ready() -> bool:
            # One listing call: the spare stopped just before may vanish while it runs.
            spares = docker.api.containers(filters={"label": ["bae.spare=1", f"bae.host={host_id}"]})
            if not RESIDENT_ON or not spares:
                return bool(spares)
            try:
                listed = docker.api.top(spares[0]["Id"], ps_args="-o pid,args")["Processes"] or []
            except Exception:  # gone meanwhile
                return False
            return any("bae resident shell" in " ".join(row) for row in listed)
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(ready):
            if time.monotonic() > deadline:
                raise RuntimeError("the warm pool did not refill within 30 s")
            await asyncio.sleep(0.02)
        if RESIDENT_ON:
            await asyncio.sleep(0.05)

    try:
        key = client_key(running, available_sandboxes=[TEST_IMAGE])
        async with httpx.AsyncClient(base_url=running.stack.client_url, timeout=120) as client:
            sid, skey = await open_session(client, key)
            await rpc(client, sid, skey, "session.registerDriver")
            await sandbox_starts(client, sid, skey, spare_ready)  # warm up: channels, image checks
            samples = await sandbox_starts(client, sid, skey, spare_ready)
        report("startRemoteSandbox through the gateway, warm", samples, sum(samples))
        return samples
    finally:
        running.close()
        docker.close()


async def flood_memory(stub, sandbox_id: str, pid: int) -> None:
    """The host's peak RSS while one command prints FLOOD_BYTES, background and Exec."""
    flood = f"yes | head -c {FLOOD_BYTES}"

    async def background() -> None:
        request = sandbox_pb2.StartCommandRequest(sandbox_id=sandbox_id, command_id=uuid.uuid4().hex, command=flood)
        started = await stub.StartCommand(request, timeout=30)
        ended = await stub.WaitCommand(
            sandbox_pb2.WaitCommandRequest(command_id=started.command_id, wait_seconds=600), timeout=630
        )
        assert ended.state == sandbox_pb2.CommandStatus.EXITED and ended.stdout_truncated, ended

    async def exec_() -> None:
        reply = await stub.Exec(sandbox_pb2.ExecRequest(sandbox_id=sandbox_id, command=flood), timeout=630)
        assert reply.stdout_truncated, "the exec output was not capped"

    for name, run in (("a background command", background), ("an Exec", exec_)):
        with PeakRss(pid) as rss:
            began = time.perf_counter()
            await run()
            took = time.perf_counter() - began
        print(f"sandbox host RSS while {name} prints {FLOOD_BYTES >> 20} MB: "
              f"{rss.start_kb / 1024:.0f} MB before, {rss.peak_kb / 1024:.0f} MB peak   ({took:.1f} s)", flush=True)


async def concurrent_commands(stub, sandbox_id: str) -> None:
    """CONCURRENT_COMMANDS commands started at once, CONCURRENT_ROUNDS times."""
    starts: list[float] = []
    totals: list[float] = []
    for _ in range(CONCURRENT_ROUNDS):
        round_began = time.perf_counter()

        async def one() -> None:
            request = sandbox_pb2.StartCommandRequest(
                sandbox_id=sandbox_id, command_id=uuid.uuid4().hex, command="echo started; sleep 1; echo done"
            )
            began = time.perf_counter()
            started = await stub.StartCommand(request, timeout=30)
            starts.append(time.perf_counter() - began)
            ended = await stub.WaitCommand(
                sandbox_pb2.WaitCommandRequest(command_id=started.command_id, wait_seconds=60), timeout=90
            )
            assert ended.stdout == b"started\ndone\n", ended

        await asyncio.gather(*(one() for _ in range(CONCURRENT_COMMANDS)))
        totals.append(time.perf_counter() - round_began)
    report(f"host only: StartCommand, {CONCURRENT_COMMANDS} at once in one sandbox", starts, sum(totals))
    report(f"  all {CONCURRENT_COMMANDS} ended (each sleeps 1 s)", totals, sum(totals))
    report("  the same starts through the docker SDK directly", *await asyncio.to_thread(sdk_concurrent_baseline))


def sdk_concurrent_baseline() -> tuple[list[float], float]:
    """The floor: the same concurrent starts straight through the docker SDK (create, attach, running)."""
    import docker

    # A connection for each thread: with the SDK's default pool of 10, 20 threads overflow it and a
    # connection handed back to the full pool can fail the thread.
    client = docker.from_env(timeout=30, max_pool_size=CONCURRENT_COMMANDS)
    container = client.containers.run(TEST_IMAGE, ["sleep", "infinity"], detach=True, auto_remove=True, init=True)
    api = client.api
    samples: list[float] = []

    def start() -> None:
        began = time.perf_counter()
        exec_id = api.exec_create(container.id, ["sh", "-c", "echo started; sleep 1; echo done"], stdin=True)["Id"]
        attached = api.exec_start(exec_id, socket=True)
        while not api.exec_inspect(exec_id)["Running"]:
            time.sleep(0.01)
        samples.append(time.perf_counter() - began)
        attached.close()

    try:
        started = time.perf_counter()
        for _ in range(CONCURRENT_ROUNDS):
            workers = [threading.Thread(target=start) for _ in range(CONCURRENT_COMMANDS)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            time.sleep(1)  # as many processes running as in the measured rounds
        return samples, time.perf_counter() - started
    finally:
        container.remove(force=True)
        client.close()


async def bench_host_commands() -> None:
    host = SandboxHostProcess(f"bench-{uuid.uuid4().hex[:12]}")
    try:
        host.wait_serving()
        channel = internal_channel(host.address, TEST_PLANE)
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        await stub.AllowImages(sandbox_pb2.AllowImagesRequest(images=[TEST_IMAGE]), timeout=10)
        started = await stub.Start(sandbox_pb2.StartRequest(session_id="ses_bench", image=TEST_IMAGE), timeout=60)
        await flood_memory(stub, started.sandbox_id, host.process.pid)
        await concurrent_commands(stub, started.sandbox_id)
        await channel.close()
    finally:
        host.stop()


LAUNCHES = 30
CONCURRENT_SUBAGENTS = 20
SUBAGENT_ROUNDS = 5


def _at(event: dict) -> float:
    from datetime import datetime

    return datetime.fromisoformat(event["created_at"].replace("Z", "+00:00")).timestamp()


def subagent_tool(image: str) -> dict:
    return {"name": "launch_subagent", "description": "launch", "input_schema": {"type": "object"}, "image": image,
            "subagents": [{"harness": "fake", "command_template": "fake-harness --model {model}"}]}


async def subagent_session(client, key: str, image: str) -> tuple[str, str]:
    """A session declaring the subagent tool, its driver registered and its sandbox running."""
    opened = await client.post("/api/v1/sessions", json={"subagent_tools": [subagent_tool(image)]},
                               headers={"Authorization": f"Bearer {key}"})
    sid, skey = opened.json()["session_id"], opened.json()["session_key"]
    await rpc(client, sid, skey, "session.registerDriver")
    await rpc(client, sid, skey, "session.startRemoteSandbox", {"image": image})
    return sid, skey


async def bench_subagent_launch(running, mock) -> None:
    """`tool.call` to `tool.result` (status started) of a launch, from the events' own timestamps."""
    from testkit.docker_support import ensure_harness_image

    image = ensure_harness_image()
    key = client_key(running, available_sandboxes=[image])
    async with httpx.AsyncClient(base_url=running.stack.client_url, timeout=120) as client:
        sid, skey = await subagent_session(client, key, image)
        samples = []
        for index in range(LAUNCHES + 3):
            mock.enqueue(Reply.tool_use([(f"tu_{index}", "launch_subagent",
                                          {"harness": "fake", "model": "m", "prompt": "print done"})]))
            mock.enqueue(Reply.text("ok"))
            events = (await rpc(client, sid, skey, "session.sendMessage", {"message": {"content": "go"}}))["events"]
            call = next(e for e in events if e["event_type"] == "tool.call")
            started = next(e for e in events if e["event_type"] == "tool.result")
            if index >= 3:  # warm-up launches first
                samples.append(_at(started) - _at(call))
        report("subagent launch: tool.call -> started result", samples, sum(samples))
        await rpc(client, sid, skey, "session.stopRemoteSandbox")


async def completed_events(client, sid: str, skey: str, count: int) -> list[dict]:
    """The session's `session.subagent.completed` events, once there are `count` of them (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        reply = await client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200},
                                 headers={"Authorization": f"Bearer {skey}"})
        page = reply.json()
        assert page["next_cursor"] is None, "more events than one page holds"
        failed = [e for e in page["items"] if e["event_type"] == "session.subagent.failed"]
        assert not failed, failed
        completed = [e for e in page["items"] if e["event_type"] == "session.subagent.completed"]
        if len(completed) >= count:
            return completed
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(completed)} of {count} subagents completed within 60 s")
        await asyncio.sleep(0.05)


async def bench_concurrent_subagents(running, mock) -> None:
    """CONCURRENT_SUBAGENTS subagents launched by one model turn in one sandbox, once per round, each
    round in a session (and sandbox) of its own; every figure from the events' own timestamps."""
    from testkit.docker_support import ensure_harness_image

    image = ensure_harness_image()
    key = client_key(running, available_sandboxes=[image])
    prompt = "sleep 1\nprint done"
    launches: list[float] = []
    all_started: list[float] = []
    all_completed: list[float] = []
    async with httpx.AsyncClient(base_url=running.stack.client_url, timeout=120) as client:
        for round_ in range(SUBAGENT_ROUNDS + 1):  # the first round warms up
            sid, skey = await subagent_session(client, key, image)
            calls = [(f"tu_{index}", "launch_subagent", {"harness": "fake", "model": "m", "prompt": prompt})
                     for index in range(CONCURRENT_SUBAGENTS)]
            mock.enqueue(Reply.tool_use(calls))
            mock.enqueue(Reply.text("ok"))
            events = (await rpc(client, sid, skey, "session.sendMessage", {"message": {"content": "go"}}))["events"]
            called = {e["payload"]["id"]: _at(e) for e in events if e["event_type"] == "tool.call"}
            results = [e for e in events if e["event_type"] == "tool.result"]
            statuses = [json.loads(e["payload"]["content"][0]["text"])["status"] for e in results]
            assert statuses == ["started"] * CONCURRENT_SUBAGENTS, statuses
            completed = await completed_events(client, sid, skey, CONCURRENT_SUBAGENTS)
            await rpc(client, sid, skey, "session.stopRemoteSandbox")
            if round_ == 0:
                continue
            first_call = min(called.values())
            launches += [_at(e) - called[e["payload"]["tool_use_id"]] for e in results]
            all_started.append(max(_at(e) for e in results) - first_call)
            all_completed.append(max(_at(e) for e in completed) - first_call)
    n = CONCURRENT_SUBAGENTS
    report(f"{n} subagents in one turn, one sandbox: tool.call -> started", launches, sum(all_completed))
    report(f"  first tool.call -> last of the {n} started results", all_started, sum(all_completed))
    report(f"  first tool.call -> all {n} completed (each sleeps 1 s)", all_completed, sum(all_completed))


async def bench_all(only_subagents: bool = False) -> bool:
    """Every sandbox figure (or the subagent ones alone); False (with the reason printed) when
    there is no Docker daemon to use."""
    reason = docker_skip_reason()
    if reason is not None:
        print(f"\n== Sandboxes ==\n  skipped: {reason}")
        return False
    mock = MockLLM().start()
    with tempfile.TemporaryDirectory() as tmp:
        running = start_stack(Path(tmp), mock, BAE_MAX_SUBAGENTS_PER_SESSION=str(CONCURRENT_SUBAGENTS), **RESIDENT_ENV)
        try:
            if not only_subagents:
                print("\n== Sandboxes ==")
                warm = Path(tmp) / "warm"
                warm.mkdir()
                await bench_sandboxes(running.stack, client_key(running, available_sandboxes=[TEST_IMAGE]), warm, mock)
            print("\n== Subagents ==")
            await bench_subagent_launch(running, mock)
            await bench_concurrent_subagents(running, mock)
            if not only_subagents:
                print("\n== Sandbox host: background commands and output caps ==")
                await bench_host_commands()
        finally:
            running.close()
            mock.stop()
    return True


async def main(argv: list[str]) -> int:
    ran = await bench_all(only_subagents=argv == ["subagents"])
    print_table()
    return 0 if ran else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(sys.argv[1:])))
