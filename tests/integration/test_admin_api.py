"""The admin API of the real session service (in this process), over real gRPC (SERVER-SPEC §4)."""

from __future__ import annotations

import json

import pytest

from testkit.inprocess import InProcessService
from testkit.session_service import problem_of, profile_body

pytestmark = pytest.mark.inprocess


@pytest.fixture
async def service(tmp_path):
    svc = InProcessService(tmp_path)
    yield svc
    await svc.stop()


async def test_profile_crud(service):
    created = await service.admin("CreateProfile", body=profile_body("main", allowed_tools=["t"]))
    assert set(created) == {"id", "name", "created_at"} and created["id"].startswith("pro_")
    got = await service.admin("GetProfile", path_id=created["id"])
    assert got == {
        "id": created["id"], "name": "main", "primary_provider": "mock", "fallback_providers": [],
        "mcp_servers": [], "allowed_tools": ["t"], "available_sandboxes": [], "limits": None, "retention": None,
        "created_at": created["created_at"], "updated_at": created["created_at"],
    }
    replaced = await service.admin(
        "ReplaceProfile", path_id=created["id"], body=profile_body("main2", mcp_servers=["alpha"])
    )
    assert replaced["name"] == "main2" and replaced["allowed_tools"] == [] and replaced["mcp_servers"] == ["alpha"]
    assert replaced["updated_at"] >= replaced["created_at"]
    assert await service.admin("DeleteProfile", path_id=created["id"]) == ""
    missing = await problem_of(service.admin("GetProfile", path_id=created["id"]))
    assert (missing.status, missing.type, missing.detail) == (404, "not_found", f"no profile {created['id']}")
    # Names of deleted profiles stay reserved.
    dup = await problem_of(service.admin("CreateProfile", body=profile_body("main2")))
    assert (dup.status, dup.type, dup.detail) == (409, "duplicate_name", "a profile with that name already exists")
    page = await service.admin("ListProfiles")
    assert page == {"items": [], "next_cursor": None}


@pytest.mark.parametrize(
    "body, detail",
    [
        ({"name": " ", "primary_provider": "mock"}, "name must not be empty"),
        ({"name": "x", "primary_provider": ""}, "primary_provider must not be empty"),
        ({"primary_provider": "mock"}, "invalid request body: missing field `name`"),
        ({"name": 5, "primary_provider": "mock"}, "invalid request body: invalid type: integer `5`, expected a string"),
        (profile_body("x", fallback_providers="a"), "fallback_providers must be an array"),
        (profile_body("x", mcp_servers=["a", 1]), "mcp_servers[1] must be a string (a bae-config.toml registry name)"),
        (profile_body("x", available_sandboxes=[None]), "available_sandboxes[0] must be a string (a bae-config.toml registry name)"),
        (profile_body("x", allowed_tools={}), "allowed_tools must be an array"),
        (b"{not json", "Failed to parse the request body as JSON: expecting property name enclosed in double quotes at line 1 column 2"),
        ([], "invalid request body: invalid type: sequence, expected struct ProfileRequest"),
    ],
)
async def test_profile_body_errors(service, body, detail):
    problem = await problem_of(service.admin("CreateProfile", body=body))
    assert (problem.status, problem.type, problem.detail) == (400, "bad_request", detail)


async def test_profile_body_needs_json_content_type(service):
    problem = await problem_of(service.admin("CreateProfile", body=profile_body("x"), content_type="text/plain"))
    assert problem.detail == "Expected request with `Content-Type: application/json`"
    await service.admin("CreateProfile", body=profile_body("x"), content_type="application/json; charset=utf-8")


async def test_profile_update_errors(service):
    a = await service.admin("CreateProfile", body=profile_body("a"))
    await service.admin("CreateProfile", body=profile_body("b"))
    missing = await problem_of(service.admin("ReplaceProfile", path_id="pro_x", body=profile_body("c")))
    assert (missing.status, missing.detail) == (404, "no profile pro_x")
    dup = await problem_of(service.admin("ReplaceProfile", path_id=a["id"], body=profile_body("b")))
    assert dup.type == "duplicate_name"
    # Keeping its own name is not a duplicate.
    await service.admin("ReplaceProfile", path_id=a["id"], body=profile_body("a"))
    assert (await problem_of(service.admin("DeleteProfile", path_id="pro_x"))).status == 404


async def test_profile_in_use_and_key_lifecycle(service):
    profile = await service.admin("CreateProfile", body=profile_body("p"))
    key = await service.admin("CreateKey", body={"name": "laptop", "profile_id": profile["id"]})
    assert key["key"].startswith("bae_") and len(key["key"]) == 52 and key["prefix"] == key["key"][:8]
    assert set(key) == {"id", "name", "key", "prefix", "profile_id", "created_at"}
    in_use = await problem_of(service.admin("DeleteProfile", path_id=profile["id"]))
    assert (in_use.status, in_use.type, in_use.detail) == (
        409, "profile_in_use", "profile has 1 active client key(s); revoke them before deleting")
    page = await service.admin("ListKeys")
    assert page["items"] == [{"id": key["id"], "name": "laptop", "prefix": key["prefix"],
                              "profile_id": profile["id"], "created_at": key["created_at"], "last_used_at": None}]
    # Using the key stamps last_used_at (coalesced, but visible to the key listing).
    await service.call("OpenSession", key=key["key"], body={})
    assert (await service.admin("ListKeys"))["items"][0]["last_used_at"] is not None
    assert await service.admin("RevokeKey", path_id=key["id"]) == ""
    gone = await problem_of(service.admin("RevokeKey", path_id=key["id"]))
    assert (gone.status, gone.detail) == (404, f"no active client key {key['id']}")
    assert (await service.admin("ListKeys"))["items"] == []
    await service.admin("DeleteProfile", path_id=profile["id"])


