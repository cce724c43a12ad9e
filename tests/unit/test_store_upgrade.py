"""A database written by the code before Alembic (tests/fixtures/store-0e5055c.db) upgrades with nothing lost."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from bae.common.ids import token_digest
from services.session.store import Store, events, keys
from testkit import REVISIONS
from fixtures.make_store_0e5055c import ADMIN, CLIENT, SESSION

pytestmark = pytest.mark.unit

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
