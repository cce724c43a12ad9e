"""The console watching a session: what an SSE subscriber on the admin port adds to the session's turns.

The web console follows a session through GET /admin/v1/sessions/{id}/events/stream with the admin
token, asking for deltas (which it gets only for calls that stream for a client: watching makes no
call stream). One private stack whose provider is the mock LLM in a process of its own,
answering at once; a driver on a kept-alive connection (bench/http1.py) sends text turns one at a
time, each timed from writing `session.sendMessage` to reading its whole answer. Runs of
TURNS_PER_RUN turns, each in a new session (so every run's history is the same size), cycle through:

- A: nobody watches (the baseline, between every two other runs);
- B: the console watches without deltas (`?deltas=false`);
- C: the console watches with `?deltas=true`, as it does;
- A': nobody watches, counted as if it were watched: the A/A figure.

A round is A B A C A A'. Each run's figure is the p50 of its turns, and what a kind adds is its run
less the mean of the two A runs around it (the next round's first A for A'), so that the machine's
drift (this VM's speed wanders by a millisecond over a minute) cancels; the figure is the median of
that over ROUNDS rounds. A' shows what the same estimate gives when nothing differs: the noise the
others are read against. Acceptance: C at most AIM_MS above its A runs.

The watcher is a process of its own (`python -m bench.console watch ...`, a bare socket): in the
load generator its reads would land in the turns it times. It still shares the machine's cores with
the stack, as a browser on the operator's own machine would not: its reads are counted in. It counts the turns' answers it reads;
every run waits until it has read all of them, so a watcher that fell behind or was cut off fails
the run rather than lightening it.
"""

from __future__ import annotations

import asyncio
import statistics
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

ROUNDS = 40
TURNS_PER_RUN = 20
AIM_MS = 0.2
SETTLE_SECONDS = 0.3
SEND = {"message": {"content": "hi"}}
# What the watcher counts: each text turn's answer, one event per turn.
ANSWER = b'"event_type":"server.message.send"'
# Each kind of run: the watcher's `deltas` (None: no watcher).
KINDS = {"A": None, "B": "false", "A'": None, "C": "true"}
# One round; every other run is an A, so each B, C and A' has an A on both sides.
ROUND = ("A", "B", "A", "C", "A", "A'")
LABELS = {"A": "no watcher (A)", "B": "console watching, deltas=false (B)", "A'": "no watcher again (A')",
          "C": "console watching, deltas=true (C)"}


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


async def run(running: RunningStack, key: str, deltas: str | None, samples: list[float]) -> None:
    """TURNS_PER_RUN timed text turns in a new session, watched when `deltas` is given."""
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
                elapsed, _ = await timed_rpc(driver, sid, skey, "session.sendMessage", SEND)
                samples.append(elapsed)
            if watcher is not None:
                await watcher.wait_for(TURNS_PER_RUN + 1)
        finally:
            if watcher is not None:
                await watcher.stop()
            await driver.close()
        closed = await client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"})
        assert closed.status_code == 200, closed.text
    # The stack's work after a run (a watcher process ending, its relay and the session torn down)
    # is left to finish here, not in the next run's turns.
    await asyncio.sleep(SETTLE_SECONDS)


def p50_ms(samples: list[float]) -> float:
    return percentile(samples, 0.5) * 1000


def added_ms(runs: list[tuple[str, float]], kind: str) -> list[float]:
    """For each run of `kind`, its p50 less the mean of the A runs on either side, in ms."""
    return [(p50 - (runs[i - 1][1] + runs[i + 1][1]) / 2) * 1000
            for i, (run_kind, p50) in enumerate(runs) if run_kind == kind and 0 < i < len(runs) - 1]


async def bench_console(mock: MockProcess) -> None:
    print("\n== Console: an SSE subscriber on the admin port watching a session's turns ==")
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    runs: list[tuple[str, float]] = []  # (kind, p50 of the run's turns) in the order they ran
    with tempfile.TemporaryDirectory() as name:
        running = launch_stack(Path(name), mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN, BAE_LOG="warning")
        try:
            key = client_key(running)
            for deltas in KINDS.values():  # warm up every path
                await run(running, key, deltas, [])
            started = time.perf_counter()
            for kind in [*ROUND * ROUNDS, "A"]:  # a last A closes the last A' in
                turns: list[float] = []
                await run(running, key, KINDS[kind], turns)
                samples[kind] += turns
                runs.append((kind, percentile(turns, 0.5)))
            wall = time.perf_counter() - started
        finally:
            running.close()
    for kind, label in LABELS.items():
        turns = samples[kind]
        print(f"{'text turn, ' + label:<52} p50 {p50_ms(turns):7.3f} ms   p99 {percentile(turns, 0.99) * 1000:7.2f} ms"
              f"   (n={len(turns)})")
    added = {kind: statistics.median(added_ms(runs, kind)) for kind in ("B", "C", "A'")}
    noise = added["A'"]
    print(f"{'  added by the watcher, deltas=false (B)':<52} p50 {added['B']:+7.3f} ms")
    print(f"{'  added by the watcher, deltas=true (C)':<52} p50 {added['C']:+7.3f} ms   (aim ≤ {AIM_MS} ms)")
    noise_label = "  A/A: an unwatched run, estimated alike (A')"
    print(f"{noise_label:<52} p50 {noise:+7.3f} ms   ({ROUNDS} rounds in {wall:.0f} s)")
    base = p50_ms(samples["A"])
    record("text turn watched by the console (SSE, deltas=true), added p50", f"{added['C']:+.3f} ms",
           f"unwatched p50 {base:.2f} ms; A/A {noise:+.3f} ms", f"≤ {AIM_MS} ms")
    record("the same, deltas=false", f"{added['B']:+.3f} ms", f"A/A {noise:+.3f} ms", "-")


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
