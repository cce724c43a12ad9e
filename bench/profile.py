"""Where the time goes: py-spy samples every service of a private stack under load.

    .venv/bin/python -m bench.profile          # both workloads
    .venv/bin/python -m bench.profile rest     # authenticated GET events, 1 client ("turns": simple text turns, 8 sessions)

For each process it prints the functions that were on CPU most often (own
time: the innermost frame of each sample, idle waits left out) and the
project functions most often on the stack (inclusive time).
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import MockProcess, client_key, open_session, rpc, start_stack

SECONDS = 8
TOP = int(__import__("os").environ.get("XTOP", "12"))
# Frames that mean "waiting", not working.
IDLE = ("select (", "epoll_wait", "poll (", "_run_once", "wait (threading", "_worker (concurrent", "recv_into")


async def rest_load(url: str, key: str, stop: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        sid, skey = await open_session(client, key)
        auth = {"Authorization": f"Bearer {skey}"}
        while time.monotonic() < stop:
            await client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 1}, headers=auth)


async def turn_load(url: str, key: str, stop: float) -> None:
    async def drive() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            sid, skey = await open_session(client, key)
            await rpc(client, sid, skey, "session.registerDriver")
            while time.monotonic() < stop:
                await rpc(client, sid, skey, "session.sendMessage", {"message": {"content": "hi"}})

    await asyncio.gather(*(drive() for _ in range(8)))


def record(pid: int, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--duration", str(SECONDS),
         "--rate", "250", "--format", "raw", "--output", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def summarize(name: str, raw: Path) -> None:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or any(marker in frames[-1] for marker in IDLE):
            continue
        samples = int(count)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            if __import__("os").environ.get("XALL") or "/work/" in frame or "services/" in frame or "bae/" in frame:
                inclusive[frame] += samples
    print(f"\n-- {name}: {total} busy samples")
    if not total:
        return
    print("   own time")
    for frame, samples in own.most_common(TOP):
        print(f"   {samples / total * 100:5.1f}%  {frame[:150]}")
    print("   project frames, inclusive")
    for frame, samples in inclusive.most_common(TOP):
        print(f"   {samples / total * 100:5.1f}%  {frame[:150]}")


async def profile(workload: str, tmp: Path, mock: MockProcess) -> None:
    print(f"\n== {workload} ==", flush=True)
    running = start_stack(tmp / workload, mock)
    try:
        key = client_key(running)
        url = running.stack.client_url
        await (rest_load if workload == "rest" else turn_load)(url, key, time.monotonic() + 2)  # warm up
        stop = time.monotonic() + SECONDS + 1
        load = asyncio.create_task((rest_load if workload == "rest" else turn_load)(url, key, stop))
        recorders = {name: (record(process.pid, tmp / f"{workload}-{name}.txt"), tmp / f"{workload}-{name}.txt")
                     for name, process in running.stack.processes.items() if name in ("gateway", "session", "runner")}
        await load
        for name, (recorder, out) in recorders.items():
            recorder.wait(30)
            summarize(name, out)
    finally:
        running.close()


async def main(which: list[str]) -> None:
    mock = MockProcess()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for workload in which or ["rest", "turns"]:
                (Path(tmp) / workload).mkdir()
                await profile(workload, Path(tmp), mock)
    finally:
        mock.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
