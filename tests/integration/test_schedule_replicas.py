"""A schedule on two session replicas sharing PostgreSQL: each tick fires exactly once, including across
a SIGKILL of the replica running a tick's turn (docs/engine.md, "Schedules").

A one-second schedule (the test-only BAE_SCHEDULE_TEST_SECONDS) runs for 100 ticks. Around the 30th,
a turn is made to hang and the replica running it is killed: the other replica takes the run over
once the dead one's lease lapses, finds in the session's log that the turn never ended, fails the run
and closes the session, and keeps ticking. Then: one run per tick, one session per run, and every
run's outcome is what its session's log says.

An HTTP trigger's run, the same way: its replica killed mid-turn, the other replica fails the run from
the session's log and closes the session.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from datetime import datetime
from typing import Any, Callable

import asyncpg
import pytest

from testkit.mockllm import Reply
from testkit.ports import consecutive_ports
from testkit.postgres_support import postgres, postgres_url  # noqa: F401 - fixtures
from testkit.stack import mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.postgres]

TOKEN = "sk-test-secret-token-123456"
LEASE_SECONDS = 2
TICKS = 100


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def wait_for(condition: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return value


def admin_read(stack, path: str, params: dict, patience: float = 10.0):
    """A GET on the admin port. Just after a replica is killed, a call the gateway had sent it answers
    503 "try again shortly" (the spec's answer for a cut call): it is tried again, as a client would."""
    deadline = time.monotonic() + patience
    while (page := stack.admin.get(path, params=params)).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.2)
    return page


def every_item(stack, path: str, **params: str) -> list[dict]:
    items, cursor = [], ""
    while True:
        page = admin_read(stack, path, {"limit": 200, "cursor": cursor, **params})
        assert page.status_code == 200, page.text
        items += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if not cursor:
            return items


def replica_processes(stack) -> dict[str, str]:
    """replica address (its id in the store) -> its process name in the stack."""
    host, _, port = stack.stack.env["BAE_SESSION_GRPC_ADDR"].rpartition(":")
    return {f"{host}:{port}": "session", f"{host}:{int(port) + 1}": "session-1"}


def logged_outcome(events: list[dict]) -> str:
    """What the session's log says of its turn: completed when an assistant message with no tool call
    follows the user message, failed otherwise."""
    types = [event["event_type"] for event in events]
    assert types.count("client.message.send") == 1
    replies = [e for e in events if e["event_type"] == "server.message.send"]
    if replies and replies[-1]["payload"]["role"] == "assistant" and not any(
            block.get("type") == "tool_use" for block in replies[-1]["payload"]["content"]):
        return "completed"
    return "failed"


def test_a_hundred_ticks_on_two_replicas_with_a_kill_are_a_hundred_runs_and_sessions(start_stack, mock,
                                                                                       postgres_url):  # noqa: F811
    mock.reset()
    port = consecutive_ports(2)
    stack = start_stack(
        config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
        BAE_DATABASE_URL=postgres_url, BAE_SESSION_REPLICAS="2", BAE_SESSION_GRPC_ADDR=f"127.0.0.1:{port}",
        BAE_SESSION_LEASE_SECONDS=str(LEASE_SECONDS), BAE_SCHEDULE_TEST_SECONDS="1",
    )
    profile = stack.create_profile("scheduled")
    key = stack.create_key(profile["id"])
    created = stack.admin.post("/admin/v1/schedules", json={
        "name": "every-second", "profile_id": profile["id"], "client_key_id": key["id"], "cron": "* * * * * *",
        "message": "tick", "overlap": "allow"})  # a hung turn must not turn the next ticks into skips
    assert created.status_code == 201, created.text
    schedule = created.json()
    runs_path = f"/admin/v1/schedules/{schedule['id']}/runs"

    wait_for(lambda: len(every_item(stack, runs_path)) >= 30, timeout=60)
    release = threading.Event()
    mock.enqueue(Reply.held(release))  # the next turn waits until its replica is killed
    hanging = wait_for(lambda: hanging_run(stack, runs_path), timeout=30)
    owner = replica_processes(stack)[run_replica(stack, hanging["run_id"])]
    stack.stack.processes[owner].send_signal(signal.SIGKILL)
    stack.stack.processes[owner].wait(10)
    release.set()

    first = epoch(every_item(stack, runs_path)[0]["scheduled_for"])
    wait_for(lambda: any(epoch(r["scheduled_for"]) >= first + TICKS - 1 for r in every_item(stack, runs_path)),
             timeout=TICKS + 60)
    update = {k: schedule[k] for k in ("name", "profile_id", "client_key_id", "cron", "timezone", "message",
                                       "overlap", "catch_up", "close_after")}
    assert stack.admin.put(f"/admin/v1/schedules/{schedule['id']}", json={**update, "enabled": False}).status_code == 200
    runs = wait_for(lambda: (found := every_item(stack, runs_path)) and all(
        r["outcome"] != "running" for r in found) and found, timeout=LEASE_SECONDS + 60)

    window = sorted((r for r in runs if epoch(r["scheduled_for"]) < first + TICKS), key=lambda r: r["scheduled_for"])
    assert [epoch(r["scheduled_for"]) for r in window] == [first + n for n in range(TICKS)]  # one run per tick
    assert len({r["scheduled_for"] for r in runs}) == len(runs)
    sessions = [s for s in every_item(stack, "/admin/v1/sessions") if s["client_version"] == f"schedule {schedule['id']}"]
    assert len(sessions) == len(runs) == len({r["session_id"] for r in runs})  # one session per run
    assert {s["id"] for s in sessions} == {r["session_id"] for r in runs}

    cut = [r for r in runs if r["run_id"] == hanging["run_id"]]
    assert [(r["outcome"], r["detail"]) for r in cut] == [
        ("failed", "the turn did not finish: the replica running it stopped")]
    for run in runs:
        events = every_item(stack, f"/admin/v1/sessions/{run['session_id']}/events")
        assert run["outcome"] == logged_outcome(events), (run, [e["event_type"] for e in events])
        assert events[-1]["event_type"] == "session.close"
    sessions = [s for s in every_item(stack, "/admin/v1/sessions") if s["client_version"] == f"schedule {schedule['id']}"]
    assert {s["state"] for s in sessions} == {"closed"}  # close_after, the cut run's session too


