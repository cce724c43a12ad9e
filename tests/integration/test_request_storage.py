"""Provider requests stored by reference (store/requests.py), through the gateway: a database written
before the change reads back byte for byte after its upgrade, and new turns store only what they add."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from fixtures.make_store_41dece5 import pages, replay
from testkit.inprocess import launch_inprocess_stack
from testkit.live import notifications, result, send
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.inprocess

FIXTURES = Path(__file__).parent.parent / "fixtures"
RECORDED = json.loads((FIXTURES / "store-41dece5.json").read_text())


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory, mock):
    """A stack on a copy of the fixture database (upgraded as it starts), with the fixture's admin key."""
    tmp = tmp_path_factory.mktemp("upgraded")
    shutil.copy(FIXTURES / "store-41dece5.db", tmp / "bae.db")
    (tmp / "admin-key.pem").write_text(RECORDED["admin_key"] + "\n")
    toml = mock_provider_toml(mock.base_url) + mock_provider_toml(mock.base_url, name="gpt", kind="openai")
    stack = launch_inprocess_stack(tmp, toml, MOCK_LLM_TOKEN="sk-fixture-token-123456",
                                   BAE_DB_PATH=str(tmp / "bae.db"))
    yield stack, tmp / "bae.db"
    stack.close()


def test_every_answer_about_an_upgraded_log_is_byte_for_byte_what_the_old_code_gave(upgraded):
    stack, path = upgraded
    db = sqlite3.connect(path)
    try:
        by_reference = db.execute(
            "SELECT count(*) FROM session_events WHERE event_type = 'provider.request' AND messages_runs IS NOT NULL"
        ).fetchone()[0]
        requests = db.execute("SELECT count(*) FROM session_events WHERE event_type = 'provider.request'").fetchone()[0]
    finally:
        db.close()
    recorded_requests = [e for recorded in RECORDED["sessions"] for body in recorded["client_pages"]["200"]
                         for e in json.loads(body)["items"] if e["event_type"] == "provider.request"]
    # The migration stored every request of the fixture by reference.
    assert by_reference == requests == len(recorded_requests) == 17
    # The open session's driver, registered before the restart, still is (rebuilt from the log).
    first = RECORDED["sessions"][0]
    registered = [e["client_key_id"] for body in first["client_pages"]["200"] for e in json.loads(body)["items"]
                  if e["event_type"] == "session.driver.register"]
    participants = stack.client.get(f"/api/v1/sessions/{first['id']}/participants",
                                    headers={"Authorization": f"Bearer {first['session_key']}"})
    assert participants.json() == {"drivers": registered}
    for recorded in RECORDED["sessions"]:
        sid, auth = recorded["id"], {"Authorization": f"Bearer {recorded['session_key']}"}
        for limit, bodies in recorded["client_pages"].items():
            assert pages(stack.client, f"/api/v1/sessions/{sid}/events", auth, int(limit)) == bodies
        for limit, bodies in recorded["admin_pages"].items():
            assert pages(stack.admin, f"/admin/v1/sessions/{sid}/events", {}, int(limit)) == bodies
    since = json.loads(first["client_pages"]["200"][0])["items"][0]["id"]
    lines = replay(stack, first["id"], first["session_key"], since, len(first["replay"]))
    assert lines == first["replay"]


def test_a_new_turn_stores_only_what_it_adds_and_reads_back_as_sent(upgraded, mock):
    stack, path = upgraded
    first = RECORDED["sessions"][0]
    sid, skey = first["id"], first["session_key"]
    mock.reset()
    sizes = []
    for n in range(3):
        mock.enqueue(Reply.text(f"new turn {n}"))
        frames = send(stack, sid, skey, f"after the upgrade {n} ✓")
        events = result(frames)["events"] if "events" in result(frames) else notifications(frames)
        streamed = next(e for e in events if e["event_type"] == "provider.request")
        # What the provider received is the request's messages, as the log shows them.
        assert mock.requests[-1]["body"]["messages"] == streamed["payload"]["messages"]
        db = sqlite3.connect(path)
        try:
            sizes.append(db.execute(
                "SELECT sum(length(text)) FROM request_messages WHERE session_id = ?", (sid,)).fetchone()[0])
        finally:
            db.close()
    # Each turn stored its new user message and the previous reply, not the history again.
    assert sizes[1] - sizes[0] < 200 and sizes[2] - sizes[1] < 200
    listed = [e for body in pages(stack.client, f"/api/v1/sessions/{sid}/events", {"Authorization": f"Bearer {skey}"}, 200)
              for e in json.loads(body)["items"] if e["event_type"] == "provider.request"]
    assert listed[-1] == streamed


def test_the_upgraded_closed_session_exports_deletes_and_imports_byte_for_byte(upgraded):
    """The export of a session whose requests the migration stored by reference, deleted (its request
    messages with it) and imported again: every page reads as the old code answered it."""
    stack, path = upgraded
    recorded = RECORDED["sessions"][1]
    sid = recorded["id"]

    def rows() -> tuple[int, int]:
        db = sqlite3.connect(path)
        try:
            return (db.execute("SELECT count(*) FROM session_events WHERE session_id = ?", (sid,)).fetchone()[0],
                    db.execute("SELECT count(*) FROM request_messages WHERE session_id = ?", (sid,)).fetchone()[0])
        finally:
            db.close()

    exported = stack.admin.get(f"/admin/v1/sessions/{sid}/export")
    assert exported.status_code == 200, exported.text
    before = rows()
    assert before[1] > 0
    assert stack.admin.delete(f"/admin/v1/sessions/{sid}").status_code == 204
    assert rows() == (0, 0)
    imported = stack.admin.post("/admin/v1/sessions/import", content=exported.content,
                                headers={"Content-Type": "application/x-ndjson"})
    assert imported.status_code == 201, imported.text
    assert rows() == before
    # The events are new rows, so the cursors (their positions in the store) differ: the items do not.
    for limit, bodies in recorded["admin_pages"].items():
        assert [items_text(body) for body in pages(stack.admin, f"/admin/v1/sessions/{sid}/events", {}, int(limit))] \
            == [items_text(body) for body in bodies]


def items_text(body: str) -> str:
    """A page's `items` array as the server wrote it (the page is `{"items":[...],"next_cursor":...}`)."""
    return body[len('{"items":'): body.rindex(',"next_cursor":')]
