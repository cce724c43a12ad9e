"""The console watching a session: what an SSE subscriber on the admin port adds to the session's turns.

The web console follows a session through GET /admin/v1/sessions/{id}/events/stream with the admin
token, asking for deltas. One private stack whose provider is the mock LLM in a process of its own,
answering at once; a driver on a kept-alive connection (bench/http1.py) sends text turns one at a
time, each timed from writing `session.sendMessage` to reading its whole answer. Runs of
TURNS_PER_RUN turns, each in a new session (so every run's history is the same size), cycle through:

- A: nobody watches;
- B: the console watches without deltas (`?deltas=false`);
- A': nobody watches, again;
- C: the console watches with `?deltas=true`, as it does: the turn's provider call then streams;
- D: nobody watches, but the driver asks for deltas itself (`"stream_deltas": true`): the same
  streaming provider call without the watcher (its deltas go to the driver's own answer), so that
  C - D is about the watcher's own part of C, and D - A the streaming call's.

ROUNDS cycles, so drift hits every kind alike. The figures are the p50 of B, C and D less the p50 of
A (acceptance: C at most AIM_MS), and A' less A: the A/A figure, what two sets of the same runs
differ by on this machine, the noise the others are read against.

The watcher is a process of its own (`python -m bench.console watch ...`, a bare socket): in the
load generator its reads would land in the turns it times. It still shares the machine's cores with
the stack, as a browser on the operator's own machine would not: its reads are counted in. It counts the turns' answers it reads;
every run waits until it has read all of them, so a watcher that fell behind or was cut off fails
the run rather than lightening it.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from bench.common import TOKEN, MockProcess, client_key, open_session, percentile
from bench.http1 import Connection, rpc as lean_rpc, timed_rpc
from bench.table import record
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

ROUNDS = 15
TURNS_PER_RUN = 20
AIM_MS = 0.2
SEND = {"message": {"content": "hi"}}
STREAMED = {**SEND, "stream_deltas": True}
# What the watcher counts: each text turn's answer, one event per turn.
ANSWER = b'"event_type":"server.message.send"'
# Each kind of run: the watcher's `deltas` (None: no watcher), and what the driver sends.
KINDS = {"A": (None, SEND), "B": ("false", SEND), "A'": (None, SEND), "C": ("true", SEND), "D": (None, STREAMED)}
LABELS = {"A": "no watcher (A)", "B": "console watching, deltas=false (B)", "A'": "no watcher again (A')",
          "C": "console watching, deltas=true (C)", "D": "no watcher, the driver streams (D)"}


class Watcher:
    """The watcher process on one session's admin event stream."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.seen = 0

    @classmethod
    async def start(cls, running: RunningStack, session_id: str, deltas: str) -> "Watcher":
        path = f"/admin/v1/sessions/{session_id}/events/stream?deltas={deltas}"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.console", "watch", running.admin_url, path, running.admin_key,
            stdout=asyncio.subprocess.PIPE,
        )
        watcher = cls(process)
        ready = await watcher._line()
        if ready != "ready 200":
            raise RuntimeError(f"the watcher did not start: {ready!r}")
        return watcher

    async def _line(self) -> str:
        assert self.process.stdout is not None
        return (await asyncio.wait_for(self.process.stdout.readline(), 30)).decode().strip()

    async def wait_for(self, answers: int) -> None:
        """Until the watcher has read `answers` turn answers."""
        while self.seen < answers:
            line = await self._line()
            if not line:
                raise RuntimeError(f"the watcher's stream ended after {self.seen} of {answers} answers")
            self.seen = int(line)

    async def stop(self) -> None:
        self.process.terminate()
        await self.process.wait()


