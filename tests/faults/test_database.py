"""The database unavailable for writing: locked by another process, or its disk full (also under a compaction).

Writes answer 503 with Retry-After (REST) or a JSON-RPC error, never a 500
and never half a request; reads go on; once the database is writable again
everything works and every event is in the log exactly once.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from testkit.checks import assert_history_kept, assert_no_container_left, event_log
from testkit.live import new_session, notifications, register, result, rpc, send, session_state, terminal, types
from testkit.mockllm import Reply
from testkit.postgres_support import sqlite_only
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"
# Holds the write lock of the database named by argv[1] until its stdin closes.
LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
db.execute("ROLLBACK")
"""


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_unavailable(response, retry_after: str) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == retry_after
    assert response.json()["type"] == "service_unavailable" and response.json()["status"] == 503


def assert_writes_refused_and_reads_served(stack, mock, sid, skey, client_key, before, retry_after):
    assert_unavailable(stack.client.post("/api/v1/sessions", json={}, headers=bearer(client_key)), retry_after)
    assert_unavailable(stack.admin.post("/admin/v1/profiles", json={"name": "p2", "primary_provider": "mock"}),
                       retry_after)
    mock.enqueue(Reply.text("never stored"))
    refused = terminal(send(stack, sid, skey, "while unavailable"))
    assert refused["error"]["code"] in (-32603, -32000), refused
    # Reads go on, and show nothing of the refused writes.
    assert event_log(stack, sid, skey) == before
    assert stack.admin.get("/admin/v1/sessions").status_code == 200
    assert session_state(stack, sid) == "open"


def assert_recovered(stack, mock, sid, skey, client_key, before) -> None:
    assert stack.client.post("/api/v1/sessions", json={}, headers=bearer(client_key)).status_code == 201
    mock.reset()
    mock.enqueue(Reply.text("writable again"))
    assert result(send(stack, sid, skey, "after"))["message"]["content"][0]["text"] == "writable again"
    events = assert_history_kept(stack, sid, skey, before)
    assert types(events[len(before):]) == [
        "client.message.send", "provider.request", "provider.response", "server.message.send",
    ]
    # The message the database refused was never half-stored: the provider saw only the one after it.
    assert mock.requests[-1]["body"]["messages"][-1]["content"] == "after"
    assert_no_container_left(stack)


def open_with_a_turn(stack, mock) -> tuple[str, str, str, list[dict]]:
    sid, skey, profile = new_session(stack)
    register(stack, sid, skey)
    mock.enqueue(Reply.text("first"))
    result(send(stack, sid, skey, "one"))
    client_key = stack.create_key(profile["id"], name="second")["key"]
    return sid, skey, client_key, event_log(stack, sid, skey)


@sqlite_only("another process holds the SQLite file's write lock")
def test_a_database_locked_by_another_process(start_stack, mock):
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN)
    sid, skey, client_key, before = open_with_a_turn(stack, mock)
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, stack.stack.settings.db_path],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        assert_writes_refused_and_reads_served(stack, mock, sid, skey, client_key, before, retry_after="1")
    finally:
        locker.stdin.close()
        assert locker.wait(10) == 0
    assert_recovered(stack, mock, sid, skey, client_key, before)


