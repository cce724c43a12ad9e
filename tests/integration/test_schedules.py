"""Schedules through the gateway's admin port, against the service processes and the scripted mock LLM
(docs/guides/schedules.md). The stacks run with the test-only BAE_SCHEDULE_TEST_SECONDS, so a six-field
cron ticks in seconds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterator
from zoneinfo import ZoneInfo

import pytest

from testkit import ROOT
from testkit.mockllm import Reply
from testkit.processes import service_env
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"
EVERY_SECOND = "* * * * * *"
# What the tests of the resource alone schedule: it fires on no day they run (the next is 2028-02-29).
LEAP_DAY = "0 6 29 2 *"


@pytest.fixture
def stack(start_stack, mock):
    """A stack of its own, for the tests that fire schedules."""
    mock.reset()
    return start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                       BAE_SCHEDULE_TEST_SECONDS="1")


@pytest.fixture(scope="module")
def admin_stack(tmp_path_factory, mock) -> Iterator[RunningStack]:
    """One stack for the tests of the resource alone: their schedules never fire (weekday mornings)."""
    running = launch_stack(tmp_path_factory.mktemp("schedules"), mock_provider_toml(mock.base_url),
                           MOCK_LLM_TOKEN=TOKEN, BAE_SCHEDULE_TEST_SECONDS="1")
    yield running
    running.close()


def profile_and_key(stack, **profile: Any) -> tuple[dict, dict]:
    created = stack.create_profile(f"p{time.monotonic_ns()}", **profile)
    return created, stack.create_key(created["id"])


def body(profile: dict, key: dict, **fields: Any) -> dict:
    return {"name": "report", "profile_id": profile["id"], "client_key_id": key["id"], "cron": LEAP_DAY,
            "message": "Summarize the day.", **fields}


def create(stack, **fields: Any) -> dict:
    profile, key = profile_and_key(stack)
    response = stack.admin.post("/admin/v1/schedules", json=body(profile, key, **fields))
    assert response.status_code == 201, response.text
    return response.json()


def runs(stack, schedule_id: str) -> list[dict]:
    page = stack.admin.get(f"/admin/v1/schedules/{schedule_id}/runs", params={"limit": 200})
    assert page.status_code == 200, page.text
    return page.json()["items"]


def wait_for(condition: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return value


def settled(stack, schedule_id: str, at_least: int = 1, timeout: float = 30.0) -> list[dict]:
    def done() -> list[dict] | None:
        found = runs(stack, schedule_id)
        return found if len(found) >= at_least and all(r["outcome"] != "running" for r in found) else None

    return wait_for(done, timeout)


def disable(stack, schedule: dict) -> None:
    fields = {k: schedule[k] for k in ("name", "profile_id", "client_key_id", "cron", "timezone", "message",
                                       "overlap", "catch_up", "close_after")}
    response = stack.admin.put(f"/admin/v1/schedules/{schedule['id']}", json={**fields, "enabled": False})
    assert response.status_code == 200, response.text


def admin_events(stack, session_id: str) -> list[dict]:
    page = stack.admin.get(f"/admin/v1/sessions/{session_id}/events", params={"limit": 200})
    assert page.status_code == 200, page.text
    return page.json()["items"]


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# --- the resource -----------------------------------------------------------------------------------

def test_create_get_list_replace_and_delete(admin_stack):
    profile, key = profile_and_key(admin_stack)
    response = admin_stack.admin.post("/admin/v1/schedules", json=body(profile, key, timezone="Europe/Paris"))
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["id"].startswith("sch_") and len(created["id"]) == 36
    assert {k: created[k] for k in ("name", "cron", "timezone", "message", "overlap", "catch_up", "close_after",
                                    "enabled")} == {
        "name": "report", "cron": LEAP_DAY, "timezone": "Europe/Paris", "message": "Summarize the day.",
        "overlap": "skip", "catch_up": "latest", "close_after": True, "enabled": True}
    next_fire = datetime.fromisoformat(created["next_fire_at"].replace("Z", "+00:00"))
    assert next_fire.astimezone(timezone.utc) > datetime.now(timezone.utc)
    local = next_fire.astimezone(ZoneInfo("Europe/Paris"))
    assert (local.month, local.day, local.hour, local.minute) == (2, 29, 6, 0)

    assert admin_stack.admin.get(f"/admin/v1/schedules/{created['id']}").json() == created
    listed = admin_stack.admin.get("/admin/v1/schedules", params={"limit": 200}).json()
    assert created in listed["items"]
    first = admin_stack.admin.get("/admin/v1/schedules", params={"limit": 1}).json()
    assert len(first["items"]) == 1 and (first["next_cursor"] is None) == (len(listed["items"]) == 1)

    replaced = admin_stack.admin.put(f"/admin/v1/schedules/{created['id']}", json=body(
        profile, key, name="weekly", cron="0 7 29 2 *", overlap="queue", catch_up="none", close_after=False,
        enabled=False))
    assert replaced.status_code == 200, replaced.text
    now = replaced.json()
    assert {k: now[k] for k in ("name", "cron", "timezone", "overlap", "catch_up", "close_after", "enabled",
                                "next_fire_at")} == {
        "name": "weekly", "cron": "0 7 29 2 *", "timezone": "UTC", "overlap": "queue", "catch_up": "none",
        "close_after": False, "enabled": False, "next_fire_at": None}
    assert now["created_at"] == created["created_at"] and now["updated_at"] >= created["updated_at"]
    assert runs(admin_stack, created["id"]) == []

    assert admin_stack.admin.delete(f"/admin/v1/schedules/{created['id']}").status_code == 204
    for response in (admin_stack.admin.get(f"/admin/v1/schedules/{created['id']}"),
                     admin_stack.admin.get(f"/admin/v1/schedules/{created['id']}/runs"),
                     admin_stack.admin.delete(f"/admin/v1/schedules/{created['id']}"),
                     admin_stack.admin.put(f"/admin/v1/schedules/{created['id']}", json=body(profile, key))):
        assert response.status_code == 404
        assert response.json()["detail"] == f"no schedule {created['id']}"


@pytest.mark.parametrize(("fields", "detail"), [
    ({"cron": "* * *"}, 'invalid cron "* * *": expected 5 fields (minute hour day-of-month month day-of-week), got 3'),
    ({"cron": "* * * * * * *"}, 'invalid cron "* * * * * * *": expected 5 fields (minute hour day-of-month month '
                                'day-of-week), got 7'),
    ({"cron": "61 * * * *"}, 'invalid cron "61 * * * *": Bad minute'),
    ({"cron": ""}, "cron must not be empty"),
    ({"timezone": "Mars/Olympus"}, 'unknown timezone "Mars/Olympus"; expected an IANA name such as "Europe/Paris"'),
    ({"overlap": "sometimes"}, 'overlap must be "skip", "queue" or "allow"'),
    ({"catch_up": "all"}, 'catch_up must be "latest" or "none"'),
    ({"message": ""}, "message must not be empty"),
    ({"message": "x" * 32769}, "message must be at most 32768 characters"),
    ({"name": "n" * 201}, "name must be at most 200 characters"),
    ({"close_after": "yes"}, 'invalid request body: invalid type: string "yes", expected a boolean'),
])
def test_a_bad_field_is_a_400_problem(admin_stack, fields, detail):
    profile, key = profile_and_key(admin_stack)
    response = admin_stack.admin.post("/admin/v1/schedules", json=body(profile, key, **fields))
    assert response.status_code == 400, response.text
    problem = response.json()
    assert (problem["type"], problem["detail"]) == ("bad_request", detail)


def test_a_missing_field_is_a_400_problem(admin_stack):
    profile, key = profile_and_key(admin_stack)
    without = {k: v for k, v in body(profile, key).items() if k != "client_key_id"}
    response = admin_stack.admin.post("/admin/v1/schedules", json=without)
    assert response.status_code == 400
    assert response.json()["detail"] == "invalid request body: missing field `client_key_id`"


def test_a_key_not_bound_to_the_profile_or_a_profile_with_client_tools_is_a_422_problem(admin_stack):
    profile, key = profile_and_key(admin_stack)
    other, other_key = profile_and_key(admin_stack)
    refused = admin_stack.admin.post("/admin/v1/schedules", json=body(profile, other_key))
    assert refused.status_code == 422
    assert (refused.json()["type"], refused.json()["detail"]) == (
        "schedule_key_not_bound", f"client key {other_key['id']} is not an active client key of profile {profile['id']}")

    assert admin_stack.admin.delete(f"/admin/v1/keys/{key['id']}").status_code == 204
    revoked = admin_stack.admin.post("/admin/v1/schedules", json=body(profile, key))
    assert (revoked.status_code, revoked.json()["type"]) == (422, "schedule_key_not_bound")

    tools, tools_key = profile_and_key(admin_stack, allowed_tools=["get_time"])
    with_tools = admin_stack.admin.post("/admin/v1/schedules", json=body(tools, tools_key))
    assert (with_tools.status_code, with_tools.json()["type"]) == (422, "schedule_profile_has_client_tools")

    missing = admin_stack.admin.post("/admin/v1/schedules", json={**body(other, other_key), "profile_id": "pro_nope"})
    assert (missing.status_code, missing.json()["detail"]) == (422, "no active profile pro_nope")


# --- firing -----------------------------------------------------------------------------------------

def test_a_tick_opens_a_session_runs_the_turn_and_closes_it(stack, mock):
    mock.enqueue(Reply.text("Here is the summary."))
    schedule = create(stack, cron=EVERY_SECOND, message="Summarize the day.")
    first = wait_for(lambda: [r for r in runs(stack, schedule["id"]) if r["outcome"] != "running"])[0]
    disable(stack, schedule)
    assert first["run_id"].startswith("run_") and first["outcome"] == "completed" and first["detail"] is None
    assert epoch(first["fired_at"]) >= epoch(first["scheduled_for"])
    session_id = first["session_id"]
    events = admin_events(stack, session_id)
    assert [e["event_type"] for e in events] == [
        "session.open", "session.driver.register", "client.message.send", "provider.request", "provider.response",
        "server.message.send", "session.close"]
    by_type = {e["event_type"]: e for e in events}
    assert by_type["client.message.send"]["payload"] == {"role": "user", "content": "Summarize the day."}
    assert by_type["server.message.send"]["payload"]["content"] == [{"type": "text", "text": "Here is the summary."}]
    assert {e["client_key_id"] for e in events} == {schedule["client_key_id"]}
    summary = stack.admin.get(f"/admin/v1/sessions/{session_id}").json()
    assert (summary["state"], summary["client_version"]) == ("closed", f"schedule {schedule['id']}")
    usage = stack.admin.get("/admin/v1/usage", params={"group_by": "key"}).json()["items"]
    assert any(row["client_key_id"] == schedule["client_key_id"] and row["turns"] >= 1 for row in usage)

    every = settled(stack, schedule["id"])
    assert len({r["session_id"] for r in every}) == len(every)  # a session per run
    paged = stack.admin.get(f"/admin/v1/schedules/{schedule['id']}/runs", params={"limit": 1}).json()
    assert paged["items"] == every[:1] and (paged["next_cursor"] is not None) == (len(every) > 1)


def test_close_after_false_leaves_the_session_open(stack):
    schedule = create(stack, cron=EVERY_SECOND, close_after=False)
    first = wait_for(lambda: [r for r in runs(stack, schedule["id"]) if r["outcome"] == "completed"])[0]
    disable(stack, schedule)
    assert stack.admin.get(f"/admin/v1/sessions/{first['session_id']}").json()["state"] == "open"


def test_overlap_skip_records_the_ticks_that_came_while_a_run_was_running(stack, mock):
    mock.enqueue(Reply.hang(3))
    schedule = create(stack, cron=EVERY_SECOND, overlap="skip")
    slow = wait_for(lambda: runs(stack, schedule["id"]))[0]
    wait_for(lambda: runs(stack, schedule["id"])[0]["outcome"] == "completed", timeout=15)
    disable(stack, schedule)
    every = settled(stack, schedule["id"])
    skipped = [r for r in every if r["outcome"] == "skipped"]
    assert len(skipped) >= 2
    for run in skipped:
        assert run["session_id"] is None
        assert run["detail"] == f"the run {slow['run_id']} for {slow['scheduled_for']} was still running"
    assert every[0]["outcome"] == "completed"


def test_overlap_allow_runs_ticks_side_by_side(stack, mock):
    mock.enqueue(Reply.hang(2.5))
    schedule = create(stack, cron=EVERY_SECOND, overlap="allow")
    wait_for(lambda: len(runs(stack, schedule["id"])) >= 3)
    disable(stack, schedule)
    every = settled(stack, schedule["id"], at_least=3)
    assert all(r["outcome"] == "completed" for r in every)
    assert epoch(every[1]["scheduled_for"]) < epoch(every[0]["scheduled_for"]) + 2.5  # the first still ran


def test_after_downtime_catch_up_latest_runs_the_missed_tick_once_and_none_runs_nothing(stack):
    # Both fire once a minute, at a second a few seconds ahead: the service is down when it comes.
    second = (int(time.time()) + 10) % 60
    latest = create(stack, cron=f"{second} * * * * *", catch_up="latest")
    none = create(stack, cron=f"{second} * * * * *", catch_up="none")
    session = stack.stack.processes["session"]
    session.send_signal(signal.SIGTERM)
    session.wait(30)
    assert datetime.now(timezone.utc).second != second, "stopped too late: the tick was not missed"
    wait_for(lambda: datetime.now(timezone.utc).second == (second + 6) % 60, timeout=70)
    stack.stack.restart("session")
    (run,) = settled(stack, latest["id"])
    assert datetime.fromisoformat(run["scheduled_for"].replace("Z", "+00:00")).second == second
    assert epoch(run["fired_at"]) - epoch(run["scheduled_for"]) > 3  # fired after the restart
    assert run["outcome"] == "completed"
    time.sleep(1)
    assert runs(stack, none["id"]) == []
    disable(stack, latest)
    disable(stack, none)


# --- baectl -----------------------------------------------------------------------------------------

def baectl(stack, *args: str) -> subprocess.CompletedProcess:
    env = service_env(BAE_ADMIN_ADDR=str(stack.settings.admin_addr), BAE_ADMIN_TOKEN=stack.admin_key)
    return subprocess.run([sys.executable, "-m", "bae.ctl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_baectl_creates_lists_shows_updates_and_deletes_a_schedule_and_lists_its_runs(admin_stack):
    profile, key = profile_and_key(admin_stack)
    created = baectl(admin_stack, "create", "schedule", "nightly", profile["id"], key["id"], LEAP_DAY, "Tidy up.",
                     "--timezone", "Europe/Paris", "--overlap", "queue", "--json")
    assert created.returncode == 0, created.stderr
    schedule = json.loads(created.stdout)
    assert (schedule["timezone"], schedule["overlap"], schedule["close_after"]) == ("Europe/Paris", "queue", True)

    shown = baectl(admin_stack, "get", "schedule", schedule["id"])
    assert shown.returncode == 0, shown.stderr
    assert f"{'id:':15}{schedule['id']}\n" in shown.stdout and f"{'cron:':15}{LEAP_DAY}\n" in shown.stdout
    listed = baectl(admin_stack, "list", "schedules")
    assert listed.stdout.splitlines()[0].split() == ["ID", "NAME", "CRON", "TIMEZONE", "ENABLED", "NEXT_FIRE_AT"]
    assert schedule["id"] in listed.stdout

    updated = baectl(admin_stack, "update", "schedule", schedule["id"], "--cron", "0 3 29 2 *", "--disabled", "--json")
    assert updated.returncode == 0, updated.stderr
    after = json.loads(updated.stdout)
    assert (after["cron"], after["enabled"], after["timezone"], after["overlap"], after["message"]) == (
        "0 3 29 2 *", False, "Europe/Paris", "queue", "Tidy up.")  # the rest kept

    assert baectl(admin_stack, "runs", schedule["id"]).stdout == "no runs found\n"
    assert json.loads(baectl(admin_stack, "runs", schedule["id"], "--json").stdout) == []

    refused = baectl(admin_stack, "create", "schedule", "bad", profile["id"], key["id"], "* *", "x")
    assert (refused.returncode, refused.stderr) == (
        1, 'baectl: invalid cron "* *": expected 5 fields (minute hour day-of-month month day-of-week), got 2\n')

    deleted = baectl(admin_stack, "delete", "schedule", schedule["id"])
    assert (deleted.returncode, deleted.stdout) == (0, f"deleted schedule {schedule['id']}\n")
    missing = baectl(admin_stack, "get", "schedule", schedule["id"])
    assert (missing.returncode, missing.stderr) == (1, f"baectl: no schedule {schedule['id']}\n")
