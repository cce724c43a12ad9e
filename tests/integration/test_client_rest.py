"""The client REST API of the real session service (in this process), over real gRPC (SERVER-SPEC §5)."""

from __future__ import annotations


import pytest
from sqlalchemy import update

from bae.services.session.store import Store
from bae.services.session.store.schema import profiles
from testkit.inprocess import InProcessService
from testkit.session_service import problem_of, profile_body
from testkit.stack import database_url_of

pytestmark = pytest.mark.inprocess


class Env:
    def __init__(self, service: InProcessService) -> None:
        self.service = service

    async def setup(self, **profile_fields) -> None:
        svc = self.service
        self.profile = await svc.admin("CreateProfile", body=profile_body("main", **profile_fields))
        self.key_a = await svc.admin("CreateKey", body={"name": "a", "profile_id": self.profile["id"]})
        self.key_b = await svc.admin("CreateKey", body={"name": "b", "profile_id": self.profile["id"]})

    async def open(self, key: dict, body=None, **kwargs) -> dict:
        return await self.service.call("OpenSession", key=key["key"], body={} if body is None else body, **kwargs)


@pytest.fixture(scope="module")
async def shared(tmp_path_factory):
    service = InProcessService(tmp_path_factory.mktemp("rest"))
    env = Env(service)
    await env.setup(allowed_tools=["get_time"], mcp_servers=["alpha"])
    yield env
    await service.stop()


async def test_open_and_events(shared):
    svc = shared.service
    opened = await shared.open(shared.key_a, {
        "client_version": "1.0",
        "tools": [{"name": "get_time"}],
        "sandbox_tools": [{"name": "run", "input_schema": {"type": "object"}}],
        "compaction": {"mode": "auto", "size": 5000},
    })
    assert opened["session_id"].startswith("ses_") and opened["session_key"].startswith("bae_ses_")
    assert len(opened["session_key"]) == 56
    assert opened["profile"] == {
        "id": shared.profile["id"], "name": "main", "allowed_tools": ["get_time"], "mcp_servers": ["alpha"],
        "provider": {"provider": "anthropic", "model": "claude-test"},
    }
    page = await svc.call("ListEvents", key=opened["session_key"], path_id=opened["session_id"])
    [event] = page["items"]
    assert page["next_cursor"] is None
    assert event["event_type"] == "session.open" and event["client_key_id"] == shared.key_a["id"]
    assert event["payload"] == {"client_version": "1.0", "tools": ["get_time"], "sandbox_tools": ["run"],
                                "subagent_tools": []}
    assert set(event) == {"id", "session_id", "client_key_id", "event_type", "payload", "created_at"}
    participants = await svc.call("ListParticipants", key=opened["session_key"], path_id=opened["session_id"])
    assert participants == {"drivers": []}


@pytest.mark.parametrize(
    "body, detail",
    [
        ({"compaction": {"mode": "auto"}}, "invalid compaction config: missing field `size`"),
        ({"compaction": {"mode": "manual"}}, "invalid compaction config: unknown variant `manual`, expected `auto` or `client`"),
        ({"compaction": {"mode": "auto", "size": "x"}}, 'invalid compaction config: invalid type: string "x", expected u64'),
        ({"compaction": {"mode": "auto", "size": 1.5}}, "invalid compaction config: invalid type: floating point `1.5`, expected u64"),
        ({"compaction": {"size": 1}}, "invalid compaction config: missing field `mode`"),
        ({"tools": "x"}, 'invalid request body: invalid type: string "x", expected a sequence'),
        ({"tools": [{"description": "d"}]}, "invalid request body: missing field `name`"),
        ({"client_version": 3}, "invalid request body: invalid type: integer `3`, expected a string"),
    ],
)
async def test_open_body_errors(shared, body, detail):
    problem = await problem_of(shared.open(shared.key_a, body))
    assert (problem.status, problem.type, problem.detail) == (400, "bad_request", detail)