@pytest.fixture
def small_disk():
    """A 4 MiB tmpfs of its own (root only), for the database directory."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount_point = Path(tempfile.mkdtemp(prefix="bae-small-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
        mount_point.rmdir()


def fill(directory: Path) -> Path:
    """Take every free byte of the file system under `directory`."""
    filler = directory / "filler"
    with open(filler, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


@sqlite_only("the SQLite file's disk fills up")
def test_a_full_disk_under_the_database(start_stack, mock, small_disk):
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                        BAE_DB_PATH=str(small_disk / "state" / "bae.db"))
    sid, skey, client_key, before = open_with_a_turn(stack, mock)
    filler = fill(small_disk)
    try:
        before = assert_writes_refused_on_a_full_disk(stack, mock, sid, skey, client_key, before)
    finally:
        filler.unlink()
    assert_recovered(stack, mock, sid, skey, client_key, before)


ATTEMPTS = 300


def assert_writes_refused_on_a_full_disk(stack, mock, sid, skey, client_key, before) -> list[dict]:
    """Writes go on while SQLite's write-ahead log has room of its own: a checkpoint that copied
    the whole log starts it again from its beginning, over pages the file already holds, and a
    checkpoint may come between any two writes. So each kind of write is tried until the store
    refuses it; every one that went through went through whole, and a refused one left nothing.
    Returns the session's log as it stands."""
    for _ in range(ATTEMPTS):
        response = stack.client.post("/api/v1/sessions", json={}, headers=bearer(client_key))
        if response.status_code != 201:
            assert_unavailable(response, "5")
            break
    else:
        raise AssertionError(f"{ATTEMPTS} sessions opened on a full disk: the store never refused one")
    for attempt in range(ATTEMPTS):
        response = stack.admin.post("/admin/v1/profiles", json={"name": f"p{attempt}", "primary_provider": "mock"})
        if response.status_code != 201:
            assert_unavailable(response, "5")
            break
    else:
        raise AssertionError(f"{ATTEMPTS} profiles created on a full disk: the store never refused one")
    logged = before
    for attempt in range(ATTEMPTS):
        mock.enqueue(Reply.text("stored whole or not at all"))
        end = terminal(send(stack, sid, skey, f"while full {attempt}"))
        now = event_log(stack, sid, skey)
        if "error" in end:
            assert end["error"]["code"] in (-32603, -32000), end
            assert now == logged  # nothing of the refused turn
            break
        assert now[: len(logged)] == logged
        assert types(now[len(logged):]) == [
            "client.message.send", "provider.request", "provider.response", "server.message.send",
        ]
        logged = now
    else:
        raise AssertionError(f"{ATTEMPTS} turns stored on a full disk: the store never refused one")
    assert stack.admin.get("/admin/v1/sessions").status_code == 200
    assert session_state(stack, sid) == "open"
    return logged


@sqlite_only("the SQLite file's disk fills up")
def test_compaction_records_the_disk_has_no_room_for(start_stack, mock, small_disk):
    """SERVER-SPEC §12.2, §12.3: a summary the database cannot store fails the compaction, not the
    turn. The auto attempt records `compaction_store_failed` (a small write that still fits) and the
    turn answers normally; `session.compact` answers -32603. History stays as it was, and compaction
    works again once there is room."""
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                        BAE_DB_PATH=str(small_disk / "state" / "bae.db"))
    profile = stack.create_profile("compacting")
    opened = stack.open_session(stack.create_key(profile["id"])["key"], compaction={"mode": "auto", "size": 1000})
    sid, skey = opened["session_id"], opened["session_key"]
    register(stack, sid, skey)
    summary = "s" * (1 << 20)  # stored twice (provider.response body, summary event): no room for it
    filler = fill(small_disk)
    os.truncate(filler, filler.stat().st_size - (256 << 10))  # room for a few small events
    try:
        mock.enqueue(Reply.text("above", usage=(1100, 0)), Reply.text(summary))
        outcome = result(send(stack, sid, skey, "one"))
        assert outcome["message"]["content"] == [{"type": "text", "text": "above"}]
        # The provider.response is written in one transaction with the records, so it went with them.
        trail = outcome["events"][4:]
        assert types(trail) == ["session.compaction.started", "provider.request", "session.error"]
        assert trail[-1]["payload"]["reason"] == "compaction_store_failed"
        assert isinstance(trail[-1]["payload"]["detail"], str)
        assert session_state(stack, sid) == "open"

        mock.enqueue(Reply.text(summary))
        frames = rpc(stack.client, sid, skey, "session.compact")
        assert terminal(frames)["error"] == {"code": -32603, "message": "Internal error"}
        assert types(notifications(frames)) == ["session.compaction.started", "provider.request"]
    finally:
        filler.unlink()
    assert session_state(stack, sid) == "open"
    logged = event_log(stack, sid, skey)
    assert "session.compaction.completed" not in types(logged)
    # The history is as it was: the next provider call sees the whole conversation, no summary.
    # The failed auto attempt armed the backoff: the same count over the threshold is not retried.
    mock.reset()
    mock.enqueue(Reply.text("two", usage=(1100, 0)))
    assert "session.compaction.started" not in types(result(send(stack, sid, skey, "two"))["events"])
    assert mock.requests[-1]["body"]["messages"] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": [{"type": "text", "text": "above"}]},
        {"role": "user", "content": "two"},
    ]
    mock.enqueue(Reply.text("SUMMARY"))
    assert result(rpc(stack.client, sid, skey, "session.compact"))["event_type"] == "session.compaction.completed"