def hanging_run(stack, runs_path: str) -> dict | None:
    """The run whose turn waits for the held provider call: running, its session's last event the
    provider request, and still so a second later (the other turns take milliseconds)."""
    for run in every_item(stack, runs_path):
        if run["outcome"] == "running" and run["session_id"] and waiting_for_provider(stack, run["session_id"]):
            time.sleep(1)
            if waiting_for_provider(stack, run["session_id"]):
                return run
    return None


def waiting_for_provider(stack, session_id: str) -> bool:
    events = every_item(stack, f"/admin/v1/sessions/{session_id}/events")
    return bool(events) and events[-1]["event_type"] == "provider.request"


def run_replica(stack, run_id: str, table: str = "schedule_runs") -> str:
    """The replica a run names as the one driving it, read from the store."""

    async def read() -> str:
        conn = await asyncpg.connect(stack.stack.env["BAE_DATABASE_URL"])
        try:
            return await conn.fetchval(f"SELECT replica_id FROM {table} WHERE id = $1", run_id)
        finally:
            await conn.close()

    return asyncio.run(read())


def test_a_trigger_run_whose_replica_is_killed_mid_turn_is_failed_and_closed_by_the_other(start_stack, mock,
                                                                                          postgres_url):  # noqa: F811
    mock.reset()
    port = consecutive_ports(2)
    stack = start_stack(
        config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
        BAE_DATABASE_URL=postgres_url, BAE_SESSION_REPLICAS="2", BAE_SESSION_GRPC_ADDR=f"127.0.0.1:{port}",
        BAE_SESSION_LEASE_SECONDS=str(LEASE_SECONDS),
    )
    profile = stack.create_profile("triggered")
    key = stack.create_key(profile["id"])["key"]
    created = stack.admin.post("/admin/v1/triggers", json={
        "name": "triage", "profile_id": profile["id"], "input_schema": {"type": "object"}, "message_template": "go"})
    assert created.status_code == 201, created.text
    trigger = created.json()
    release = threading.Event()
    mock.enqueue(Reply.held(release))  # the turn waits until its replica is killed
    called = stack.client.post("/api/v1/triggers/triage", json={}, headers={"Authorization": f"Bearer {key}"})
    assert called.status_code == 202, called.text
    run_id, session_id = called.json()["trigger_run_id"], called.json()["session_id"]
    wait_for(lambda: waiting_for_provider(stack, session_id), timeout=30)
    owner = replica_processes(stack)[run_replica(stack, run_id, "trigger_runs")]
    stack.stack.processes[owner].send_signal(signal.SIGKILL)
    stack.stack.processes[owner].wait(10)
    release.set()

    runs_path = f"/admin/v1/triggers/{trigger['id']}/runs"
    [run] = wait_for(lambda: (found := every_item(stack, runs_path)) and found[0]["outcome"] != "running" and found,
                     timeout=LEASE_SECONDS + 30)
    assert (run["outcome"], run["detail"]) == ("failed", "the turn did not finish: the replica running it stopped")
    events = every_item(stack, f"/admin/v1/sessions/{session_id}/events")
    assert [e["event_type"] for e in events].count("client.message.send") == 1  # not sent again
    assert events[-1]["event_type"] == "session.close"  # close_after, by default
    assert len(mock.requests) == 1
