"""baectl as a process, against the real gateway in front of the SessionService double."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bae.protos import session_pb2
from conftest import ROOT, free_port
from processes import service_env
from test_gateway_envelope import double, gateway  # noqa: F401  (module-scoped fixtures)

PROFILE = {
    "id": "pro_1", "name": "main", "primary_provider": "anthropic-sonnet", "fallback_providers": ["openai"],
    "mcp_servers": [], "allowed_tools": ["get_time", "run"], "available_sandboxes": [],
    "created_at": "2026-07-06T18:26:01.000Z", "updated_at": "2026-07-06T18:26:01.000Z",
}


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin-key.pem"
    path.write_text("  bae_admin_secret\n")
    return path


@pytest.fixture(autouse=True)
def fresh_replies(double):  # noqa: F811
    double.rest_replies.clear()
    yield
    double.rest_replies.clear()


def baectl(gateway, key_file: Path, *args: str, admin_addr: str | None = None) -> subprocess.CompletedProcess:  # noqa: F811
    env = service_env(BAE_ADMIN_ADDR=admin_addr or gateway.env["BAE_ADMIN_ADDR"], BAE_ADMIN_KEY_FILE=str(key_file))
    return subprocess.run([sys.executable, "-m", "bae.ctl", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=30)


def paged(items: list[dict], page_size: int):
    """A reply function serving `items` in pages, with the server's cursor convention."""
    def reply(request: session_pb2.RestRequest) -> str:
        start = int(request.query.get("cursor") or 0)
        end = start + page_size
        next_cursor = str(end) if end < len(items) else None
        return json.dumps({"items": items[start:end], "next_cursor": next_cursor})

    return reply


def test_profiles_create_sends_flags_and_the_trimmed_key(gateway, double, key_file):  # noqa: F811
    double.rest_replies["CreateProfile"] = lambda request: json.dumps(
        {"id": "pro_1", "name": "main", "created_at": "2026-07-06T18:26:01.000Z"})
    result = baectl(gateway, key_file, "profiles", "create", "--name", "main", "--primary-provider", "anthropic-sonnet",
                    "--fallback", "openai", "--fallback", "local", "--allowed-tool", "get_time",
                    "--mcp-server", "filesystem", "--sandbox-image", "python:3.12")
    assert result.returncode == 0, result.stderr
    request = double.last("CreateProfile")
    assert request.authorization == "Bearer bae_admin_secret"
    assert json.loads(request.body) == {
        "name": "main", "primary_provider": "anthropic-sonnet", "fallback_providers": ["openai", "local"],
        "mcp_servers": ["filesystem"], "allowed_tools": ["get_time"], "available_sandboxes": ["python:3.12"],
    }
    assert result.stdout.split() == ["id", "pro_1", "name", "main", "created_at", "2026-07-06T18:26:01.000Z"]


def test_profiles_list_follows_every_page(gateway, double, key_file):  # noqa: F811
    profiles = [{**PROFILE, "id": f"pro_{i}", "name": f"profile-{i}"} for i in range(5)]
    double.rest_replies["ListProfiles"] = paged(profiles, 2)
    result = baectl(gateway, key_file, "profiles", "list")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    assert rows[0].split() == ["ID", "NAME", "PRIMARY", "FALLBACKS", "MCP", "SERVERS", "ALLOWED", "TOOLS",
                               "SANDBOXES", "UPDATED"]
    assert [row.split()[:2] for row in rows[1:]] == [[f"pro_{i}", f"profile-{i}"] for i in range(5)]
    assert rows[1].split()[2:6] == ["anthropic-sonnet", "openai", "-", "get_time,run"]
    assert double.last("ListProfiles").query["limit"] == "200"

    as_json = baectl(gateway, key_file, "profiles", "list", "--json")
    assert json.loads(as_json.stdout) == profiles


def test_profiles_get_replace_delete(gateway, double, key_file):  # noqa: F811
    double.rest_replies["GetProfile"] = lambda request: json.dumps({**PROFILE, "id": request.path_id})
    shown = baectl(gateway, key_file, "--json", "profiles", "get", "pro_7")
    assert json.loads(shown.stdout) == {**PROFILE, "id": "pro_7"}

    double.rest_replies["ReplaceProfile"] = lambda request: json.dumps({**PROFILE, **json.loads(request.body)})
    replaced = baectl(gateway, key_file, "profiles", "replace", "pro_1", "--name", "renamed",
                      "--primary-provider", "openai")
    assert replaced.returncode == 0, replaced.stderr
    assert double.last("ReplaceProfile").path_id == "pro_1"
    assert json.loads(double.last("ReplaceProfile").body) == {
        "name": "renamed", "primary_provider": "openai", "fallback_providers": [], "mcp_servers": [],
        "allowed_tools": [], "available_sandboxes": [],
    }
    assert "renamed" in replaced.stdout

    deleted = baectl(gateway, key_file, "profiles", "delete", "pro_1")
    assert (deleted.returncode, deleted.stdout) == (0, "deleted profile pro_1\n")
    assert double.last("DeleteProfile").path_id == "pro_1"


