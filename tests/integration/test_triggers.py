"""HTTP triggers through the gateway, against the service processes and the scripted mock LLM
(docs/guides/triggers.md): the admin resource, a call's 202 and its session, `?wait=true` as
session.sendMessage's NDJSON, Idempotency-Key (50 concurrent calls, one session; on SQLite and on
PostgreSQL), and the refusals."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any, Callable, Iterator

import httpx
import pytest

from testkit import ROOT
from testkit.live import rpc, terminal
from testkit.mockllm import Reply
from testkit.openapi_check import frame_errors
from testkit.postgres_support import postgres, postgres_url  # noqa: F401 - fixtures
from testkit.processes import service_env
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"
SCHEMA = {
    "type": "object",
    "properties": {"repo": {"type": "string"}, "issue": {"type": "integer"}},
    "required": ["repo", "issue"],
}
TEMPLATE = "Triage issue #{issue} of {repo} {{now}}."


@pytest.fixture(scope="module")
def stack(tmp_path_factory, mock) -> Iterator[RunningStack]:
    running = launch_stack(tmp_path_factory.mktemp("triggers"), mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN)
    yield running
    running.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{time.monotonic_ns()}"


def trigger_body(profile: dict, **fields: Any) -> dict:
    return {"name": unique("triage"), "profile_id": profile["id"], "input_schema": SCHEMA,
            "message_template": TEMPLATE, **fields}


def new_trigger(stack, **fields: Any) -> tuple[dict, str]:
    """A trigger on a profile of its own, and a client key of that profile."""
    profile = stack.create_profile(unique("p"))
    key = stack.create_key(profile["id"])["key"]
    created = stack.admin.post("/admin/v1/triggers", json=trigger_body(profile, **fields))
    assert created.status_code == 201, created.text
    return created.json(), key


def call(stack, name: str, key: str, body: Any, *, idempotency_key: str | None = None, wait: bool = False
         ) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return stack.client.post(f"/api/v1/triggers/{name}", json=body, headers=headers,
                             params={"wait": "true"} if wait else None)


def wait_for(condition: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return value


def runs(stack, trigger_id: str) -> list[dict]:
    page = stack.admin.get(f"/admin/v1/triggers/{trigger_id}/runs", params={"limit": 200})
    assert page.status_code == 200, page.text
    return page.json()["items"]


def settled(stack, trigger_id: str, count: int = 1) -> list[dict]:
    return wait_for(lambda: (found := runs(stack, trigger_id)) and len(found) >= count and all(
        r["outcome"] != "running" for r in found) and found)


def events(stack, session_id: str) -> list[dict]:
    page = stack.admin.get(f"/admin/v1/sessions/{session_id}/events", params={"limit": 200})
    assert page.status_code == 200, page.text
    return page.json()["items"]


def every_session(stack) -> list[dict]:
    items, cursor = [], ""
    while True:
        page = stack.admin.get("/admin/v1/sessions", params={"limit": 200, "cursor": cursor})
        assert page.status_code == 200, page.text
        items += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if not cursor:
            return items


def problem(response: httpx.Response, status: int, kind: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == kind, body
    return body


# --- the resource -----------------------------------------------------------------------------------

def test_create_get_list_replace_delete(stack):
    created, _ = new_trigger(stack)
    assert created["id"].startswith("trg_") and len(created["id"]) == 36
    assert created["input_schema"] == SCHEMA and created["message_template"] == TEMPLATE
    assert created["close_after"] is True
    assert stack.admin.get(f"/admin/v1/triggers/{created['id']}").json() == created
    assert created in stack.admin.get("/admin/v1/triggers", params={"limit": 200}).json()["items"]

    replaced = stack.admin.put(f"/admin/v1/triggers/{created['id']}", json={
        "name": created["name"] + "-2", "profile_id": created["profile_id"], "input_schema": SCHEMA,
        "message_template": "Look at {repo}.", "close_after": False})
    assert replaced.status_code == 200, replaced.text
    now = replaced.json()
    assert (now["name"], now["message_template"], now["close_after"]) == (
        created["name"] + "-2", "Look at {repo}.", False)
    assert now["created_at"] == created["created_at"]

    assert stack.admin.delete(f"/admin/v1/triggers/{created['id']}").status_code == 204
    for response in (stack.admin.get(f"/admin/v1/triggers/{created['id']}"),
                     stack.admin.delete(f"/admin/v1/triggers/{created['id']}"),
                     stack.admin.get(f"/admin/v1/triggers/{created['id']}/runs")):
        problem(response, 404, "not_found")


def test_create_refuses_bad_definitions(stack):
    profile = stack.create_profile(unique("p"))
    cases = [
        ({"input_schema": {"type": "no-such-type"}}, "input_schema is not a valid JSON Schema (draft 2020-12)"),
        ({"input_schema": "text"}, "input_schema must be a JSON object (a JSON Schema)"),
        ({"input_schema": {"type": "object", "properties": {"x": {"type": "string", "description": "y" * 70000}}}},
         "input_schema must be at most 65536 characters of JSON"),
        ({"message_template": "Look at {branch}."},
         "message_template's placeholder {branch} is not a property of input_schema"),
        ({"message_template": "Look at {repo.__class__}."}, "placeholder {repo.__class__} at character 8 is not a field name"),
        ({"message_template": "a } b"}, "message_template has a lone '}'"),
        ({"name": "has space"}, "name must be 1 to 100 letters, digits, '.', '_' or '-'"),
    ]
    for fields, text in cases:
        response = stack.admin.post("/admin/v1/triggers", json=trigger_body(profile, **fields))
        assert text in problem(response, 400, "bad_request")["detail"], (fields, response.text)
    taken, _ = new_trigger(stack)
    problem(stack.admin.post("/admin/v1/triggers", json=trigger_body(profile, name=taken["name"])),
            409, "trigger_name_taken")
    tools = stack.create_profile(unique("p"), allowed_tools=["get_time"])
    problem(stack.admin.post("/admin/v1/triggers", json=trigger_body(tools)), 422,
            "trigger_profile_has_client_tools")
    problem(stack.admin.post("/admin/v1/triggers", json={**trigger_body(profile), "profile_id": "pro_missing"}),
            422, "profile_unavailable")


# --- calls -------------------------------------------------------------------------------------------

def test_a_call_answers_202_and_its_session_sends_the_rendered_message(stack, mock):
    mock.reset()
    mock.enqueue(Reply.text("Triaged."))
    trigger, key = new_trigger(stack)
    response = call(stack, trigger["name"], key, {"repo": "acme/api", "issue": 42, "extra": True})
    assert response.status_code == 202, response.text
    answer = response.json()
    assert set(answer) == {"trigger_run_id", "session_id"}
    assert answer["trigger_run_id"].startswith("trn_") and answer["session_id"].startswith("ses_")

    [run] = settled(stack, trigger["id"])
    assert run == {"run_id": answer["trigger_run_id"], "fired_at": run["fired_at"], "session_id": answer["session_id"],
                   "outcome": "completed", "detail": None, "idempotency_key": None}
    logged = events(stack, answer["session_id"])
    [sent] = [e["payload"] for e in logged if e["event_type"] == "client.message.send"]
    assert sent["content"] == "Triage issue #42 of acme/api {now}."
    replies = [e["payload"] for e in logged if e["event_type"] == "server.message.send"]
    assert replies[-1]["role"] == "assistant" and replies[-1]["content"][0]["text"] == "Triaged."
    assert logged[-1]["event_type"] == "session.close"  # close_after, by default


def test_wait_streams_the_turn_as_send_message_does(stack, mock):
    mock.reset()
    mock.enqueue(Reply.text("Waited."), Reply.text("Sent."))
    trigger, key = new_trigger(stack, close_after=False)
    response = call(stack, trigger["name"], key, {"repo": "acme/web", "issue": 7}, wait=True)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    frames = [json.loads(line) for line in response.text.splitlines()]
    for frame in frames:
        assert not frame_errors(frame), (frame, frame_errors(frame))
    last = terminal(frames)
    [run] = settled(stack, trigger["id"])
    assert last["id"] == run["run_id"] and last["result"]["message"]["content"][0]["text"] == "Waited."

    # The same shape as session.sendMessage's terminal frame on the same session (left open).
    opened = stack.open_session(key)
    rpc(stack.client, opened["session_id"], opened["session_key"], "session.registerDriver")
    sent = terminal(rpc(stack.client, opened["session_id"], opened["session_key"], "session.sendMessage",
                        {"message": {"role": "user", "content": "hello"}}))
    assert set(last) == set(sent) and set(last["result"]) == set(sent["result"])
    assert [e["event_type"] for e in last["result"]["events"]] == [e["event_type"] for e in sent["result"]["events"]]


def test_invalid_input_is_400_with_the_message_cut(stack):
    trigger, key = new_trigger(stack)
    response = call(stack, trigger["name"], key, {"repo": "x" * 1000, "issue": "not a number " * 100})
    body = problem(response, 400, "invalid_trigger_input")
    assert len(body["detail"]) <= 200 and body["detail"].startswith("input")
    problem(call(stack, trigger["name"], key, [1, 2]), 400, "invalid_trigger_input")
    assert runs(stack, trigger["id"]) == []


def test_a_placeholder_without_a_value_is_400(stack):
    schema = {"type": "object", "properties": {"repo": {"type": "string"}}}
    trigger, key = new_trigger(stack, input_schema=schema, message_template="Look at {repo}.")
    body = problem(call(stack, trigger["name"], key, {}), 400, "invalid_trigger_input")
    assert body["detail"] == "input has no value for the message's placeholder {repo}"


def test_refusals_of_the_caller(stack):
    trigger, key = new_trigger(stack)
    other, other_key = new_trigger(stack)
    problem(call(stack, "no-such-trigger", key, {}), 404, "not_found")
    body = problem(call(stack, trigger["name"], other_key, {"repo": "a", "issue": 1}), 403, "trigger_profile_mismatch")
    assert trigger["profile_id"] in body["detail"]
    problem(call(stack, trigger["name"], "bae_wrong", {"repo": "a", "issue": 1}), 401, "unauthorized")
    problem(call(stack, trigger["name"], key, {"repo": "a", "issue": 1}, idempotency_key="k" * 201), 400, "bad_request")
    maybe = stack.client.post(f"/api/v1/triggers/{trigger['name']}", json={"repo": "a", "issue": 1},
                              params={"wait": "yes"}, headers={"Authorization": f"Bearer {key}"})
    assert problem(maybe, 400, "bad_request")["detail"] == 'wait must be "true" or "false"'
    plain = stack.client.post(f"/api/v1/triggers/{trigger['name']}", content=b"{}",
                              headers={"Authorization": f"Bearer {key}", "Content-Type": "text/plain"})
    problem(plain, 400, "bad_request")
    assert other and runs(stack, trigger["id"]) == []


def test_a_repeated_key_answers_the_first_answer_and_another_body_is_409(stack, mock):
    mock.reset()
    trigger, key = new_trigger(stack)
    first = call(stack, trigger["name"], key, {"repo": "a", "issue": 1}, idempotency_key="build-1")
    assert first.status_code == 202, first.text
    # The same body written otherwise is the same body.
    again = stack.client.post(f"/api/v1/triggers/{trigger['name']}", content=b'{ "issue": 1, "repo": "a" }',
                              headers={"Authorization": f"Bearer {key}", "Idempotency-Key": "build-1",
                                       "Content-Type": "application/json"})
    assert (again.status_code, again.json()) == (202, first.json())
    waited = call(stack, trigger["name"], key, {"repo": "a", "issue": 1}, idempotency_key="build-1", wait=True)
    assert (waited.status_code, waited.json()) == (202, first.json())  # a repeat has no turn of its own to stream
    problem(call(stack, trigger["name"], key, {"repo": "a", "issue": 2}, idempotency_key="build-1"), 409,
            "idempotency_key_reused")
    [run] = settled(stack, trigger["id"])
    assert run["idempotency_key"] == "build-1"


async def _concurrent_calls(stack, name: str, key: str, count: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=str(stack.client.base_url), timeout=60) as client:
        return await asyncio.gather(*(client.post(
            f"/api/v1/triggers/{name}", json={"repo": "acme/api", "issue": 9},
            headers={"Authorization": f"Bearer {key}", "Idempotency-Key": "deploy-77"}) for _ in range(count)))


def fifty_calls_start_one_session(stack) -> None:
    trigger, key = new_trigger(stack)
    responses = asyncio.run(_concurrent_calls(stack, trigger["name"], key, 50))
    assert {response.status_code for response in responses} == {202}, {r.text for r in responses}
    answers = {response.text for response in responses}
    assert len(answers) == 1, answers
    [run] = settled(stack, trigger["id"])
    assert json.loads(answers.pop()) == {"trigger_run_id": run["run_id"], "session_id": run["session_id"]}
    assert [s["id"] for s in every_session(stack) if s["profile_id"] == trigger["profile_id"]] == [run["session_id"]]


def test_fifty_concurrent_calls_with_one_key_start_one_session(stack, mock):
    mock.reset()
    fifty_calls_start_one_session(stack)


@pytest.mark.postgres
def test_fifty_concurrent_calls_with_one_key_start_one_session_on_postgresql(start_stack, mock,
                                                                             postgres_url):  # noqa: F811
    mock.reset()
    fifty_calls_start_one_session(start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                                              BAE_DATABASE_URL=postgres_url, BAE_SESSION_REPLICAS="2"))


# --- baectl -----------------------------------------------------------------------------------------

def baectl(stack, *args: str) -> subprocess.CompletedProcess:
    env = service_env(BAE_ADMIN_ADDR=str(stack.settings.admin_addr), BAE_ADMIN_TOKEN=stack.admin_key)
    return subprocess.run([sys.executable, "-m", "bae.ctl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_baectl_creates_lists_shows_updates_and_deletes_a_trigger_and_lists_its_runs(stack, tmp_path, mock):
    mock.reset()
    profile = stack.create_profile(unique("p"))
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    name = unique("ci")
    created = baectl(stack, "create", "trigger", name, profile["id"], f"@{schema_file}", "Check {repo}.", "--keep-open",
                     "--json")
    assert created.returncode == 0, created.stderr
    trigger = json.loads(created.stdout)
    assert (trigger["input_schema"], trigger["close_after"]) == (SCHEMA, False)

    shown = baectl(stack, "get", "trigger", trigger["id"])
    assert shown.returncode == 0, shown.stderr
    assert f"{'id:':18}{trigger['id']}\n" in shown.stdout and f"{'close_after:':18}false\n" in shown.stdout
    listed = baectl(stack, "list", "triggers")
    assert listed.stdout.splitlines()[0].split() == ["ID", "NAME", "PROFILE_ID", "CLOSE_AFTER"]
    assert trigger["id"] in listed.stdout

    updated = baectl(stack, "update", "trigger", trigger["id"], "--message-template", "Review {repo}.", "--json")
    assert updated.returncode == 0, updated.stderr
    after = json.loads(updated.stdout)
    assert (after["message_template"], after["close_after"], after["name"]) == ("Review {repo}.", False, name)

    assert baectl(stack, "runs", trigger["id"]).stdout == "no runs found\n"
    key = stack.create_key(profile["id"])["key"]
    assert call(stack, name, key, {"repo": "a", "issue": 1}, idempotency_key="ci-1").status_code == 202
    settled(stack, trigger["id"])
    table = baectl(stack, "runs", trigger["id"]).stdout.splitlines()
    assert table[0].split() == ["RUN_ID", "FIRED_AT", "SESSION_ID", "OUTCOME", "IDEMPOTENCY_KEY", "DETAIL"]
    assert "completed" in table[1] and "ci-1" in table[1]

    refused = baectl(stack, "create", "trigger", unique("bad"), profile["id"], "{}", "On {branch}.")
    assert refused.returncode == 1 and "placeholder {branch} is not a property of input_schema" in refused.stderr

    deleted = baectl(stack, "delete", "trigger", trigger["id"])
    assert (deleted.returncode, deleted.stdout) == (0, f"deleted trigger {trigger['id']}\n")
    missing = baectl(stack, "get", "trigger", trigger["id"])
    assert (missing.returncode, missing.stderr) == (1, f"baectl: no trigger {trigger['id']}\n")
