"""Sandbox benchmark: a private stack on loopback against the local Docker engine.

    .venv/bin/python bench/sandbox.py

Prints, each as p50/p99 over sequential runs:
- start a sandbox and run `echo` in it through the gateway
  (session.startRemoteSandbox + session.execRemoteSandbox on the client port);
- `docker run --rm bae-busybox:test echo hi` with the docker CLI, the floor to compare with;
- one session.execRemoteSandbox round trip in a running sandbox, next to the
  same exec (create, start, inspect) straight through the docker SDK.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.run import client_key, open_session, report, rpc, start_stack  # noqa: E402
from docker_support import TEST_IMAGE, docker_client, docker_skip_reason  # noqa: E402
from mockllm import MockLLM  # noqa: E402

STARTS = 30
EXECS = 200


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


def sdk_exec_baseline() -> tuple[list[float], float]:
    """What the sandbox host does per exec, without gRPC, the session service or the gateway."""
    client = docker_client()
    container = client.containers.run(TEST_IMAGE, ["sleep", "infinity"], detach=True, auto_remove=True)
    api = client.api

    def echo() -> None:
        exec_id = api.exec_create(container.id, ["sh", "-c", "echo hi"])["Id"]
        api.exec_start(exec_id, demux=True)
        api.exec_inspect(exec_id)

    try:
        for _ in range(20):
            echo()
        started = time.perf_counter()
        samples = []
        for _ in range(EXECS):
            began = time.perf_counter()
            echo()
            samples.append(time.perf_counter() - began)
        return samples, time.perf_counter() - started
    finally:
        container.remove(force=True)
        client.close()


async def bench_sandboxes(stack, key: str) -> None:
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

        samples, wall = await timed(lambda: asyncio.to_thread(docker_run_echo), STARTS)
        report(f"docker run --rm {TEST_IMAGE} echo hi (CLI)", samples, wall)

        await start_and_echo()
        for _ in range(20):
            await rpc(client, sid, skey, "session.execRemoteSandbox", {"command": "echo hi"})
        samples, wall = await timed(
            lambda: rpc(client, sid, skey, "session.execRemoteSandbox", {"command": "echo hi"}), EXECS
        )
        report("exec round trip in a running sandbox", samples, wall)
        await stop()
        report("  the same exec through the docker SDK directly", *await asyncio.to_thread(sdk_exec_baseline))


async def main() -> int:
    reason = docker_skip_reason()
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    mock = MockLLM().start()
    with tempfile.TemporaryDirectory() as tmp:
        running = start_stack(Path(tmp), mock)
        try:
            print("\n== Sandboxes ==")
            await bench_sandboxes(running.stack, client_key(running, available_sandboxes=[TEST_IMAGE]))
        finally:
            running.close()
            mock.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