async def test_open_compaction_minimum_and_content_type(shared):
    small = await problem_of(shared.open(shared.key_a, {"compaction": {"mode": "auto", "size": 999}}))
    assert small.status == 400 and small.detail.startswith("invalid compaction config: ")
    await shared.open(shared.key_a, {"compaction": {"mode": "auto", "size": 1000}})
    await shared.open(shared.key_a, {"compaction": None})
    wrong = await problem_of(shared.open(shared.key_a, content_type="text/plain"))
    assert wrong.detail == "Expected request with `Content-Type: application/json`"
    syntax = await problem_of(shared.open(shared.key_a, b"{"))
    assert syntax.detail.startswith("Failed to parse the request body as JSON: ")


async def test_open_tool_checks(shared):
    denied = await problem_of(shared.open(shared.key_a, {"tools": [{"name": "get_time"}, {"name": "rm"}]}))
    assert (denied.status, denied.type, denied.detail) == (
        403, "tool_not_allowed", "tool \"rm\" is not in the profile's allowlist")
    reserved = await problem_of(shared.open(shared.key_a, {"sandbox_tools": [{"name": "remote_subagent_status"}]}))
    assert (reserved.status, reserved.type) == (422, "reserved_tool_name")
    bad_subagent = {"subagent_tools": [{"name": "launch", "image": "img", "subagents": [
        {"harness": "claude", "command_template": "claude {oops}"}]}]}
    invalid = await problem_of(shared.open(shared.key_a, bad_subagent))
    assert (invalid.status, invalid.type, invalid.detail) == (
        422, "invalid_subagent_tools", "invalid command_template placeholders")
    ok_subagent = {"subagent_tools": [{"name": "launch", "image": "img", "subagents": [
        {"harness": "claude", "command_template": "claude --model {model} {prompt}", "prompt_via": "arg"}]}]}
    await shared.open(shared.key_a, ok_subagent)


async def test_client_auth_matrix(shared):
    svc = shared.service
    opened = await shared.open(shared.key_a)
    sid = opened["session_id"]
    cases = [
        ("OpenSession", None, "", "missing Authorization header"),
        ("OpenSession", "", "", "empty bearer token"),
        ("OpenSession", opened["session_key"], "", "invalid client key"),  # wrong key type
        ("ListEvents", shared.key_a["key"], sid, "invalid session key"),  # client key on a session route
        ("ListEvents", None, sid, "missing Authorization header"),
        ("ListParticipants", "bae_ses_" + "0" * 48, sid, "invalid session key"),
        ("CloseSession", opened["session_key"], "ses_other", "invalid session key"),
    ]
    for method, key, path_id, detail in cases:
        problem = await problem_of(svc.call(method, key=key, path_id=path_id, body={}))
        assert (problem.status, problem.type, problem.detail) == (401, "unauthorized", detail), method
    other = await shared.open(shared.key_a)
    cross = await problem_of(svc.call("ListEvents", key=other["session_key"], path_id=sid))
    assert cross.detail == "invalid session key"
    for header in (f"Token {opened['session_key']}", f"BEARER {opened['session_key']}"):
        refused = await problem_of(svc.call("ListEvents", authorization=header, path_id=sid))
        assert refused.detail == "Authorization header must be a Bearer token"
    assert (await svc.call("ListEvents", authorization=f"bearer {opened['session_key']}", path_id=sid))["items"]
    # A bad key beats a malformed body and a bad cursor.
    assert (await problem_of(svc.call("OpenSession", key="bae_x", body=b"{"))).status == 401
    assert (await problem_of(svc.call("ListEvents", key="bae_ses_x", path_id=sid, query={"cursor": "z"}))).status == 401


