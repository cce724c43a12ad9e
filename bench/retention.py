"""Retention sweep: what sweeping 1,000 closed sessions of 1,000 events each does to turns.

The store is filled first (in this process, through the store's own import path): 1,000 sessions
closed in 2001, each with 1,000 events of about 200 bytes of payload. Then two stacks run on it in
turn, each with 8 fresh sessions taking text turns at once (TURNS_PER_SESSION each):
- without the sweep: [retention] unset (everything kept);
- with it: closed_session_days = 1 and BAE_RETENTION_INTERVAL=1, so the sweep starts a second
  after the stack and deletes throughout the measurement (how many sessions it deleted by the
  end is printed: it must not have finished before the turns did).
The figure is the turns' p99 with the sweep against without it (acceptance: within 2x).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import httpx
from sqlalchemy import Connection, func, insert, select

from bench.common import TOKEN, client_key, ms, open_session, percentile
from bench.table import record
from bae.services.session.store import Store
from bae.services.session.store.events import ImportedEvent, insert_imported
from bae.services.session.store.schema import sessions
from testkit.stack import launch_stack, mock_provider_toml

SESSIONS = 1000
EVENTS_PER_SESSION = 1000
CONCURRENT = 8
TURNS_PER_SESSION = 40
TurnHelpers = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]
PAYLOAD = '{"text":"' + "x" * 190 + '"}'


def _fill(conn: Connection, first: int, count: int) -> None:
    for number in range(first, first + count):
        session_id = f"ses_bench{number:027d}"
        stamp = f"2001-01-01T00:{number // 60 % 60:02d}:{number % 60:02d}.000Z"
        conn.execute(insert(sessions), {
            "id": session_id, "client_key_id": "key_bench", "profile_id": "pro_bench", "state": "closed",
            "client_version": None, "client_tools": {}, "sandbox_tools": {}, "subagent_tools": {},
            "compaction": None, "created_at": stamp, "closed_at": stamp,
        })
        insert_imported(conn, session_id, [
            ImportedEvent(f"evt_b{number:07d}{index:020d}", "key_bench", "server.message.send", PAYLOAD, stamp)
            for index in range(EVENTS_PER_SESSION)
        ])


def _count(conn: Connection) -> int:
    return int(conn.execute(select(func.count()).select_from(sessions).where(sessions.c.id.like("ses_bench%")))
               .scalar_one())


async def _filled(url: str) -> None:
    store = await Store.open(url)
    try:
        for first in range(0, SESSIONS, 10):
            await store.write(_fill, first, 10)
    finally:
        await store.close()


async def _turns(running, key: str, helpers: TurnHelpers) -> list[float]:
    turn_drivers, text_turns, close_all = helpers
    async with httpx.AsyncClient(base_url=running.client_url, timeout=60) as client:
        pairs = [await open_session(client, key) for _ in range(CONCURRENT)]
    drivers = await turn_drivers(running.client_url, pairs)
    samples: list[float] = []
    await text_turns(drivers, pairs, TURNS_PER_SESSION, samples)
    await close_all(drivers)
    return samples


async def _phase(tmp: Path, mock, helpers: TurnHelpers, retention: str, **env: str) -> tuple[list[float], int]:
    running = launch_stack(tmp, mock_provider_toml(mock.base_url) + retention, MOCK_LLM_TOKEN=TOKEN,
                           BAE_LOG="warning", **env)
    try:
        key = client_key(running)
        await asyncio.sleep(1.5)  # with the sweep: it has started
        samples = await _turns(running, key, helpers)
        store = await Store.open(f"sqlite:///{tmp / 'bae.db'}")
        try:
            left = await store.read(_count)
        finally:
            await store.close()
    finally:
        running.close()
    return samples, left


async def bench_retention(mock, helpers: TurnHelpers) -> None:
    """`helpers`: bench.run's turn_drivers, text_turns and close_all (passed in: bench.run imports this module)."""
    print("\n== Retention sweep ==")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        started = time.perf_counter()
        await _filled(f"sqlite:///{tmp / 'bae.db'}")
        print(f"  filled {SESSIONS} closed sessions of {EVENTS_PER_SESSION} events in "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        quiet, kept = await _phase(tmp, mock, helpers, "")
        swept, left = await _phase(tmp, mock, helpers, "\n[retention]\nclosed_session_days = 1\n", BAE_RETENTION_INTERVAL="1")
    label = f"text turn, {CONCURRENT} sessions"
    print(f"{label + ', no sweep':<52} p50 {ms(quiet)}   p99 {ms(quiet, 0.99)}   (n={len(quiet)})")
    print(f"{label + ', sweeping':<52} p50 {ms(swept)}   p99 {ms(swept, 0.99)}   (n={len(swept)}; "
          f"{kept - left} of {kept} sessions deleted by the end)")
    ratio = percentile(swept, 0.99) / percentile(quiet, 0.99)
    record(f"turn p99, {CONCURRENT} sessions, while sweeping 1,000 closed sessions of 1,000 events",
           f"{ms(swept, 0.99)} ({ratio:.2f}x)", f"no sweep {ms(quiet, 0.99)}", "within 2x")
