"""Storage: what a session's log costs in the store as it grows, and how fast it reads back whole.

One session grows to 2,000 turns (a user message and a text reply each) on a private stack with a
SQLite store. The bytes the store holds for the session (its events' payload text, plus its
provider requests' message texts where the schema keeps them apart: store/requests.py) are read
after turns 0, 100, 1,900 and 2,000, and the bytes per turn of turns 1,901-2,000 are set against
those of turns 1-100: 1.0 is linear growth, a log that stores every request's history grows as
the square. Then the whole log is read through `GET /api/v1/sessions/{id}/events` (pages of 200),
in events per second, over several rounds; and the database file's size is printed.

The module reads the schema it finds, so the same file measures code from before the change.
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import TOKEN, client_key, open_session
from bench.http1 import Connection, rpc
from bench.table import record
from testkit.stack import launch_stack, mock_provider_toml

TURNS = 2000
SPAN = 100
READ_ROUNDS = 5
SEND = {"message": {"content": "what is the weather like on the second day of the trip?"}}


def stored_bytes(db_path: Path, session_id: str) -> int:
    """The session's stored text in bytes: event payloads, and request message texts if kept apart."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        total = db.execute("SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0) FROM session_events "
                           "WHERE session_id = ?", (session_id,)).fetchone()[0]
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "request_messages" in tables:
            total += db.execute("SELECT coalesce(sum(length(CAST(text AS BLOB))), 0) FROM request_messages "
                                "WHERE session_id = ?", (session_id,)).fetchone()[0]
        return int(total)
    finally:
        db.close()


def file_bytes(db_path: Path) -> int:
    return sum(path.stat().st_size for path in db_path.parent.glob(db_path.name + "*"))


async def read_whole_log(client: httpx.AsyncClient, sid: str, skey: str) -> int:
    events, cursor = 0, ""
    while True:
        page = (await client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200, "cursor": cursor},
                                 headers={"Authorization": f"Bearer {skey}"})).json()
        events += len(page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return events


async def bench_storage(mock) -> None:  # a MockProcess
    print("\n== Storage ==")
    with tempfile.TemporaryDirectory() as tmp:
        db_path = Path(tmp) / "bench.db"
        running = launch_stack(Path(tmp), mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                               BAE_LOG="warning", BAE_DB_PATH=str(db_path))
        try:
            key = client_key(running)
            async with httpx.AsyncClient(base_url=running.client_url, timeout=60) as client:
                sid, skey = await open_session(client, key)
                driver = await Connection.open(running.client_url)
                await rpc(driver, sid, skey, "session.registerDriver")
                marks = {0: stored_bytes(db_path, sid)}
                started = time.monotonic()
                for turn in range(1, TURNS + 1):
                    await rpc(driver, sid, skey, "session.sendMessage", SEND)
                    if turn in (SPAN, TURNS - SPAN, TURNS):
                        marks[turn] = stored_bytes(db_path, sid)
                    if turn % 250 == 0:
                        print(f"  {turn} of {TURNS} turns ({time.monotonic() - started:.0f} s)", flush=True)
                await driver.close()
                rates, events = [], 0
                for _ in range(READ_ROUNDS):
                    began = time.perf_counter()
                    events = await read_whole_log(client, sid, skey)
                    rates.append(events / (time.perf_counter() - began))
        finally:
            running.close()
        size = file_bytes(db_path)
    first = (marks[SPAN] - marks[0]) / SPAN
    last = (marks[TURNS] - marks[TURNS - SPAN]) / SPAN
    print(f"  stored per turn, turns 1-{SPAN}: {first / 1024:.1f} KiB; "
          f"turns {TURNS - SPAN + 1}-{TURNS}: {last / 1024:.1f} KiB (×{last / first:.2f})")
    print(f"  the session's stored text after {TURNS} turns: {marks[TURNS] / 2**20:.1f} MiB; "
          f"database file: {size / 2**20:.1f} MiB")
    print(f"  reading the whole log ({events} events, pages of 200): median {statistics.median(rates):,.0f} "
          f"events/s over {READ_ROUNDS} rounds (best {max(rates):,.0f})")
    record(f"storage: bytes per turn, turns {TURNS - SPAN + 1}-{TURNS} against 1-{SPAN}", f"×{last / first:.2f}",
           "×1.0 (linear)", "≤ ×1.2")
    record(f"storage: database after {TURNS} turns", f"{size / 2**20:.1f} MiB")
    record("storage: whole-log read through GET …/events", f"{statistics.median(rates):,.0f} events/s",
           "the code before this schema", "no worse")


if __name__ == "__main__":
    from bench.common import MockProcess

    mock = MockProcess()
    try:
        asyncio.run(bench_storage(mock))
    finally:
        mock.stop()