def test_keys_create_list_revoke(gateway, double, key_file):  # noqa: F811
    double.rest_replies["CreateKey"] = lambda request: json.dumps(
        {"id": "key_1", "name": "laptop", "key": "bae_" + "ab" * 24, "prefix": "bae_abab",
         "profile_id": json.loads(request.body)["profile_id"], "created_at": "2026-07-06T18:26:01.000Z"})
    created = baectl(gateway, key_file, "keys", "create", "--name", "laptop", "--profile-id", "pro_1")
    assert created.returncode == 0, created.stderr
    assert json.loads(double.last("CreateKey").body) == {"name": "laptop", "profile_id": "pro_1"}
    assert "bae_" + "ab" * 24 in created.stdout
    assert "not shown again" in created.stderr

    keys = [{"id": "key_1", "name": "laptop", "prefix": "bae_abab", "profile_id": "pro_1",
             "created_at": "2026-07-06T18:26:01.000Z", "last_used_at": None}]
    double.rest_replies["ListKeys"] = paged(keys, 50)
    listed = baectl(gateway, key_file, "keys", "list")
    assert listed.stdout.splitlines()[1].split() == [
        "key_1", "laptop", "bae_abab", "pro_1", "2026-07-06T18:26:01.000Z", "-"]

    revoked = baectl(gateway, key_file, "keys", "revoke", "key_1", "--json")
    assert json.loads(revoked.stdout) == {"id": "key_1", "revoked": True}
    assert double.last("RevokeKey").path_id == "key_1"


def test_sessions_list_with_state_filter(gateway, double, key_file):  # noqa: F811
    double.rest_replies["ListSessions"] = paged([{"id": "ses_1", "profile_id": "pro_1", "state": "open",
                                                  "client_version": None, "created_at": "t0", "closed_at": None}], 50)
    result = baectl(gateway, key_file, "sessions", "list", "--state", "open")
    assert result.returncode == 0, result.stderr
    assert double.last("ListSessions").query["state"] == "open"
    assert result.stdout.splitlines()[1].split() == ["ses_1", "pro_1", "open", "-", "t0", "-"]
    assert baectl(gateway, key_file, "sessions", "list", "--state", "weird").returncode == 2


def test_events_follow_next_cursor_to_the_end(gateway, double, key_file):  # noqa: F811
    events = [{"id": f"evt_{i}", "session_id": "ses_1", "client_key_id": "key_1", "event_type": "session.open",
               "payload": {"n": i, "text": "x" * 200}, "created_at": "t"} for i in range(7)]
    double.rest_replies["ListSessionEvents"] = paged(events, 3)
    result = baectl(gateway, key_file, "events", "ses_1")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    assert [row.split()[0] for row in rows[1:]] == [f"evt_{i}" for i in range(7)]
    assert all(len(row) < 200 for row in rows)  # long payloads are cut to keep the table readable
    assert double.last("ListSessionEvents").path_id == "ses_1"
    as_json = baectl(gateway, key_file, "events", "ses_1", "--json")
    assert json.loads(as_json.stdout) == events


def test_problem_prints_one_error_line_and_exits_1(gateway, key_file, tmp_path):  # noqa: F811
    result = baectl(gateway, key_file, "profiles", "get", "closed")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == "error: 409 session_closed: session is already closed\n"

    bad_key = tmp_path / "bad.pem"
    bad_key.write_text("bad")
    # The flag wins over BAE_ADMIN_KEY_FILE.
    denied = baectl(gateway, Path("/nonexistent"), "--admin-key-file", str(bad_key), "keys", "list")
    assert (denied.returncode, denied.stderr) == (1, "error: 401 unauthorized: invalid admin key\n")


def test_missing_key_file_sends_no_authorization(gateway, double, tmp_path):  # noqa: F811
    double.rest_replies["ListKeys"] = paged([], 50)
    result = baectl(gateway, tmp_path / "missing.pem", "keys", "list")
    assert (result.returncode, result.stdout) == (0, "no client keys\n")
    assert double.last("ListKeys").has_authorization is False


def test_unreachable_admin_api_exits_1(gateway, key_file):  # noqa: F811
    result = baectl(gateway, key_file, "keys", "list", admin_addr=f"127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot reach the admin API at http://127.0.0.1:")


def test_usage_errors_exit_2(gateway, key_file):  # noqa: F811
    assert baectl(gateway, key_file, "profiles", "create", "--name", "x").returncode == 2
    assert baectl(gateway, key_file, "nonsense").returncode == 2
    assert baectl(gateway, key_file, "keys", "list", admin_addr="localhost:8081").returncode == 2