async def test_join_check_order(shared):
    svc = shared.service
    opened = await shared.open(shared.key_a)
    sid = opened["session_id"]
    key_b = shared.key_b["key"]
    assert (await problem_of(svc.call("JoinSession", key="bae_bad", path_id=sid, body=b"{"))).status == 401
    compaction = await problem_of(svc.call("JoinSession", key=key_b, path_id="ses_missing", body={"compaction": None}))
    assert (compaction.status, compaction.detail) == (
        400, "compaction is a session-level setting fixed at creation and cannot be set on join")
    missing = await problem_of(svc.call("JoinSession", key=key_b, path_id="ses_missing", body={}))
    assert (missing.status, missing.type, missing.detail) == (404, "not_found", "no session ses_missing")
    other_profile = await svc.admin("CreateProfile", body=profile_body("other"))
    outsider = await svc.admin("CreateKey", body={"name": "o", "profile_id": other_profile["id"]})
    mismatch = await problem_of(svc.call("JoinSession", key=outsider["key"], path_id=sid,
                                         body={"tools": [{"name": "nope"}]}))
    assert (mismatch.status, mismatch.type, mismatch.detail) == (
        403, "profile_mismatch", "the client key's profile does not match this session's profile")
    denied = await problem_of(svc.call("JoinSession", key=key_b, path_id=sid, body={"tools": [{"name": "rm"}]}))
    assert denied.type == "tool_not_allowed"
    joined = await svc.call("JoinSession", key=key_b, path_id=sid, body={"tools": [{"name": "get_time"}]})
    assert joined["session_id"] == sid and joined["session_key"] != opened["session_key"]
    again = await svc.call("JoinSession", key=key_b, path_id=sid, body={})
    assert again["session_key"] != joined["session_key"]
    page = await svc.call("ListEvents", key=joined["session_key"], path_id=sid)
    assert [(e["event_type"], e["client_key_id"]) for e in page["items"]] == [
        ("session.open", shared.key_a["id"]), ("session.join", shared.key_b["id"]),
        ("session.join", shared.key_b["id"])]
    closed = await svc.call("CloseSession", key=joined["session_key"], path_id=sid)
    assert closed == {"session_id": sid, "state": "closed"}
    conflict = await problem_of(svc.call("JoinSession", key=key_b, path_id=sid, body={}))
    assert (conflict.status, conflict.type, conflict.detail) == (409, "session_closed", "session is already closed")


async def test_close(shared):
    svc = shared.service
    opened = await shared.open(shared.key_a)
    sid, key = opened["session_id"], opened["session_key"]
    assert await svc.call("CloseSession", key=key, path_id=sid) == {"session_id": sid, "state": "closed"}
    again = await problem_of(svc.call("CloseSession", key=key, path_id=sid))
    assert (again.status, again.type, again.detail) == (409, "session_closed", "session is already closed")
    # Session keys stay valid after close: replay still works.
    page = await svc.call("ListEvents", key=key, path_id=sid)
    assert [e["event_type"] for e in page["items"]] == ["session.open", "session.close"]
    assert page["items"][1]["payload"] == {"reason": "client_close"}
    assert page["items"][1]["client_key_id"] == shared.key_a["id"]


async def test_event_pagination(shared):
    svc = shared.service
    opened = await shared.open(shared.key_a)
    sid = opened["session_id"]
    for _ in range(4):
        await svc.call("JoinSession", key=shared.key_a["key"], path_id=sid, body={})
    ids, cursor = [], ""
    while True:
        page = await svc.call("ListEvents", key=opened["session_key"], path_id=sid,
                              query={"limit": "2", "cursor": cursor})
        ids += [e["id"] for e in page["items"]]
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert len(ids) == 5 == len(set(ids))
    bad = await problem_of(svc.call("ListEvents", key=opened["session_key"], path_id=sid, query={"cursor": "1x"}))
    assert (bad.status, bad.detail) == (400, 'invalid cursor: "1x"')