async def test_key_errors(service):
    blank = await problem_of(service.admin("CreateKey", body={"name": "", "profile_id": "pro_x"}))
    assert (blank.status, blank.detail) == (400, "name must not be empty")
    nobody = await problem_of(service.admin("CreateKey", body={"name": "k", "profile_id": "pro_x"}))
    assert (nobody.status, nobody.type, nobody.detail) == (422, "profile_unavailable", "no active profile pro_x")
    missing = await problem_of(service.admin("CreateKey", body={"name": "k"}))
    assert (missing.status, missing.detail) == (400, "invalid request body: missing field `profile_id`")
    session_key = await problem_of(service.admin("RevokeKey", path_id="key_nope"))
    assert session_key.status == 404


async def test_admin_auth(service):
    for key, detail in [
        (None, "missing Authorization header"),
        ("", "empty bearer token"),
        ("bae_admin_" + "0" * 48, "invalid admin key"),
    ]:
        problem = await problem_of(service.call("ListProfiles", key=key))
        assert (problem.status, problem.type, problem.detail) == (401, "unauthorized", detail)
    token = await problem_of(service.call("ListProfiles", authorization=f"Token {service.admin_key}"))
    assert token.detail == "Authorization header must be a Bearer token"
    assert (await service.call("ListProfiles", authorization=f"bearer {service.admin_key}"))["items"] == []
    # Auth runs before the body is looked at.
    problem = await problem_of(service.call("CreateProfile", key="nope", body=b"{"))
    assert problem.status == 401


async def test_pagination_round_trip(service):
    names = [f"p{i:02d}" for i in range(7)]
    for name in names:
        await service.admin("CreateProfile", body=profile_body(name))
    seen, cursor = [], None
    while True:
        query = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        page = await service.admin("ListProfiles", query=query)
        seen += [item["name"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert len(page["items"]) == 3
    assert seen == names
    exact = await service.admin("ListProfiles", query={"limit": "7"})
    assert len(exact["items"]) == 7 and exact["next_cursor"] is None
    assert len((await service.admin("ListProfiles", query={"limit": "1000"}))["items"]) == 7
    for query, detail in [
        ({"limit": "0"}, "limit must be a positive integer"),
        ({"limit": "-1"}, "limit must be a positive integer"),
        ({"limit": "ten"}, "limit must be a positive integer"),
        ({"cursor": "abc"}, 'invalid cursor: "abc"'),
    ]:
        problem = await problem_of(service.admin("ListProfiles", query=query))
        assert (problem.status, problem.detail) == (400, detail)


async def test_sessions_and_events(service):
    profile = await service.admin("CreateProfile", body=profile_body("p"))
    key = await service.admin("CreateKey", body={"name": "k", "profile_id": profile["id"]})
    opened = await service.call("OpenSession", key=key["key"], body={"client_version": "9"})
    listed = await service.admin("ListSessions", query={"state": "open"})
    assert listed["items"] == [{
        "id": opened["session_id"], "profile_id": profile["id"], "client_key_id": key["id"], "state": "open",
        "client_version": "9",
        "created_at": listed["items"][0]["created_at"], "closed_at": None,
    }]
    assert (await service.admin("ListSessions", query={"state": "closed"}))["items"] == []
    bad = await problem_of(service.admin("ListSessions", query={"state": "gone"}))
    assert bad.detail == 'invalid state filter "gone"; expected one of open, closed, error'
    admin_events = await service.admin("ListSessionEvents", path_id=opened["session_id"])
    assert [e["event_type"] for e in admin_events["items"]] == ["session.open"]
    # The same page as the client endpoint's.
    assert admin_events == await service.call("ListEvents", key=opened["session_key"], path_id=opened["session_id"])
    missing = await problem_of(service.admin("ListSessionEvents", path_id="ses_x"))
    assert (missing.status, missing.detail) == (404, "no session ses_x")
    # One session's summary: the list's item.
    assert await service.admin("GetSession", path_id=opened["session_id"]) == listed["items"][0]
    unknown = await problem_of(service.admin("GetSession", path_id="ses_x"))
    assert (unknown.status, unknown.type, unknown.detail) == (404, "not_found", "no session ses_x")
    assert (await problem_of(service.call("GetSession", key="nope", path_id=opened["session_id"]))).status == 401


async def test_registries_and_config(service):
    assert await service.admin("ListMcpServers") == {
        "items": [{"name": "alpha", "transport": "stdio"}, {"name": "zeta", "transport": "sse"}]}
    providers = await service.admin("ListProviders")
    assert providers["items"][0]["name"] == "mock" and providers["items"][0]["model"] == "claude-test"
    config = await service.admin("GetConfig")
    assert config["providers"]["entries"][0]["auth_token"] == "••••••••"
    assert "sk-secret" not in json.dumps(config)
    assert await service.admin("GetSandboxStatus") == {"items": []}


async def test_disabled_admin_auth(tmp_path):
    svc = InProcessService(tmp_path, ["--dangerously-disable-admin-auth"])
    try:
        assert not (tmp_path / "admin-key.pem").exists()
        assert (await svc.call("ListProfiles"))["items"] == []
        assert (await svc.call("ListProfiles", key="whatever"))["items"] == []
    finally:
        await svc.stop()
