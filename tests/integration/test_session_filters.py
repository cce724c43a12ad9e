"""GET /admin/v1/sessions's filters through the gateway, on the service processes: profile_id, client_key_id,
created_after (inclusive), created_before (exclusive) and id_prefix beside state, combined, across pages, and
the 400 of each bad value. Every item (and GET /admin/v1/sessions/{id}) names the key that opened the session."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Iterator

import pytest

from testkit import ROOT
from testkit.processes import service_env
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    # No test here takes a turn: the provider is never called.
    running = launch_stack(tmp_path_factory.mktemp("filters"), mock_provider_toml("http://127.0.0.1:9"),
                           MOCK_LLM_TOKEN="unused")
    yield running
    running.close()


@pytest.fixture(scope="module")
def opened(stack: RunningStack) -> dict:
    """Five sessions, s1 … s5 in that order: s1, s4 and s5 by key k1 of profile p1, s2 by k2 of p1, s3 by
    k3 of p2; s4 closed. Each is created at a later millisecond than the one before."""
    p1, p2 = stack.create_profile("p1"), stack.create_profile("p2")
    keys = {"k1": stack.create_key(p1["id"]), "k2": stack.create_key(p1["id"]), "k3": stack.create_key(p2["id"])}
    ids = {}
    for name, key in (("s1", "k1"), ("s2", "k2"), ("s3", "k3"), ("s4", "k1"), ("s5", "k1")):
        session = stack.open_session(keys[key]["key"])
        ids[name] = session["session_id"]
        if name == "s4":
            closed = stack.client.delete(f"/api/v1/sessions/{ids[name]}",
                                         headers={"Authorization": f"Bearer {session['session_key']}"})
            assert closed.status_code == 200, closed.text
        time.sleep(0.002)
    items = listed(stack, {})
    assert [item["id"] for item in items] == list(ids.values())
    created = {name: item["created_at"] for name, item in zip(ids, items)}
    assert sorted(set(created.values())) == list(created.values())
    return {"p1": p1["id"], "p2": p2["id"], **{name: key["id"] for name, key in keys.items()},
            "ids": ids, "names": {sid: name for name, sid in ids.items()}, "created": created, "items": items}


def listed(stack: RunningStack, query: dict) -> list[dict]:
    response = stack.admin.get("/admin/v1/sessions", params=query)
    assert response.status_code == 200, response.text
    page = response.json()
    assert page["next_cursor"] is None
    return page["items"]


def names(stack: RunningStack, opened: dict, query: dict) -> list[str]:
    return [opened["names"][item["id"]] for item in listed(stack, query)]


def test_items_name_the_key_that_opened_the_session(stack, opened):
    by_id = {item["id"]: item for item in opened["items"]}
    s1 = by_id[opened["ids"]["s1"]]
    assert list(s1) == ["id", "profile_id", "client_key_id", "state", "client_version", "created_at", "closed_at"]
    assert (s1["profile_id"], s1["client_key_id"]) == (opened["p1"], opened["k1"])
    assert by_id[opened["ids"]["s3"]]["client_key_id"] == opened["k3"]
    one = stack.admin.get(f"/admin/v1/sessions/{opened['ids']['s1']}")
    assert one.status_code == 200 and one.json() == s1


def test_each_filter(stack, opened):
    created = opened["created"]
    assert names(stack, opened, {"profile_id": opened["p1"]}) == ["s1", "s2", "s4", "s5"]
    assert names(stack, opened, {"profile_id": opened["p2"]}) == ["s3"]
    assert names(stack, opened, {"client_key_id": opened["k1"]}) == ["s1", "s4", "s5"]
    assert names(stack, opened, {"client_key_id": opened["k2"]}) == ["s2"]
    # created_after keeps the session created at that very time; created_before leaves it out.
    assert names(stack, opened, {"created_after": created["s3"]}) == ["s3", "s4", "s5"]
    assert names(stack, opened, {"created_before": created["s3"]}) == ["s1", "s2"]
    # Any offset names the same instant: s3's time in UTC+02:00.
    shifted = datetime.fromisoformat(created["s3"]).astimezone(timezone(timedelta(hours=2))).isoformat()
    assert names(stack, opened, {"created_after": shifted}) == ["s3", "s4", "s5"]
    # Years before 1000 keep four digits, so they sort before every session's time.
    assert names(stack, opened, {"created_before": "0999-12-31T00:00:00Z"}) == []
    assert names(stack, opened, {"created_after": "0999-12-31T00:00:00Z"}) == ["s1", "s2", "s3", "s4", "s5"]
    s3 = opened["ids"]["s3"]
    assert names(stack, opened, {"id_prefix": s3[:12]}) == ["s3"]
    assert names(stack, opened, {"id_prefix": s3}) == ["s3"]
    assert names(stack, opened, {"id_prefix": "ses_"}) == ["s1", "s2", "s3", "s4", "s5"]
    assert names(stack, opened, {"id_prefix": "SES_"}) == []
    assert names(stack, opened, {"state": "closed"}) == ["s4"]
    # Unknown ids are no error: nothing matches them.
    assert names(stack, opened, {"profile_id": "pro_unknown"}) == []
    assert names(stack, opened, {"client_key_id": "key_unknown"}) == []
    # An empty value filters nothing, as an absent one.
    assert names(stack, opened, {"profile_id": "", "client_key_id": "", "created_after": "", "created_before": "",
                                 "id_prefix": "", "state": ""}) == ["s1", "s2", "s3", "s4", "s5"]


def test_filters_combine_with_and(stack, opened):
    created = opened["created"]
    assert names(stack, opened, {"state": "open", "client_key_id": opened["k1"]}) == ["s1", "s5"]
    assert names(stack, opened, {"profile_id": opened["p1"], "created_before": created["s4"]}) == ["s1", "s2"]
    assert names(stack, opened, {"created_after": created["s2"], "created_before": created["s5"]}) == ["s2", "s3", "s4"]
    assert names(stack, opened, {"profile_id": opened["p2"], "client_key_id": opened["k1"]}) == []
    assert names(stack, opened, {
        "state": "open", "profile_id": opened["p1"], "client_key_id": opened["k1"], "created_after": created["s1"],
        "created_before": created["s5"], "id_prefix": opened["ids"]["s1"][:8],
    }) == ["s1"]
    assert names(stack, opened, {"created_after": created["s3"], "created_before": created["s3"]}) == []


@pytest.mark.parametrize("limit", ["1", "2", "3"])
def test_a_cursor_continues_the_filtered_list(stack, opened, limit):
    query = {"profile_id": opened["p1"], "limit": limit}
    seen, pages = [], 0
    while True:
        response = stack.admin.get("/admin/v1/sessions", params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        pages += 1
        assert 0 < len(page["items"]) <= int(limit)
        seen += [opened["names"][item["id"]] for item in page["items"]]
        if page["next_cursor"] is None:
            break
        query["cursor"] = page["next_cursor"]
    assert seen == ["s1", "s2", "s4", "s5"]
    assert pages == -(-4 // int(limit))
    # With two filters, the second page holds only what both keep.
    first = stack.admin.get("/admin/v1/sessions", params={"client_key_id": opened["k1"], "state": "open", "limit": "1"})
    rest = stack.admin.get("/admin/v1/sessions", params={"client_key_id": opened["k1"], "state": "open", "limit": "5",
                                                         "cursor": first.json()["next_cursor"]})
    assert [opened["names"][item["id"]] for item in first.json()["items"] + rest.json()["items"]] == ["s1", "s5"]
    assert rest.json()["next_cursor"] is None


TIME_HINT = "expected an RFC 3339 time such as 2026-01-01T00:00:00Z"


@pytest.mark.parametrize(("query", "detail"), [
    ({"profile_id": "p" * 65}, f'invalid profile_id filter "{"p" * 65}"; expected an id of at most 64 characters'),
    ({"client_key_id": "k" * 65},
     f'invalid client_key_id filter "{"k" * 65}"; expected an id of at most 64 characters'),
    ({"created_after": "yesterday"}, f'invalid created_after "yesterday"; {TIME_HINT}'),
    ({"created_before": "2026-01-01"}, f'invalid created_before "2026-01-01"; {TIME_HINT}'),
    ({"created_after": "2026-01-01T00:00:00"}, f'invalid created_after "2026-01-01T00:00:00"; {TIME_HINT}'),
    ({"created_before": "0001-01-01T00:00:00+01:00"}, f'invalid created_before "0001-01-01T00:00:00+01:00"; {TIME_HINT}'),
    ({"created_after": "2026-02-01T00:00:00Z", "created_before": "2026-01-01T00:00:00+00:00"},
     "created_after (2026-02-01T00:00:00.000Z) is after created_before (2026-01-01T00:00:00.000Z)"),
    ({"id_prefix": "ses_%"}, 'invalid id_prefix filter "ses_%"; expected 1 to 64 letters, digits, _ or -'),
    ({"id_prefix": "s" * 65}, f'invalid id_prefix filter "{"s" * 65}"; expected 1 to 64 letters, digits, _ or -'),
    ({"state": "gone", "profile_id": "pro_x"}, 'invalid state filter "gone"; expected one of open, closed, error'),
    ({"profile_id": "pro_x", "cursor": "x"}, 'invalid cursor: "x"'),
])
def test_bad_filters_are_400(stack, query, detail):
    response = stack.admin.get("/admin/v1/sessions", params=query)
    assert response.status_code == 400, response.text
    problem = response.json()
    assert (problem["type"], problem["detail"]) == ("bad_request", detail)


def baectl(stack: RunningStack, *args: str) -> subprocess.CompletedProcess:
    env = service_env(BAE_ADMIN_ADDR=str(stack.settings.admin_addr), BAE_ADMIN_TOKEN=stack.admin_key)
    return subprocess.run([sys.executable, "-m", "bae.ctl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_baectl_list_sessions_filters(stack, opened):
    created = opened["created"]
    shown = baectl(stack, "list", "sessions", "--profile-id", opened["p1"], "--client-key-id", opened["k1"],
                   "--state", "open", "--created-after", created["s1"], "--id-prefix", "ses_", "--json")
    assert shown.returncode == 0, shown.stderr
    assert [opened["names"][item["id"]] for item in json.loads(shown.stdout)] == ["s1", "s5"]
    # A day is its start in UTC; every session here was created after today's.
    today = created["s1"][:10]
    before_today = baectl(stack, "sessions", "list", "--created-before", today, "--json")
    assert before_today.returncode == 0 and json.loads(before_today.stdout) == []
    table = baectl(stack, "list", "sessions", "--client-key-id", opened["k2"])
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == ["ID", "PROFILE_ID", "STATE", "CLIENT_VERSION", "CREATED_AT", "CLOSED_AT",
                              "CLIENT_KEY_ID"]
    cells = row.split()
    assert cells[:3] == [opened["ids"]["s2"], opened["p1"], "open"] and cells[-1] == opened["k2"]
    refused = baectl(stack, "list", "sessions", "--created-after", "soon")
    assert refused.returncode == 1
    assert refused.stderr.startswith('baectl: invalid created_after "soon"; expected an RFC 3339 time')