async def test_profile_unavailable_and_provider_missing(tmp_path):
    svc = InProcessService(tmp_path)
    try:
        env = Env(svc)
        await env.setup()
        ghost = await svc.admin("CreateProfile", body={"name": "ghost", "primary_provider": "nowhere"})
        ghost_key = await svc.admin("CreateKey", body={"name": "g", "profile_id": ghost["id"]})
        unavailable = await problem_of(env.open(ghost_key))
        assert (unavailable.status, unavailable.type, unavailable.detail) == (
            422, "primary_provider_unavailable",
            'the profile\'s primary provider "nowhere" is not configured in bae-config.toml')
        opened = await env.open(env.key_a)
        errors = await svc.admin("ListSessions", query={"state": "error"})
        [audit] = errors["items"]
        assert audit["profile_id"] == ghost["id"]
        audit_events = await svc.admin("ListSessionEvents", path_id=audit["id"])
        assert audit_events["items"][0]["payload"] == {
            "reason": "primary_provider_unavailable", "profile_id": ghost["id"], "primary_provider": "nowhere"}
        assert (await svc.admin("ListSessions", query={"state": "open"}))["items"][0]["id"] == opened["session_id"]
    finally:
        await svc.stop()


async def test_profile_deleted_after_key_creation(tmp_path):
    """The profile row is soft-deleted underneath a live key (admin refuses; only a race does it)."""
    svc = InProcessService(tmp_path)
    try:
        env = Env(svc)
        await env.setup()
        opened = await env.open(env.key_a)
    finally:
        await svc.stop()
    # Simulate the race with direct SQL while the service is down.
    store = await Store.open(database_url_of(svc.env))
    try:
        await store.write(lambda conn: conn.execute(update(profiles).values(deleted_at="2026-01-01T00:00:00.000Z")))
    finally:
        await store.close()
    svc = InProcessService(tmp_path)
    try:
        problem = await problem_of(env_open(svc, env.key_a))
        assert (problem.status, problem.type, problem.detail) == (
            422, "profile_unavailable", "the profile bound to this client key is no longer available")
        join = await problem_of(svc.call("JoinSession", key=env.key_b["key"], path_id=opened["session_id"], body={}))
        assert join.type == "profile_unavailable"
        errors = (await svc.admin("ListSessions", query={"state": "error"}))["items"]
        assert len(errors) == 2
        events = await svc.admin("ListSessionEvents", path_id=errors[0]["id"])
        assert events["items"][0]["event_type"] == "session.error"
        assert events["items"][0]["payload"] == {"reason": "profile_unavailable", "profile_id": env.profile["id"]}
        # Restart kept the data; the joined session itself is untouched.
        still = (await svc.admin("ListSessions", query={"state": "open"}))["items"]
        assert [s["id"] for s in still] == [opened["session_id"]]
    finally:
        await svc.stop()


def env_open(svc: InProcessService, key: dict):
    return svc.call("OpenSession", key=key["key"], body={})


async def test_revocation_cascade(tmp_path):
    svc = InProcessService(tmp_path)
    try:
        env = Env(svc)
        await env.setup()
        solo = await env.open(env.key_a)
        shared_session = await env.open(env.key_a)
        joined = await svc.call("JoinSession", key=env.key_b["key"], path_id=shared_session["session_id"], body={})
        await svc.admin("RevokeKey", path_id=env.key_a["id"])
        # Immediately: the client key and all its session keys are dead.
        assert (await problem_of(env.open(env.key_a))).detail == "invalid client key"
        for opened in (solo, shared_session):
            problem = await problem_of(svc.call("ListEvents", key=opened["session_key"], path_id=opened["session_id"]))
            assert problem.detail == "invalid session key"
        solo_events = (await svc.admin("ListSessionEvents", path_id=solo["session_id"]))["items"]
        assert solo_events[-1]["event_type"] == "session.close"
        assert solo_events[-1]["payload"] == {"reason": "client_key_revoked"}
        assert solo_events[-1]["client_key_id"] == env.key_a["id"]
        states = {s["id"]: s["state"] for s in (await svc.admin("ListSessions"))["items"]}
        assert states[solo["session_id"]] == "closed"
        assert states[shared_session["session_id"]] == "open"  # b still holds a key
        page = await svc.call("ListEvents", key=joined["session_key"], path_id=shared_session["session_id"])
        assert [e["event_type"] for e in page["items"]] == ["session.open", "session.join"]
    finally:
        await svc.stop()
