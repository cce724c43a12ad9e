"""Every admin and client REST route through the real gateway and session service."""

from __future__ import annotations

import pytest

from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.inprocess


def test_every_route_answers_through_the_gateway(start_inprocess_stack):
    stack = start_inprocess_stack(config_toml=mock_provider_toml("http://127.0.0.1:9"))
    admin, client = stack.admin, stack.client

    assert client.get("/healthz").status_code == 200
    assert client.get("/api/v1/meta").json() == {"version": "0.1.0", "api_versions": ["v1"]}

    profile = stack.create_profile("main", allowed_tools=["clock"])
    assert admin.get(f"/admin/v1/profiles/{profile['id']}").json()["name"] == "main"
    assert [p["id"] for p in admin.get("/admin/v1/profiles").json()["items"]] == [profile["id"]]
    replaced = admin.put(f"/admin/v1/profiles/{profile['id']}", json={"name": "main", "primary_provider": "mock"})
    assert replaced.status_code == 200 and replaced.json()["allowed_tools"] == []
    assert admin.post("/admin/v1/profiles", json={"name": "main", "primary_provider": "mock"}).json()["type"] == "duplicate_name"

    key = stack.create_key(profile["id"])
    assert [k["id"] for k in admin.get("/admin/v1/keys").json()["items"]] == [key["id"]]
    assert admin.delete(f"/admin/v1/profiles/{profile['id']}").json()["type"] == "profile_in_use"

    denied = client.post("/api/v1/sessions", json={"tools": [{"name": "clock"}]},
                         headers={"Authorization": f"Bearer {key['key']}"})
    assert denied.status_code == 403 and denied.json()["type"] == "tool_not_allowed"
    opened = stack.open_session(key["key"])
    sid, auth = opened["session_id"], {"Authorization": f"Bearer {opened['session_key']}"}
    joined = client.post(f"/api/v1/sessions/{sid}/join", json={}, headers={"Authorization": f"Bearer {key['key']}"})
    assert joined.status_code == 201
    assert client.get(f"/api/v1/sessions/{sid}/participants", headers=auth).json() == {"drivers": []}
    client_page = client.get(f"/api/v1/sessions/{sid}/events?limit=1", headers=auth)
    admin_page = admin.get(f"/admin/v1/sessions/{sid}/events?limit=1")
    assert client_page.content == admin_page.content
    assert client_page.json()["next_cursor"] is not None
    assert [s["id"] for s in admin.get("/admin/v1/sessions?state=open").json()["items"]] == [sid]

    assert client.delete(f"/api/v1/sessions/{sid}", headers=auth).json() == {"session_id": sid, "state": "closed"}
    assert client.delete(f"/api/v1/sessions/{sid}", headers=auth).json()["type"] == "session_closed"

    assert admin.get("/admin/v1/mcp-servers").json() == {"items": []}
    assert admin.get("/admin/v1/providers").json()["items"][0]["name"] == "mock"
    assert admin.get("/admin/v1/config").json()["providers"]["entries"][0]["auth_token"] == "\u2022" * 8
    assert admin.get("/admin/v1/sandbox-status").json() == {"items": []}

    assert admin.delete(f"/admin/v1/keys/{key['id']}").status_code == 204
    assert client.get(f"/api/v1/sessions/{sid}/events", headers=auth).status_code == 401
    assert admin.delete(f"/admin/v1/profiles/{profile['id']}").status_code == 204
    assert admin.get(f"/admin/v1/profiles/{profile['id']}").status_code == 404
    # Neither port serves the other's routes, and the admin key never works on the client port.
    assert client.get("/admin/v1/profiles").status_code == 404
    assert admin.get("/api/v1/meta").status_code == 404
