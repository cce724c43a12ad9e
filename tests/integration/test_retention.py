"""Retention through the gateway, on the service processes: deleting, exporting, importing and purging
sessions (admin API and baectl), the retention sweep with a profile's override and its archive, the
sweep's lease, and GET /admin/v1/config's effective base_url."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

import pytest

from bae.common.retention import Retention
from bae.services.session.engine.retention_sweep import RetentionSweep
from bae.services.session.store import Store, leases, retention
from testkit.live import declared, register, result, send
from testkit.mockllm import MockLLM, Reply
from testkit.stack import RunningStack, launch_stack, mock_provider_toml, store_url
from tests.integration.test_ctl import baectl, fails, ok

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"
# Profiles named "short…" keep their closed sessions a moment (0.00002 days: 1.7 s); the default keeps
# the others a century, so only the override makes the sweep delete anything.
SHORT_DAYS = 0.00002


def config_toml(mock: MockLLM, archive_dir: Path) -> str:
    return mock_provider_toml(mock.base_url) + (
        '[[providers.entries]]\nname = "plain-openai"\nprovider = "openai"\nmodel = "m"\nauth_token = "${MOCK_LLM_TOKEN}"\n'
        '[[providers.entries]]\nname = "plain-anthropic"\nprovider = "anthropic"\nmodel = "m"\n'
        'auth_token = "${MOCK_LLM_TOKEN}"\n'
        f'[retention]\nclosed_session_days = 36500\narchive = "ndjson"\narchive_dir = "{archive_dir}"\n'
    )


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, mock: MockLLM) -> Iterator[RunningStack]:
    tmp = tmp_path_factory.mktemp("retention")
    running = launch_stack(tmp, config_toml(mock, tmp / "archive"), MOCK_LLM_TOKEN=TOKEN,
                           BAE_RETENTION_INTERVAL="1")
    yield running
    running.close()


@pytest.fixture
def stack(shared: RunningStack, mock: MockLLM) -> RunningStack:
    mock.reset()
    return shared


def session_with_a_turn(stack: RunningStack, mock: MockLLM, profile: dict | None = None) -> tuple[str, str]:
    """A session on a new profile (or `profile`) that took one real turn; returns (id, session key)."""
    profile = profile or stack.create_profile(f"p{time.monotonic_ns()}", allowed_tools=["get_time"])
    key = stack.create_key(profile["id"])["key"]
    opened = stack.open_session(key, tools=declared(("get_time",)))
    sid, skey = opened["session_id"], opened["session_key"]
    register(stack, sid, skey)
    mock.enqueue(Reply.text("hello ✓ \"quoted\" \\ back"))
    assert result(send(stack, sid, skey, "hi there"))["events"]
    return sid, skey


def close(stack: RunningStack, sid: str, skey: str) -> None:
    closed = stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"})
    assert closed.status_code == 200, closed.text


def export(stack: RunningStack, sid: str) -> bytes:
    response = stack.admin.get(f"/admin/v1/sessions/{sid}/export")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return response.content


def events_page(stack: RunningStack, sid: str) -> bytes:
    """The admin events page's bytes (every event's wire text, spliced as stored)."""
    response = stack.admin.get(f"/admin/v1/sessions/{sid}/events", params={"limit": 200})
    assert response.status_code == 200, response.text
    assert response.json()["next_cursor"] is None
    return response.content


def import_(stack: RunningStack, body: bytes):
    return stack.admin.post("/admin/v1/sessions/import", content=body,
                            headers={"Content-Type": "application/x-ndjson"})


def test_config_shows_the_effective_base_url(stack):
    entries = {entry["name"]: entry for entry in stack.admin.get("/admin/v1/config").json()["providers"]["entries"]}
    assert entries["plain-openai"]["base_url"] == "https://api.openai.com"
    assert entries["plain-anthropic"]["base_url"] == "https://api.anthropic.com"
    assert entries["mock"]["base_url"] == stack.admin.get("/admin/v1/providers").json()["items"][0]["base_url"]


def test_delete_closed_open_and_unknown(stack, mock):
    sid, skey = session_with_a_turn(stack, mock)
    refused = stack.admin.delete(f"/admin/v1/sessions/{sid}")
    assert (refused.status_code, refused.json()["type"]) == (409, "session_open")
    close(stack, sid, skey)
    assert stack.admin.delete(f"/admin/v1/sessions/{sid}").status_code == 204
    assert stack.admin.get(f"/admin/v1/sessions/{sid}").status_code == 404
    assert stack.admin.get(f"/admin/v1/sessions/{sid}/events").status_code == 404
    gone = stack.client.get(f"/api/v1/sessions/{sid}/events", headers={"Authorization": f"Bearer {skey}"})
    assert gone.status_code in (401, 404)
    unknown = stack.admin.delete("/admin/v1/sessions/ses_nope")
    assert (unknown.status_code, unknown.json()["detail"]) == (404, "no session ses_nope")


def test_export_delete_import_round_trip_is_byte_identical(stack, mock):
    sid, skey = session_with_a_turn(stack, mock)
    close(stack, sid, skey)
    before_summary = stack.admin.get(f"/admin/v1/sessions/{sid}").json()
    before_page = events_page(stack, sid)
    before_usage = stack.admin.get("/admin/v1/usage", params={"group_by": "profile"}).json()
    exported = export(stack, sid)
    lines = exported.decode().splitlines()
    head = json.loads(lines[0])
    assert head["bae_export"] == 1 and head["session"]["id"] == sid and head["usage"]
    # Each event line is the event's wire text: the page's items, in order.
    items = json.loads(before_page)["items"]
    assert [json.loads(line) for line in lines[1:]] == items
    assert all(line.encode() in before_page for line in lines[1:])
    assert "provider.request" in {item["event_type"] for item in items}

    assert stack.admin.delete(f"/admin/v1/sessions/{sid}").status_code == 204
    imported = import_(stack, exported)
    assert imported.status_code == 201, imported.text
    assert imported.json() == {"id": sid, "state": "closed", "events": len(items)}

    assert stack.admin.get(f"/admin/v1/sessions/{sid}").json() == before_summary
    assert events_page(stack, sid) == before_page
    assert export(stack, sid) == exported
    assert stack.admin.get("/admin/v1/usage", params={"group_by": "profile"}).json() == before_usage

    # The same ids again: 409, and nothing of it written.
    again = import_(stack, exported)
    assert (again.status_code, again.json()["type"]) == (409, "session_exists")
    # Another session id, but the same event ids.
    renamed = exported.replace(sid.encode(), b"ses_" + b"f" * 32)
    clash = import_(stack, renamed)
    assert (clash.status_code, clash.json()["type"]) == (409, "session_exists")
    assert clash.json()["detail"] in {f"event {item['id']} already exists" for item in items}
    assert stack.admin.get(f"/admin/v1/sessions/ses_{'f' * 32}").status_code == 404


def test_malformed_imports_name_the_line(stack, mock):
    sid, skey = session_with_a_turn(stack, mock)
    close(stack, sid, skey)
    lines = export(stack, sid).decode().splitlines()
    assert stack.admin.delete(f"/admin/v1/sessions/{sid}").status_code == 204
    cases = [
        (b"", "the import is empty: expected the session line, then its events"),
        (b"{not json}\n", "line 1: not JSON"),
        (b'{"some":"thing"}\n', "line 1: expected the session line"),
        ("\n".join([lines[0], lines[1], "[1,2]"]).encode(), "line 3: not an event as exported: not a JSON object"),
        ("\n".join([lines[0], lines[1].replace(sid, "ses_other")]).encode(),
         f"line 2: not an event as exported: `session_id` must be the session line's id, {sid}"),
        ("\n".join([lines[0], lines[1], lines[1]]).encode(), "line 3: event id"),
        (lines[0].encode() + b"\n\xff\xfe\n", "line 2 is not valid UTF-8"),
    ]
    for body, detail in cases:
        refused = import_(stack, body)
        assert refused.status_code == 400, (detail, refused.text)
        assert refused.json()["detail"].startswith(detail), (detail, refused.json())
    assert stack.admin.get(f"/admin/v1/sessions/{sid}").status_code == 404  # nothing was written
    unauthenticated = stack.admin.post("/admin/v1/sessions/import", content=b"x", headers={"Authorization": "Bearer no"})
    assert unauthenticated.status_code == 401


def test_purge_dry_run_then_delete(stack, mock):
    sid, skey = session_with_a_turn(stack, mock)
    close(stack, sid, skey)
    open_sid, _ = session_with_a_turn(stack, mock)
    future = "2999-01-01T00:00:00Z"
    dry = stack.admin.post("/admin/v1/sessions/purge", json={"closed_before": future, "dry_run": True}).json()
    assert dry["dry_run"] and sid in dry["ids"] and open_sid not in dry["ids"]
    assert stack.admin.get(f"/admin/v1/sessions/{sid}").status_code == 200
    past = stack.admin.post("/admin/v1/sessions/purge", json={"closed_before": "2000-01-01T00:00:00Z"}).json()
    assert past == {"dry_run": False, "sessions": 0, "ids": [], "more": False}
    done = stack.admin.post("/admin/v1/sessions/purge", json={"closed_before": future}).json()
    assert sid in done["ids"] and done["sessions"] == len(done["ids"])
    assert stack.admin.get(f"/admin/v1/sessions/{sid}").status_code == 404
    assert stack.admin.get(f"/admin/v1/sessions/{open_sid}").json()["state"] == "open"
    bad = stack.admin.post("/admin/v1/sessions/purge", json={"closed_before": "yesterday"})
    assert (bad.status_code, bad.json()["detail"]) == (
        400, 'invalid closed_before "yesterday"; expected an RFC 3339 time such as 2026-01-01T00:00:00Z')


def test_profile_retention_is_validated(stack):
    for value, status in ((0, 400), (-1, 400), (36501, 400), ("x", 400), (1.5, 201)):
        response = stack.admin.post("/admin/v1/profiles", json={
            "name": f"r{time.monotonic_ns()}", "primary_provider": "mock", "retention": {"closed_session_days": value}})
        assert response.status_code == status, (value, response.text)
    assert response.json()["id"]
    assert stack.admin.get(f"/admin/v1/profiles/{response.json()['id']}").json()["retention"] == {
        "closed_session_days": 1.5}


def wait_gone(stack: RunningStack, sid: str) -> None:
    for _ in range(300):
        if stack.admin.get(f"/admin/v1/sessions/{sid}").status_code == 404:
            return
        time.sleep(0.1)
    raise AssertionError(f"the sweep did not delete {sid}")


def test_the_sweep_deletes_sessions_past_their_profiles_retention_and_archives_them(stack, mock):
    short = stack.create_profile(f"short{time.monotonic_ns()}", allowed_tools=["get_time"],
                                 retention={"closed_session_days": SHORT_DAYS})
    expired, expired_key = session_with_a_turn(stack, mock, short)
    still_open, _ = session_with_a_turn(stack, mock, short)
    kept, kept_key = session_with_a_turn(stack, mock)  # the default: a century
    close(stack, expired, expired_key)
    close(stack, kept, kept_key)
    exported = export(stack, expired)
    wait_gone(stack, expired)
    archive = stack.tmp / "archive" / f"{expired}.ndjson"
    assert archive.read_bytes() == exported
    assert stack.admin.get(f"/admin/v1/sessions/{kept}").json()["state"] == "closed"
    assert stack.admin.get(f"/admin/v1/sessions/{still_open}").json()["state"] == "open"
    # The archive imports back.
    assert import_(stack, archive.read_bytes()).status_code == 201


def test_baectl_delete_export_import_and_purge(stack, mock, tmp_path):
    sid, skey = session_with_a_turn(stack, mock)
    assert "is open; close it before deleting it" in fails(baectl(stack, "delete", "session", sid))
    close(stack, sid, skey)
    target = tmp_path / "s.ndjson"
    ok(baectl(stack, "export", "session", sid, "-o", str(target)))
    assert target.read_bytes() == export(stack, sid)
    assert ok(baectl(stack, "export", "session", sid)).encode() == target.read_bytes()
    assert ok(baectl(stack, "delete", "session", sid)) == f"deleted session {sid}\n"
    assert fails(baectl(stack, "delete", "session", sid)) == f"no session {sid}"
    assert ok(baectl(stack, "import", "session", str(target))).startswith(f"imported session {sid} (")
    assert "already exists" in fails(baectl(stack, "import", "session", str(target)))
    dry = json.loads(ok(baectl(stack, "purge", "sessions", "--closed-before", "2999-01-01", "--dry-run", "--json")))
    assert dry["dry_run"] and sid in dry["ids"]
    assert stack.admin.get(f"/admin/v1/sessions/{sid}").status_code == 200
    purged = ok(baectl(stack, "purge", "sessions", "--closed-before", "2999-01-01"))
    assert purged.startswith("deleted ") and f"  {sid}" in purged.splitlines()
    assert stack.admin.get(f"/admin/v1/sessions/{sid}").status_code == 404


async def test_one_replica_at_a_time_holds_the_sweep(tmp_path):
    """Two stores on one database, as two replicas: the lease goes to one until it lapses or is given back."""
    url = store_url(tmp_path)
    first, second = await Store.open(url), await Store.open(url)
    try:
        now = time.time()
        assert await first.write(leases.take_duty, retention.SWEEP_LEASE, "a", now, 30.0)
        assert not await second.write(leases.take_duty, retention.SWEEP_LEASE, "b", now, 30.0)
        assert await first.write(leases.take_duty, retention.SWEEP_LEASE, "a", now + 1, 30.0)  # renewed
        # While "a" holds it, "b" sweeps nothing and deletes nothing.
        sweep = RetentionSweep(second, Retention(closed_session_days=SHORT_DAYS), "b", 1.0, 10.0)
        assert await sweep.sweep() == 0
        assert await second.write(retention.sweep_step, "b", now + 2, 30.0, "ses_x", 10) is False
        assert await second.write(leases.take_duty, retention.SWEEP_LEASE, "b", now + 31.5, 30.0)  # lapsed
        assert not await first.write(leases.take_duty, retention.SWEEP_LEASE, "a", now + 32, 30.0)
        await second.write(leases.release_duty, retention.SWEEP_LEASE, "b")
        assert await first.write(leases.take_duty, retention.SWEEP_LEASE, "a", now + 33, 30.0)
    finally:
        await first.close()
        await second.close()


async def test_a_new_sqlite_store_gives_deleted_pages_back(tmp_path):
    """A database this version creates is in auto_vacuum=INCREMENTAL mode: after a session is deleted,
    reclaiming leaves no free page and the file shrinks."""
    from bae.services.session.engine.session_files import delete_session
    from bae.services.session.store.events import ImportedEvent, insert_imported
    from bae.services.session.store.schema import sessions as sessions_table
    from sqlalchemy import insert

    path = tmp_path / "bae.db"
    store = await Store.open(f"sqlite:///{path}")
    try:
        def fill(conn) -> None:
            stamp = "2001-01-01T00:00:00.000Z"
            conn.execute(insert(sessions_table), {
                "id": "ses_big", "client_key_id": "key_x", "profile_id": "pro_x", "state": "closed",
                "client_version": None, "client_tools": {}, "sandbox_tools": {}, "subagent_tools": {},
                "compaction": None, "created_at": stamp, "closed_at": stamp})
            insert_imported(conn, "ses_big", [ImportedEvent(f"evt_{index}", None, "t", '"' + "x" * 4000 + '"', stamp)
                                              for index in range(2000)])

        await store.write(fill)
        await store.write(lambda conn: conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
        full = path.stat().st_size
        deleted = await delete_session(store, "ses_big", "admin")
        assert deleted is not None and deleted.events == 2000 and deleted.bytes == 2000 * 4002
        assert await store.write(lambda conn: conn.exec_driver_sql("PRAGMA auto_vacuum").scalar()) == 2
        while await store.write(retention.reclaim, 1024):
            pass
        await store.write(lambda conn: conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
        assert path.stat().st_size < full / 4
    finally:
        await store.close()