async def run(running: RunningStack, key: str, deltas: str | None, send: dict, samples: list[float]) -> None:
    """TURNS_PER_RUN timed text turns in a new session (`send` their params), watched when `deltas` is given."""
    async with httpx.AsyncClient(base_url=running.client_url, timeout=60) as client:
        sid, skey = await open_session(client, key)
        driver = await Connection.open(running.client_url)
        watcher = await Watcher.start(running, sid, deltas) if deltas is not None else None
        try:
            await lean_rpc(driver, sid, skey, "session.registerDriver")
            await lean_rpc(driver, sid, skey, "session.sendMessage", SEND)  # warms up; the watcher sees it
            if watcher is not None:
                await watcher.wait_for(1)
            for _ in range(TURNS_PER_RUN):
                elapsed, _ = await timed_rpc(driver, sid, skey, "session.sendMessage", send)
                samples.append(elapsed)
            if watcher is not None:
                await watcher.wait_for(TURNS_PER_RUN + 1)
        finally:
            if watcher is not None:
                await watcher.stop()
            await driver.close()
        closed = await client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"})
        assert closed.status_code == 200, closed.text


def p50_ms(samples: list[float]) -> float:
    return percentile(samples, 0.5) * 1000


async def bench_console(mock: MockProcess) -> None:
    print("\n== Console: an SSE subscriber on the admin port watching a session's turns ==")
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as name:
        running = launch_stack(Path(name), mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN, BAE_LOG="warning")
        try:
            key = client_key(running)
            for deltas, send in KINDS.values():  # warm up every path
                await run(running, key, deltas, send, [])
            started = time.perf_counter()
            for _ in range(ROUNDS):
                for kind, (deltas, send) in KINDS.items():
                    await run(running, key, deltas, send, samples[kind])
            wall = time.perf_counter() - started
        finally:
            running.close()
    for kind, label in LABELS.items():
        turns = samples[kind]
        print(f"{'text turn, ' + label:<52} p50 {p50_ms(turns):7.3f} ms   p99 {percentile(turns, 0.99) * 1000:7.2f} ms"
              f"   (n={len(turns)})")
    base = p50_ms(samples["A"])
    noise = p50_ms(samples["A'"]) - base
    added = {kind: p50_ms(samples[kind]) - base for kind in ("B", "C", "D")}
    print(f"{'  added by the watcher, deltas=false (B - A)':<52} p50 {added['B']:+7.3f} ms")
    print(f"{'  added by the watcher, deltas=true (C - A)':<52} p50 {added['C']:+7.3f} ms   (aim ≤ {AIM_MS} ms)")
    print(f"{'    of which the streaming call (D - A)':<52} p50 {added['D']:+7.3f} ms")
    print(f"{'    and the watcher itself (C - D)':<52} p50 {added['C'] - added['D']:+7.3f} ms")
    noise_label = "  A/A noise (A' - A)"
    print(f"{noise_label:<52} p50 {noise:+7.3f} ms   ({ROUNDS} rounds in {wall:.0f} s)")
    record("text turn watched by the console (SSE, deltas=true), added p50", f"{added['C']:+.3f} ms",
           f"unwatched p50 {base:.2f} ms; A/A noise {noise:+.3f} ms", f"≤ {AIM_MS} ms")
    record("the same, deltas=false", f"{added['B']:+.3f} ms", f"A/A noise {noise:+.3f} ms", "-")
    record("the same, deltas=true, less the streaming call a watcher with deltas makes (C - D)",
           f"{added['C'] - added['D']:+.3f} ms", f"the streaming call: {added['D']:+.3f} ms", "-")


async def watch(base_url: str, path: str, token: str) -> None:
    """The watcher process: read the stream, and print how many turn answers it has read each time
    that changes ("ready <status>" first, once the response head is in)."""
    parts = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
                 "Accept: text/event-stream\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    print(f"ready {int(head.split(b' ', 2)[1])}", flush=True)
    answers, tail = 0, b""
    while data := await reader.read(65536):
        # A marker cut between two reads is found in the end of the one before and this one.
        found = (tail + data).count(ANSWER)
        tail = data[-(len(ANSWER) - 1):]
        if found:
            answers += found
            print(answers, flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["watch"]:
    asyncio.run(watch(*sys.argv[2:5]))
