"""A database written by the code before Alembic (tests/fixtures/store-0e5055c.db) upgrades with nothing lost."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from bae.common.ids import token_digest
from bae.services.session.store import Store, events, keys
from bae.services.session.store.migrations import migrate
from bae.services.session.store.postgres import asyncpg_url
from testkit.postgres_support import STORES, store_url  # noqa: F401 - the fixture
from testkit import REVISIONS
from fixtures.make_store_0e5055c import ADMIN, CLIENT, SESSION


FIXTURE = Path(__file__).parent.parent / "fixtures" / "store-0e5055c.db"
TABLES = ("keys", "profiles", "sessions", "session_events")


def rows(path: Path) -> dict[str, list[dict]]:
    """Every row of the original tables, by column name, as SQLite returns them."""
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    try:
        return {table: [dict(row) for row in db.execute(f"SELECT * FROM {table} ORDER BY seq")] for table in TABLES}
    finally:
        db.close()


@pytest.mark.unit
async def test_an_old_database_upgrades_with_every_row_intact(tmp_path):
    path = tmp_path / "bae.db"
    shutil.copy(FIXTURE, path)
    before = rows(path)
    assert [len(before[t]) for t in TABLES] == [3, 1, 2, 19]
    store = await Store.open(f"sqlite:///{path}")
    try:
        assert store.migrations_applied == REVISIONS[1:]
        tables = await store.read(lambda conn: set(conn.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type = 'table'").scalars()))
        assert "schema_migrations" not in tables and {"replicas", "session_leases"} <= tables
        for token, role in ((ADMIN, "admin"), (CLIENT, "client"), (SESSION, "session")):
            key = await store.read(keys.by_digest, token_digest(token))
            assert key is not None and key.role == role and key.deleted_at is None
        open_ids = await store.list_open_session_ids()
        for session in before["sessions"]:
            record = await store.get_session(session["id"])
            assert record.state == session["state"] and record.compaction == {"mode": "auto", "size": 100000}
            assert record.client_tools[session["client_key_id"]][0]["name"] == "t"
            listed = await store.list_events(session["id"], 0, 100)
            old = [e for e in before["session_events"] if e["session_id"] == session["id"]]
            assert [seq for seq, _ in listed] == [e["seq"] for e in old]  # the wire cursors are unchanged
            assert [view.json for _, view in listed] == [events.event_json(_Row(e)) for e in old]
        assert open_ids == [before["sessions"][0]["id"]]
        [profile] = await store.live_profiles()
        assert profile.fallback_providers == ["mock/other"] and profile.allowed_tools == ["bash"]
        # The next event continues the session's own numbering.
        first = before["sessions"][0]["id"]
        await store.append_events(first, [(None, "session.note", {"after": "upgrade"})])
    finally:
        await store.close()
    after = rows(path)
    for table in TABLES:
        # Columns later revisions added are left out (session_seq; profiles' limits, NULL: the defaults).
        kept = [{k: v for k, v in row.items() if k in before[table][0]} for row in after[table]]
        assert all(row.get("limits") is None for row in after[table])
        assert kept[: len(before[table])] == before[table], table
    numbers: dict[str, list[int]] = {}
    for event in after["session_events"]:
        numbers.setdefault(event["session_id"], []).append(event["session_seq"])
    assert sorted(numbers.values(), key=len) == [list(range(1, 11))] * 2


class _Row:
    """A stored row as events.event_json reads it."""

    def __init__(self, fields: dict) -> None:
        self.__dict__.update(fields)


# -- provider requests stored by reference (revision 0006) ---------------------------------------

REQUESTS_FIXTURE = Path(__file__).parent.parent / "fixtures" / "store-41dece5.db"


@pytest.mark.parametrize("store_url", STORES, indirect=True)
async def test_requests_written_whole_read_back_byte_for_byte_after_the_upgrade(store_url):  # noqa: F811
    """A database written by 41dece5 (every request whole), on SQLite and copied into PostgreSQL at the
    same revision, upgrades to requests stored by reference, every event's payload text unchanged."""
    source = sqlite3.connect(REQUESTS_FIXTURE)
    source.row_factory = sqlite3.Row
    try:
        tables = {table: [dict(row) for row in source.execute(f"SELECT * FROM {table}")]
                  for table in ("keys", "profiles", "sessions", "session_events", "usage_totals")}
        revision = source.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    finally:
        source.close()
    assert revision == "0005"
    def at_0005_with_the_rows(conn) -> None:
        migrate(conn, "0005")
        with conn.begin():
            for table, rows in tables.items():
                if rows:
                    columns = ", ".join(rows[0])
                    values = ", ".join(f":{column}" for column in rows[0])
                    conn.execute(text(f"INSERT INTO {table} ({columns}) VALUES ({values})"), rows)

    if store_url.startswith("sqlite"):
        Path(store_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(store_url)
        with engine.connect() as conn:
            at_0005_with_the_rows(conn)
        engine.dispose()
    else:
        async_engine = create_async_engine(asyncpg_url(make_url(store_url)))
        async with async_engine.connect() as conn:
            await conn.run_sync(at_0005_with_the_rows)
        await async_engine.dispose()
    store = await Store.open(store_url)
    try:
        assert store.migrations_applied == REVISIONS[REVISIONS.index("0006"):]
        for session_id in {row["session_id"] for row in tables["session_events"]}:
            listed = await store.list_events(session_id, 0, 1000)
            old = sorted((row for row in tables["session_events"] if row["session_id"] == session_id),
                         key=lambda row: row["seq"])
            assert [view.json for _, view in listed] == [events.event_json(_Row(row)) for row in old]
        by_reference = await store.read(lambda conn: conn.execute(text(
            "SELECT count(*) FROM session_events WHERE messages_runs IS NOT NULL")).scalar_one())
        assert by_reference == sum(row["event_type"] == "provider.request" for row in tables["session_events"]) > 0
    finally:
        await store.close()
