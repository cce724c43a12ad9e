"""The `migrate` command (a process) and the stack (in this process), on a database file written by the code
before Alembic (tests/fixtures)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from testkit import REVISIONS, ROOT
from testkit.inprocess import launch_inprocess_stack
from fixtures.make_store_0e5055c import ADMIN, SESSION

FIXTURE = Path(__file__).parent.parent / "fixtures" / "store-0e5055c.db"


@pytest.mark.inprocess
def test_an_old_database_is_served_whole_after_the_upgrade(tmp_path):
    shutil.copy(FIXTURE, tmp_path / "bae.db")
    old = sqlite3.connect(FIXTURE)
    old_sessions = [row[0] for row in old.execute("SELECT id FROM sessions ORDER BY seq")]
    old_events = {sid: [row[0] for row in old.execute(
        "SELECT id FROM session_events WHERE session_id = ? ORDER BY seq", (sid,))] for sid in old_sessions}
    old.close()
    # The fixture's admin key is the one that signs in; the service keeps it (no new key is generated).
    (tmp_path / "admin-key.pem").write_text(ADMIN + "\n")
    stack = launch_inprocess_stack(tmp_path, BAE_DB_PATH=str(tmp_path / "bae.db"))
    try:
        listed = stack.admin.get("/admin/v1/sessions").json()["items"]
        assert [s["id"] for s in listed] == old_sessions
        assert [s["state"] for s in listed] == ["open", "closed"]
        for sid in old_sessions:
            events = stack.admin.get(f"/admin/v1/sessions/{sid}/events").json()["items"]
            assert [e["id"] for e in events] == old_events[sid]
            assert events[0]["payload"] == {"role": "user", "content": "hello 0 é"}
        keys = stack.admin.get("/admin/v1/keys").json()["items"]
        assert [k["name"] for k in keys] == ["fixture-client"]
        [profile] = stack.admin.get("/admin/v1/profiles").json()["items"]
        assert profile["allowed_tools"] == ["bash"]
        # The session key made by the old code reads its session's log through the client API.
        page = stack.client.get(f"/api/v1/sessions/{old_sessions[0]}/events?limit=2",
                                headers={"Authorization": f"Bearer {SESSION}"})
        assert page.status_code == 200, page.text
        assert [e["id"] for e in page.json()["items"]] == old_events[old_sessions[0]][:2]
        cursor = page.json()["next_cursor"]
        rest = httpx.get(f"{stack.client_url}/api/v1/sessions/{old_sessions[0]}/events?cursor={cursor}",
                         headers={"Authorization": f"Bearer {SESSION}"}, timeout=30).json()["items"]
        assert [e["id"] for e in rest] == old_events[old_sessions[0]][2:]
    finally:
        stack.close()
    revision = sqlite3.connect(tmp_path / "bae.db").execute("SELECT version_num FROM alembic_version").fetchall()
    assert revision == [(REVISIONS[-1],)]


@pytest.mark.stack
def test_migrate_command_upgrades_alone_and_says_what_it_applied(tmp_path):
    path = tmp_path / "bae.db"
    shutil.copy(FIXTURE, path)
    env = {"PATH": "/usr/bin:/bin", "BAE_DATABASE_URL": f"sqlite:///{path}", "HOME": str(tmp_path)}
    ran = subprocess.run([sys.executable, "-m", "bae.services.session", "migrate"], env=env, capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    assert f"applied {' '.join(REVISIONS[1:])}" in ran.stdout
    again = subprocess.run([sys.executable, "-m", "bae.services.session", "migrate"], env=env, capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
    assert again.returncode == 0 and f"already at {REVISIONS[-1]}" in again.stdout, again.stdout
    assert sqlite3.connect(path).execute("SELECT version_num FROM alembic_version").fetchall() == [(REVISIONS[-1],)]
