"""Webhooks: what 3 webhooks on a profile add to its turns, and deliveries per second to a local receiver.

- Added latency: one stack, two profiles, one session each; the second profile has 3 webhooks taking
  every event of its sessions (each text turn queues 4 events x 3 deliveries, in the turn's own
  transactions, and the deliverer sends them meanwhile). Text turns alternate between the two
  sessions (one by one when paced, in rounds back to back), so drift hits both alike; the figure is
  the difference of their p50s (acceptance: at most 0.3 ms). The turns are paced (one every PACE
  seconds after the last ended), a rate whose
  deliveries the deliverer keeps up with: turns back to back would queue deliveries faster than
  any deliverer sends them, and the figure would measure a saturated machine's queue, not a turn.
  The back-to-back figure is shown too, for that reason, without an aim.
- Throughput: DELIVERIES events are appended to a fresh store before its stack starts, each queuing a
  delivery; the figure is how fast the session service sends them all to a receiver that answers 204,
  from the first request received to the last.

The receiver is a bare asyncio HTTP/1.1 server in this process: it answers every request 204 with
keep-alive, and counts.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import httpx
from sqlalchemy import Connection

from bench.common import TOKEN, client_key, ms, open_session, percentile
from bench.table import record
from bae.services.session.store import Store, events, sessions, webhooks
from testkit.stack import launch_stack, mock_provider_toml

TurnHelpers = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]
ROUNDS = 10
TURNS_PER_ROUND = 20
# Paced: PAIRS turns in each session, alternating one by one (the first of each pair alternating too),
# PACE seconds after each: 10 hooked turns a second, 120 deliveries a second.
PAIRS = 250
PACE = 0.05
WEBHOOKS = 3
DELIVERIES = 5000
ALLOW_LOOPBACK = '\n[webhooks]\nallow_hosts = ["127.0.0.1"]\n'


class Receiver:
    """Counts requests; `done` is set when `expected` have come."""

    def __init__(self) -> None:
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.expected = 0
        self.done = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.port = 0
        self._connections: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                self._counted()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
        finally:
            self._connections.discard(writer)

    def _counted(self) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now
        self.count += 1
        if self.expected and self.count >= self.expected:
            self.done.set()

    async def close(self) -> None:
        """Stop listening and end the open connections (their handlers end on the closed stream)."""
        if self.server is not None:
            self.server.close()
        for writer in list(self._connections):
            writer.close()
        await asyncio.sleep(0.1)


Samples = tuple[list[float], list[float]]


async def _added_latency(mock, helpers: TurnHelpers, receiver: Receiver) -> tuple[Samples, Samples]:
    """(plain, hooked) turn latencies paced, then back to back."""
    turn_drivers, text_turns, close_all = helpers
    with tempfile.TemporaryDirectory() as name:
        running = launch_stack(Path(name), mock_provider_toml(mock.base_url) + ALLOW_LOOPBACK, MOCK_LLM_TOKEN=TOKEN,
                               BAE_LOG="warning")
        try:
            plain_key = client_key(running)
            hooked_key = client_key(running)
            hooked_profile = running.admin.get("/admin/v1/profiles", params={"limit": 200}).json()["items"][-1]["id"]
            for _ in range(WEBHOOKS):
                created = running.admin.post("/admin/v1/webhooks", json={
                    "url": f"http://127.0.0.1:{receiver.port}/hook", "event_types": ["*"],
                    "profile_id": hooked_profile})
                assert created.status_code == 201, created.text
            async with httpx.AsyncClient(base_url=running.client_url, timeout=60) as client:
                pairs = [await open_session(client, plain_key), await open_session(client, hooked_key)]
            drivers = await turn_drivers(running.client_url, pairs)
            paced: Samples = ([], [])
            for number in range(PAIRS):
                for which in (number % 2, 1 - number % 2):
                    await text_turns(drivers[which:which + 1], pairs[which:which + 1], 1, paced[which])
                    await asyncio.sleep(PACE)
            back_to_back: Samples = ([], [])
            for _ in range(ROUNDS):
                for which in (0, 1):
                    await text_turns(drivers[which:which + 1], pairs[which:which + 1], TURNS_PER_ROUND,
                                     back_to_back[which])
            await close_all(drivers)
        finally:
            running.close()
    return paced, back_to_back


def _fill(conn: Connection) -> None:
    """DELIVERIES events of a closed session, each queued for the one webhook by events.append itself."""
    session_id = sessions.create(
        conn, client_key_id="key_bench", profile_id="pro_bench", state="closed", client_version=None,
        client_tools=[], sandbox_tools=[], subagent_tools=[], compaction={"mode": "client", "prompt": None},
    )
    for first in range(0, DELIVERIES, 500):
        events.append(conn, session_id, [
            (None, "server.message.send", {"role": "assistant", "content": [{"type": "text", "text": "x" * 200}]})
            for _ in range(first, min(first + 500, DELIVERIES))
        ])


async def _throughput(mock, receiver: Receiver) -> float:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        store = await Store.open(f"sqlite:///{tmp / 'bae.db'}")
        try:
            hook, _ = await store.write(webhooks.create, {
                "url": f"http://127.0.0.1:{receiver.port}/backlog", "event_types": ["*"], "profile_id": None,
                "enabled": True})
            await store.write(_fill)
        finally:
            await store.close()
        receiver.count, receiver.first, receiver.expected = 0, 0.0, DELIVERIES
        receiver.done.clear()
        running = launch_stack(tmp, mock_provider_toml(mock.base_url) + ALLOW_LOOPBACK, MOCK_LLM_TOKEN=TOKEN,
                               BAE_LOG="warning")
        try:
            await asyncio.wait_for(receiver.done.wait(), 600)
        finally:
            running.close()
    return (DELIVERIES - 1) / (receiver.last - receiver.first)


async def bench_webhooks(mock, helpers: TurnHelpers) -> None:
    """`helpers`: bench.run's turn_drivers, text_turns and close_all (passed in: bench.run imports this module)."""
    print("\n== Webhooks ==")
    receiver = Receiver()
    await receiver.start()
    try:
        paced, back_to_back = await _added_latency(mock, helpers, receiver)
        per_second = await _throughput(mock, receiver)
    finally:
        await receiver.close()
    added = _show(f"turns paced, one every {PACE * 1000:.0f} ms", paced)
    added_back_to_back = _show("turns back to back", back_to_back)
    print(f"{'deliveries to a local receiver':<52} {per_second:,.0f} /s ({DELIVERIES} queued)")
    record(f"text turn with {WEBHOOKS} webhooks on its profile, added p50 (paced)", f"{added:.2f} ms",
           f"no webhook p50 {ms(paced[0])}", "≤ 0.3 ms")
    record("the same, turns back to back", f"{added_back_to_back:.2f} ms", f"no webhook p50 {ms(back_to_back[0])}",
           "-")
    record("webhook deliveries to a local receiver", f"{per_second:,.0f} /s", "-", "-")


def _show(title: str, samples: Samples) -> float:
    """Print a pair of latencies; returns the p50 the webhooks added, in ms."""
    plain, hooked = samples
    print(title)
    print(f"{'  text turn, no webhook':<52} p50 {ms(plain)}   p99 {ms(plain, 0.99)}   (n={len(plain)})")
    print(f"{f'  text turn, {WEBHOOKS} webhooks on its profile':<52} p50 {ms(hooked)}   p99 {ms(hooked, 0.99)}   "
          f"(n={len(hooked)})")
    added = (percentile(hooked, 0.5) - percentile(plain, 0.5)) * 1000
    print(f"{'  added by the webhooks':<52} p50 {added:7.2f} ms")
    return added
