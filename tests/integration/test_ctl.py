"""baectl as a process, against a real stack through the gateway's admin port (BAECTL.md); the stack runs in
this process unless a test needs a sandbox host or starts the services itself."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from bae.common.config import load_config, resolve_env
from bae.launcher.stack import Stack
from testkit import ROOT
from testkit.processes import service_env
from testkit.inprocess import launch_inprocess_stack
from testkit.stack import StackClients, StackFactory, mock_provider_toml, stack_env

pytestmark = pytest.mark.stack

CONFIG = mock_provider_toml("http://127.0.0.1:9") + mock_provider_toml(
    "http://127.0.0.1:9", name="another", kind="openai") + """
[[mcp.servers]]
name = "zeta"
transport = "http"
url = "http://127.0.0.1:9/mcp"
headers = { Authorization = "Bearer ${SOME_TOKEN}" }

[[mcp.servers]]
name = "alpha"
transport = "stdio"
command = "true"
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackClients]:
    running = launch_inprocess_stack(tmp_path_factory.mktemp("ctl"), CONFIG)
    yield running
    running.close()


def baectl(stack: StackClients | None, *args: str, stdin: str = "", cwd: Path = ROOT,
           **env: str) -> subprocess.CompletedProcess:
    """baectl with the stack's admin address and token in its environment, unless `env` says otherwise."""
    defaults = {"BAE_ADMIN_ADDR": str(stack.settings.admin_addr), "BAE_ADMIN_TOKEN": stack.admin_key} \
        if stack is not None else {}
    variables = {key: value for key, value in {**defaults, **env}.items() if value is not None}
    return subprocess.run([sys.executable, "-m", "bae.ctl", *args], cwd=cwd, env=service_env(**variables),
                          input=stdin, capture_output=True, text=True, timeout=60)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def fails(result: subprocess.CompletedProcess) -> str:
    """The runtime-error line(s): exit 1, `baectl:` first, never a JSON dump."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("baectl: "), result.stderr
    assert "{" not in result.stderr
    return result.stderr.removeprefix("baectl: ").rstrip("\n")


def field(output: str, label: str) -> str:
    return re.search(rf"^\s*{label}:\s+(\S+)", output, re.M).group(1)


# --- conventions --------------------------------------------------------------------------------

def test_version_help_and_usage_errors() -> None:
    assert ok(baectl(None, "--version")) == "baectl 0.1.0\n"
    assert ok(baectl(None, "-V")) == "baectl 0.1.0\n"
    assert ok(baectl(None, "--help")).startswith("usage: baectl")
    assert ok(baectl(None, "help", "create", "profile")).startswith("usage: baectl create profile")
    assert ok(baectl(None, "list", "keys", "-h")).startswith("usage: baectl list keys")
    for usage in (["list", "profiles", "--limit", "abc"], [], ["create"], ["create", "profile", "only-name"],
                  ["frobnicate"], ["list", "profiles", "--bogus"]):
        result = baectl(None, *usage)
        assert result.returncode == 2, usage
        assert "usage:" in result.stderr and not result.stderr.startswith("baectl: ")


def test_unreachable_server() -> None:
    result = baectl(None, "list", "profiles", "--admin-addr", "127.0.0.1:9")
    assert fails(result) == ("could not connect to admin API at 127.0.0.1:9 — is the BAE server running and is "
                             "--admin-addr correct?")
    assert "could not connect to admin API at not a url" in fails(baectl(None, "list", "keys",
                                                                        "--admin-addr", "not a url"))


# --- the lifecycle ------------------------------------------------------------------------------

def test_full_lifecycle(stack: StackClients) -> None:
    created = ok(baectl(stack, "create", "profile", "life", "mock", "--fallback", "another", "--fallback", "x,y",
                        "--allowed-tool", "get_time", "--sandbox", "img:1"))
    lines = created.splitlines()
    assert lines[0] == "created profile"
    assert [line[:14] for line in lines[1:]] == ["  id:         ", "  name:       ", "  created_at: "]
    profile_id = field(created, "id")
    assert field(created, "name") == "life"

    shown = ok(baectl(stack, "get", "profile", profile_id))
    assert shown.splitlines() == [
        f"id:               {profile_id}", "name:             life", "primary_provider: mock",
        "fallback_providers: another, x,y", "mcp_servers: (none)", "allowed_tools: get_time",
        f"created_at:       {field(shown, 'created_at')}", f"updated_at:       {field(shown, 'updated_at')}"]
    as_json = json.loads(ok(baectl(stack, "get", "profile", profile_id, "--json")))
    assert as_json["available_sandboxes"] == ["img:1"] and as_json["fallback_providers"] == ["another", "x,y"]

    listed = ok(baectl(stack, "list", "profiles")).splitlines()
    assert listed[0].split() == ["ID", "NAME", "PRIMARY_PROVIDER"]
    assert [profile_id, "life", "mock"] in [row.split() for row in listed[1:]]

    # Without --name the name is kept; without --sandbox the images are kept; lists not repeated are cleared.
    updated = ok(baectl(stack, "update", "profile", profile_id, "another", "--mcp-server", "alpha"))
    assert "name:             life" in updated and "primary_provider: another" in updated
    assert "fallback_providers: (none)" in updated and "mcp_servers: alpha" in updated
    after = json.loads(ok(baectl(stack, "get", "profile", profile_id, "--json")))
    assert (after["name"], after["available_sandboxes"], after["allowed_tools"]) == ("life", ["img:1"], [])
    renamed = json.loads(ok(baectl(stack, "update", "profile", "--name", "life2", profile_id, "mock",
                                   "--sandbox", "img:2", "--json")))
    assert (renamed["name"], renamed["available_sandboxes"]) == ("life2", ["img:2"])

    key = baectl(stack, "create", "key", "laptop", profile_id)
    assert key.returncode == 0, key.stderr
    assert key.stdout.splitlines()[0] == "created key"
    assert [line[:14] for line in key.stdout.splitlines()[1:]] == [
        "  id:         ", "  name:       ", "  key:        ", "  prefix:     ", "  profile_id: ", "  created_at: "]
    assert field(key.stdout, "key").startswith("bae_")
    assert key.stderr == "baectl: copy the key now — it cannot be retrieved again\n"
    key_id = field(key.stdout, "id")
    keys = ok(baectl(stack, "list", "keys")).splitlines()
    assert keys[0].split() == ["ID", "NAME", "PREFIX", "PROFILE_ID"]
    assert [key_id, "laptop", field(key.stdout, "prefix"), profile_id] in [row.split() for row in keys[1:]]

    assert ok(baectl(stack, "delete", "key", key_id)) == f"revoked key {key_id}\n"
    assert ok(baectl(stack, "delete", "profile", profile_id)) == f"deleted profile {profile_id}\n"
    assert fails(baectl(stack, "get", "profile", profile_id)) == f"no profile {profile_id}"


def test_profile_limits(stack: StackClients) -> None:
    created = ok(baectl(stack, "create", "profile", "limited", "mock", "--set-limit", "max_open_sessions_per_key=3",
                        "--set-limit", "session_cost_usd=2.5"))
    profile_id = field(created, "id")
    shown = ok(baectl(stack, "get", "profile", profile_id))
    assert "limits: max_open_sessions_per_key=3, session_cost_usd=2.5" in shown.splitlines()
    # An update keeps them unless told otherwise; --set-limit replaces them; --default-limits drops them.
    kept = json.loads(ok(baectl(stack, "update", "profile", profile_id, "mock", "--json")))
    assert kept["limits"] == {"max_open_sessions_per_key": 3, "session_cost_usd": 2.5}
    replaced = json.loads(ok(baectl(stack, "update", "profile", profile_id, "mock", "--set-limit", "burst=7", "--json")))
    assert replaced["limits"] == {"burst": 7}
    dropped = json.loads(ok(baectl(stack, "update", "profile", profile_id, "mock", "--default-limits", "--json")))
    assert dropped["limits"] is None
    assert fails(baectl(stack, "create", "profile", "bad", "mock", "--set-limit", "burst=0")) == \
        "limits.burst must be at least 1"
    assert "expected KEY=NUMBER" in baectl(stack, "create", "profile", "bad", "mock", "--set-limit", "burst").stderr


def test_create_key_json_still_warns(stack: StackClients) -> None:
    profile_id = stack.create_profile("warned")["id"]
    result = baectl(stack, "create", "key", "k", profile_id, "--json")
    assert json.loads(result.stdout)["key"].startswith("bae_")
    assert "copy the key now" in result.stderr
    assert result.stdout.startswith('{\n  "created_at"')  # sorted keys, two-space indent


def test_error_messages(stack: StackClients) -> None:
    profile_id = stack.create_profile("busy")["id"]
    stack.create_key(profile_id)
    assert fails(baectl(stack, "create", "profile", "busy", "mock")) == "a profile with that name already exists"
    in_use = fails(baectl(stack, "delete", "profile", profile_id))
    assert in_use.splitlines() == [
        "profile has 1 active client key(s); revoke them before deleting",
        "Revoke the profile's active keys first: run `baectl list keys` to find them, then "
        "`baectl delete key <id>` for each, and retry the delete."]
    missing = fails(baectl(stack, "create", "key", "k", "pro_" + "0" * 32))
    assert missing.endswith("(the referenced profile does not exist or was deleted)")
    assert "does not exist or was deleted" in missing
    assert fails(baectl(stack, "get", "profile", "pro_bogus")) == "no profile pro_bogus"
    assert fails(baectl(stack, "delete", "profile", "pro_bogus")) == "no profile pro_bogus"
    assert fails(baectl(stack, "delete", "key", "key_bogus")) == "no active client key key_bogus"
    assert "limit must be a positive integer" in fails(baectl(stack, "list", "profiles", "--limit", "0"))


def test_pagination(stack: StackClients) -> None:
    # A session list is paginated like profiles; 51 profiles make the point with the default page of 50.
    for index in range(51 - len(stack.admin.get("/admin/v1/profiles", params={"limit": 200}).json()["items"])):
        stack.create_profile(f"page-{index:02d}")
    everything = json.loads(ok(baectl(stack, "list", "profiles", "--json")))
    assert isinstance(everything, list) and len(everything) == 51
    first = json.loads(ok(baectl(stack, "list", "profiles", "--limit", "20", "--json")))
    assert len(first["items"]) == 20 and isinstance(first["next_cursor"], str)
    second = json.loads(ok(baectl(stack, "list", "profiles", "--limit", "20", "--cursor", first["next_cursor"],
                                  "--json")))
    assert [p["id"] for p in second["items"]] == [p["id"] for p in everything[20:40]]
    assert set(json.loads(ok(baectl(stack, "list", "profiles", "--cursor", "", "--json")))) == {"items", "next_cursor"}
    table = baectl(stack, "list", "profiles", "--limit", "2")
    assert len(table.stdout.splitlines()) == 3 and "baectl: more results: --cursor " in table.stderr


def test_empty_lists(tmp_path: Path) -> None:
    empty = launch_inprocess_stack(tmp_path)
    try:
        assert ok(baectl(empty, "list", "profiles")) == "no profiles found\n"
        assert ok(baectl(empty, "list", "keys")) == "no keys found\n"
        assert ok(baectl(empty, "list", "sessions")) == "no sessions found\n"
        assert json.loads(ok(baectl(empty, "list", "keys", "--json"))) == []
        assert ok(baectl(empty, "providers")) == "no providers configured\n"
        assert ok(baectl(empty, "mcp-servers")) == "no MCP servers configured\n"
        assert ok(baectl(empty, "sandbox-status")) == "no sandbox images\n"
    finally:
        empty.close()


# --- addresses and tokens -------------------------------------------------------------------------

def test_address_forms(stack: StackClients) -> None:
    port = stack.settings.admin_addr.port
    for address in (f"localhost:{port}", f"http://127.0.0.1:{port}/", f"http://localhost:{port}"):
        assert ok(baectl(stack, "list", "keys", "--admin-addr", address, BAE_ADMIN_ADDR="127.0.0.1:9"))
    # An empty variable counts as unset: the default 127.0.0.1:8081, whatever answers there (no token sent).
    defaulted = baectl(stack, "list", "keys", BAE_ADMIN_ADDR="", BAE_ADMIN_TOKEN=None)
    assert "127.0.0.1:8081" in defaulted.stderr or "401 unauthorized" in defaulted.stderr or defaulted.returncode == 0
    # The flag wins over the variable, before the command or between its words.
    for placed in (["--admin-addr", f"127.0.0.1:{port}", "list", "keys"], ["list", f"--admin-addr=127.0.0.1:{port}", "keys"]):
        assert ok(baectl(stack, *placed, BAE_ADMIN_ADDR="127.0.0.1:9"))


def test_token_sources(stack: StackClients, tmp_path: Path) -> None:
    good, stale = tmp_path / "good.pem", tmp_path / "stale.pem"
    good.write_text(stack.admin_key + "\n")
    stale.write_text("bae_admin_" + "0" * 48 + "\n")
    assert ok(baectl(stack, "list", "keys", BAE_ADMIN_TOKEN=None, BAE_ADMIN_KEY_FILE=str(good)))
    rejected = fails(baectl(stack, "list", "keys", BAE_ADMIN_TOKEN=None, BAE_ADMIN_KEY_FILE=str(stale)))
    assert rejected.splitlines()[0] == ("admin API rejected the request: no valid admin token was supplied "
                                        "(401 unauthorized).")
    assert "--admin-key-file <path> (or the BAE_ADMIN_KEY_FILE env var)" in rejected
    assert ok(baectl(stack, "list", "keys", "--admin-token", stack.admin_key, BAE_ADMIN_TOKEN=None,
                     BAE_ADMIN_KEY_FILE=str(stale)))
    # BAE_ADMIN_TOKEN beats the key file; an empty one is skipped; --admin-key-file beats the variable.
    assert ok(baectl(stack, "list", "keys", BAE_ADMIN_KEY_FILE=str(stale)))
    assert ok(baectl(stack, "list", "keys", BAE_ADMIN_TOKEN="", BAE_ADMIN_KEY_FILE=str(good)))
    assert ok(baectl(stack, "list", "keys", "--admin-key-file", str(good), BAE_ADMIN_TOKEN=None,
                     BAE_ADMIN_KEY_FILE=str(stale)))
    unreadable = fails(baectl(stack, "list", "keys", BAE_ADMIN_TOKEN=None, BAE_ADMIN_KEY_FILE=str(tmp_path / "nope")))
    assert unreadable == f"could not read admin key file {tmp_path / 'nope'}: No such file or directory"
    # No token at all: no header, and the 401 block.
    assert "401 unauthorized" in fails(baectl(stack, "list", "keys", BAE_ADMIN_TOKEN=None))


def test_auth_create_key_is_accepted_by_a_server_that_ingests_its_hash(tmp_path: Path) -> None:
    out = tmp_path / "keys"
    out.mkdir()
    result = baectl(None, "auth", "create", "key", "--name", "ops", "--out-dir", str(out),
                    "--admin-addr", "ignored:1")
    assert result.stdout.splitlines() == [str(out / "admin-key.pem"), str(out / "admin-key-hash.pem")]
    assert result.stderr.startswith("baectl: wrote admin key pair.\n- ")
    token = (out / "admin-key.pem").read_text()
    assert re.fullmatch(r"bae_admin_[0-9a-f]{48}\n", token)
    hashed = json.loads((out / "admin-key-hash.pem").read_text())
    assert hashed["name"] == "ops" and hashed["prefix"] == token[:14]
    assert hashed["key_hash"].startswith("$argon2id$v=19$m=65536,t=3,p=1$")
    for name in ("admin-key.pem", "admin-key-hash.pem"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600
    default = baectl(None, "auth", "create", "key", cwd=tmp_path)
    assert default.stdout.splitlines() == ["./admin-key.pem", "./admin-key-hash.pem"]
    assert fails(baectl(None, "auth", "create", "key", "--out-dir", str(tmp_path / "missing"))).startswith(
        f"could not write {tmp_path / 'missing' / 'admin-key.pem'}: ")

    server_dir = tmp_path / "server"
    server_dir.mkdir()
    server = Stack(env=stack_env(server_dir, BAE_ADMIN_KEY_HASH_FILE=str(out / "admin-key-hash.pem")))
    server.start()
    try:
        assert not Path(server.settings.admin_key_file).exists()  # an ingested hash writes no key file
        listed = baectl(None, "list", "keys", BAE_ADMIN_ADDR=str(server.settings.admin_addr),
                        BAE_ADMIN_KEY_FILE=str(out / "admin-key.pem"))
        assert ok(listed) == "no keys found\n"
    finally:
        server.stop()


# --- operator commands beyond BAECTL.md ------------------------------------------------------------

def test_registries_and_config(stack: StackClients) -> None:
    providers = ok(baectl(stack, "providers")).splitlines()
    assert providers[0].split() == ["NAME", "PROVIDER", "MODEL", "BASE_URL"]
    assert [row.split()[0] for row in providers[1:]] == ["another", "mock"]
    assert [row.split() for row in ok(baectl(stack, "mcp-servers")).splitlines()] == [
        ["NAME", "TRANSPORT"], ["alpha", "stdio"], ["zeta", "http"]]
    config = json.loads(ok(baectl(stack, "config")))
    assert [server["name"] for server in config["mcp"]["servers"]] == ["alpha", "zeta"]
    assert [entry["name"] for entry in config["providers"]["entries"]] == ["another", "mock"]
    assert config["mcp"]["servers"][1]["headers"] == {"Authorization": "••••••••"}
    assert json.loads(ok(baectl(stack, "providers", "--json")))["items"][0]["name"] == "another"


def test_sessions_and_events(stack: StackClients) -> None:
    profile_id = stack.create_profile("sessions")["id"]
    opened = stack.open_session(stack.create_key(profile_id)["key"])
    sessions = ok(baectl(stack, "list", "sessions", "--state", "open"))
    assert [opened["session_id"], profile_id, "open"] in [row.split()[:3] for row in sessions.splitlines()[1:]]
    events = ok(baectl(stack, "list", "events", opened["session_id"])).splitlines()
    assert events[0].split() == ["ID", "EVENT_TYPE", "CLIENT_KEY_ID", "CREATED_AT", "PAYLOAD"]
    assert events[1].split()[1] == "session.open"
    as_json = json.loads(ok(baectl(stack, "list", "events", opened["session_id"], "--json")))
    assert as_json[0]["event_type"] == "session.open"
    assert fails(baectl(stack, "list", "events", "ses_bogus")) == "no session ses_bogus"
    assert baectl(stack, "list", "sessions", "--state", "weird").returncode == 2


def test_sandbox_status_watch_ends_when_no_image_is_pending(start_stack: StackFactory) -> None:
    stack = start_stack(CONFIG)  # processes: an image's status comes from a sandbox host
    profile_id = stack.create_profile("imgs", available_sandboxes=["bae-test-no-such-image:never"])["id"]
    watched = baectl(stack, "sandbox-status", "--watch", "--interval", "0.2")
    assert watched.returncode == 1, watched.stderr
    assert "sandbox image(s) failed to provision" in watched.stderr
    rows = [row.split()[:3] for row in watched.stdout.splitlines()]
    assert rows[0] == ["PROFILE_ID", "IMAGE", "STATUS"]
    assert [profile_id, "bae-test-no-such-image:never", "error"] in rows
    status = json.loads(ok(baectl(stack, "sandbox-status", "--json")))
    assert any(item["profile_id"] == profile_id for item in status["items"])


def test_resource_first_aliases(stack: StackClients) -> None:
    created = ok(baectl(stack, "profiles", "create", "--name", "alias", "--primary-provider", "mock",
                        "--sandbox-image", "img:a"))
    profile_id = field(created, "id")
    assert f"{profile_id}  alias" in ok(baectl(stack, "profiles", "list"))
    assert "name:             alias" in ok(baectl(stack, "profiles", "get", profile_id))
    replaced = json.loads(ok(baectl(stack, "profiles", "replace", profile_id, "--primary-provider", "another",
                                    "--json")))
    assert (replaced["name"], replaced["primary_provider"], replaced["available_sandboxes"]) == (
        "alias", "another", ["img:a"])
    key = baectl(stack, "keys", "create", "--name", "k", "--profile-id", profile_id)
    key_id = field(key.stdout, "id")
    assert key_id in ok(baectl(stack, "keys", "list"))
    assert ok(baectl(stack, "keys", "revoke", key_id)) == f"revoked key {key_id}\n"
    assert ok(baectl(stack, "profiles", "delete", profile_id)) == f"deleted profile {profile_id}\n"
    assert ok(baectl(stack, "sessions", "list")).startswith("ID")
    assert fails(baectl(stack, "events", "ses_bogus")) == "no session ses_bogus"


# --- responses a server of another version might give ---------------------------------------------

class OddServer(BaseHTTPRequestHandler):
    """Answers every request with the (status, body) queued for its path."""

    replies: dict[str, tuple[int, bytes]] = {}

    def _answer(self) -> None:
        status, body = self.replies.get(self.path.split("?")[0], (404, b""))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def odd() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OddServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/prefix/"
    server.shutdown()
    OddServer.replies.clear()


def test_unexpected_responses(odd: str) -> None:
    unexpected = "unexpected response from admin API — check that baectl and the server are the same version"
    OddServer.replies.update({
        "/prefix/admin/v1/profiles/pro_text": (200, b"not json"),
        "/prefix/admin/v1/profiles/pro_empty": (200, b""),
        "/prefix/admin/v1/profiles/pro_html": (500, b"<html>oops</html>"),
        "/prefix/admin/v1/profiles/pro_blank": (400, b'{"type":"bad_request","detail":"  "}'),
        "/prefix/admin/v1/profiles/pro_noname": (200, b'{"id":"pro_noname"}'),
        "/prefix/admin/v1/keys": (200, b'{"no_items":[]}'),
    })
    assert fails(baectl(None, "get", "profile", "pro_text", "--admin-addr", odd)) == unexpected
    assert fails(baectl(None, "get", "profile", "pro_empty", "--admin-addr", odd)) == unexpected
    assert fails(baectl(None, "list", "keys", "--admin-addr", odd)) == unexpected
    assert fails(baectl(None, "get", "profile", "pro_html", "--admin-addr", odd)) == (
        "admin API returned HTTP 500 with an unrecognized body")
    assert fails(baectl(None, "get", "profile", "pro_blank", "--admin-addr", odd)) == (
        "the admin API returned an error with no detail")
    assert fails(baectl(None, "update", "profile", "pro_noname", "mock", "--admin-addr", odd)) == (
        "could not determine the profile's current name to preserve; pass --name explicitly")


# --- setup ----------------------------------------------------------------------------------------

def fake_tools(directory: Path, *, plugin: bool = False, v1: bool = False) -> str:
    """A PATH of stand-ins: `docker` (whose `compose version` succeeds with `plugin`) and, with `v1`,
    `docker-compose`; each logs its arguments to calls.log beside them."""
    directory.mkdir(exist_ok=True)
    calls = directory / "calls.log"
    docker = directory / "docker"
    docker.write_text(f'#!/bin/sh\necho "docker $@" >> {calls}\n'
                      f'[ "$1" = compose ] && exit {0 if plugin else 1}\nexit 0\n')
    docker.chmod(0o755)
    if v1:
        compose = directory / "docker-compose"
        compose.write_text(f'#!/bin/sh\necho "docker-compose $@" >> {calls}\nexit 0\n')
        compose.chmod(0o755)
    return str(directory)


def compose_services(directory: Path) -> dict:
    import yaml

    return yaml.safe_load((directory / "docker-compose.yml").read_text())["services"]


def test_setup_unattended_writes_the_files_and_does_not_launch(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = baectl(None, "setup", "--dir", str(out), cwd=out, ANTHROPIC_API_KEY="sk-ant-from-env",
                    PATH=fake_tools(tmp_path / "bin", plugin=True))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "To launch the configuration:", "  docker compose up -d",
        "Re-running `baectl setup` in this directory offers the launch step again without redoing the Q&A."]
    config = (out / "bae-config.toml").read_text().splitlines()
    assert re.fullmatch(r"# Generated by `baectl setup` \(variant: standard, flags: \(none\), unix: \d+\)\.",
                        config[0])
    assert config[2:] == ["", "[mcp]", "", "[providers]", "", "[[providers.entries]]", 'name = "anthropic-default"',
                          'provider = "anthropic"', 'model = "sonnet-5"', 'auth_token = "${ANTHROPIC_API_KEY}"']
    env = (out / ".env").read_text().splitlines()
    assert env[2:4] == ["# Holds secrets and non-default BAE_* overrides. Sourced by the launcher.", "",]
    assert env[4] == "ANTHROPIC_API_KEY=sk-ant-from-env"
    # The internal plane's token, generated: every service of the compose file reads it from .env.
    assert re.fullmatch(r"BAE_INTERNAL_TOKEN=[0-9a-f]{64}", env[5]) and len(env) == 6
    # Published images: this project's four, under the registry prefix the operator sets in .env.
    services = compose_services(out)
    assert sorted(services) == ["gateway", "runner", "sandbox", "session"]
    assert all(service["image"].startswith("${BAE_IMAGE_PREFIX:?") and
               service["image"].endswith(f"}}-{name}:0.1.0") for name, service in services.items())
    assert services["gateway"]["ports"] == ["${BAE_ADDR_PORT:-8080}:8080"]
    assert "8081" not in str(services["gateway"]["ports"])
    modes = {name: stat.S_IMODE((out / name).stat().st_mode)
             for name in ("bae-config.toml", ".env", "docker-compose.yml")}
    assert modes == {"bae-config.toml": 0o644, ".env": 0o600, "docker-compose.yml": 0o644}

    again = baectl(None, "setup", "--dir", str(out), PATH=fake_tools(tmp_path / "bin", plugin=True))
    assert again.stdout.splitlines()[:4] == ["Found an existing setup:", "  image variant: standard",
                                             "  providers:     anthropic-default", "  MCP servers:   (none)"]
    # From another directory, the command goes there first.
    assert f"  cd {out} && docker compose up -d" in again.stdout.splitlines()

    apple = baectl(None, "setup", "--apple", "--dir", str(out))
    assert apple.returncode == 0
    assert apple.stderr.splitlines()[0] == ("baectl: found docker-compose.yml but this run uses bae-setup.sh "
                                            "(launcher/flag mismatch).")
    assert apple.stderr.splitlines()[-1] == "baectl: aborted; no files were changed."
    assert not (out / "bae-setup.sh").exists()


@pytest.mark.parametrize("plugin, v1, command", [
    (True, True, "docker compose up -d"),     # both: the plugin
    (False, True, "docker-compose up -d"),    # docker without the plugin, and docker-compose 1.x
    (True, False, "docker compose up -d"),
])
def test_setup_dev_writes_this_projects_images_and_names_the_compose_installed(
        tmp_path: Path, plugin: bool, v1: bool, command: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = baectl(None, "setup", "--dev", "--dir", str(out), cwd=out, ANTHROPIC_API_KEY="k",
                    PATH=fake_tools(tmp_path / "bin", plugin=plugin, v1=v1))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:2] == ["To launch the configuration:", f"  {command}"]
    text = (out / "docker-compose.yml").read_text()
    assert "baesrv" not in text + result.stdout + result.stderr and "docker exec bae" not in result.stdout
    assert "version:" not in text  # the Compose Specification, read by docker-compose 1.27+ and v2 alike
    services = compose_services(out)
    # As `make images` tags them (deploy/images.sh), with the version of this baectl.
    assert {name: service["image"] for name, service in services.items()} == {
        name: f"bae-{name}:0.1.0" for name in ("gateway", "session", "runner", "sandbox")}
    assert all(service["env_file"] == ".env" and service["init"] for service in services.values())
    assert services["gateway"]["environment"]["BAE_SESSION_GRPC_ADDR"] == "session:50051"
    assert services["session"]["environment"]["BAE_SANDBOX_GRPC_ADDRS"] == "sandbox:50053"
    assert "/var/run/docker.sock:/var/run/docker.sock" in services["sandbox"]["volumes"]
    assert services["gateway"]["depends_on"] == {"session": {"condition": "service_healthy"}}


def test_setup_without_any_compose_says_how_to_install_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = baectl(None, "setup", "--dev", "--dir", str(out), cwd=out, ANTHROPIC_API_KEY="k",
                    PATH=fake_tools(tmp_path / "bin"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:2] == [
        "To launch the configuration, install Docker Compose: the `docker compose` plugin (the "
        "docker-compose-plugin package, https://docs.docker.com/compose/install/) or docker-compose 1.27 or later "
        "(the docker-compose package), then run:", "  docker compose up -d"]


def test_setup_unresolved_secret_and_directory_errors(tmp_path: Path) -> None:
    result = baectl(None, "setup", "--dev", "--dir", str(tmp_path), ANTHROPIC_API_KEY=None)
    assert result.returncode == 0
    assert result.stderr.startswith("baectl: warning — no value was supplied for: ANTHROPIC_API_KEY\n        ")
    assert 'image: "bae-gateway:0.1.0"' in (tmp_path / "docker-compose.yml").read_text()
    assert "flags: --dev" in (tmp_path / ".env").read_text()
    (tmp_path / ".env").unlink()
    partial = baectl(None, "setup", "--dir", str(tmp_path))
    assert partial.stderr.startswith("baectl: incomplete setup — missing .env.\n        This looks like")
    assert fails(baectl(None, "setup", "--dir", str(tmp_path / "nope"))) == f"--dir {tmp_path / 'nope'} does not exist"
    assert fails(baectl(None, "setup", "--dir", str(tmp_path / "bae-config.toml"))) == (
        f"--dir {tmp_path / 'bae-config.toml'} is not a directory")
    (tmp_path / "bae-config.toml").write_text("[[providers.entries]]\nname = 1\n")
    (tmp_path / ".env").write_text("")
    assert fails(baectl(None, "setup", "--dir", str(tmp_path))).startswith(
        "existing bae-config.toml is not valid TOML (use a fresh directory or delete it): ")


def run_on_terminal(args: list[str], answers: str, env: dict[str, str]) -> tuple[int, str]:
    """baectl with a pseudo-terminal as stdin (so it asks), fed `answers`; returns (exit code, stdout+stderr)."""
    import pty

    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen([sys.executable, "-m", "bae.ctl", *args], cwd=ROOT, env=env, stdin=terminal,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        os.write(controller, answers.encode())
        output, _ = process.communicate(timeout=60)
        return process.returncode, output
    finally:
        os.close(controller)
        os.close(terminal)


def test_setup_interactive_max_with_mcp_servers(tmp_path: Path) -> None:
    answers = "\n".join([
        "n",                                        # published images (--apple: Apple's container CLI)
        "max",                                      # variant
        "openai", "", "", "", "pasted-openai-key",  # provider: kind, name, model, token var, its value
        "maybe", "n",                               # please answer y or n; no second provider
        "y", "github", "", "",                      # an MCP server: github, default name, GITHUB_TOKEN skipped
        "y", "custom", "notes", "sse", "http://notes:1/sse", "y", "X Key", "v\"1", "n",
        "n",                                        # no more MCP servers
        "127.0.0.1:9090", "debug", "030", "120", "podman",  # bad driver, asked again
        "docker", "70000", "3100", "",             # bad port, then 3100; blank MAX password
        "n",                                        # do not launch
    ]) + "\n"
    env = service_env(PATH=os.environ["PATH"])
    env.pop("OPENAI_API_KEY", None)
    env.pop("GITHUB_TOKEN", None)
    code, output = run_on_terminal(["setup", "--apple", "--dir", str(tmp_path)], answers, env)
    assert code == 0, output
    assert "  please answer y or n" in output
    assert '"podman" is not a supported sandbox driver (choose docker or apple-container)' in output
    assert '"70000" is not a valid port number' in output
    assert "baectl: warning — no value was supplied for: GITHUB_TOKEN" in output
    config = (tmp_path / "bae-config.toml").read_text()
    assert '[[mcp.servers]]\nname = "github"\ntransport = "http"\nurl = "https://api.githubcopilot.com/mcp/"\n' \
           'headers = { Authorization = "Bearer ${GITHUB_TOKEN}" }\n' in config
    # A header's value goes to .env (0600); the config (0644) refers to it.
    assert 'name = "notes"\ntransport = "sse"\nurl = "http://notes:1/sse"\nheaders = { "X Key" = "${MCP_NOTES_X_KEY}" }' \
           in config
    assert 'provider = "openai"\nmodel = "gpt-5.6-luna"\nauth_token = "${OPENAI_API_KEY}"' in config
    env_lines = (tmp_path / ".env").read_text().splitlines()[4:]
    # "030" normalises to the default 30, so it is not an override.
    assert env_lines == ["OPENAI_API_KEY=pasted-openai-key", 'MCP_NOTES_X_KEY=v"1', "BAE_ADDR=127.0.0.1:9090",
                         "BAE_LOG=debug"]
    script = (tmp_path / "bae-setup.sh").read_text()
    assert "ghcr.io/prettysmartdev/better-agent-engine:max" in script
    assert '--publish "${BAE_ADDR_PORT}:9090" --publish "3100:3000"' in script

    # Editing keeps the saved answers as defaults; launching needs the container CLI on PATH.
    edit = "\n".join(["n", "y"] + [""] * 40)
    code, output = run_on_terminal(["setup", "--apple", "--dir", str(tmp_path)], edit, {**env, "PATH": str(tmp_path)})
    assert (tmp_path / "bae-config.toml.bak").read_text() == config
    assert 'MCP_NOTES_X_KEY=v"1' in (tmp_path / ".env").read_text()  # kept: the edit took the saved value
    assert {stat.S_IMODE((tmp_path / f"{name}.bak").stat().st_mode)
            for name in ("bae-config.toml", ".env", "bae-setup.sh")} == {0o600}
    assert "  image variant: max" in output
    assert (tmp_path / "bae-config.toml").read_text().split("\n", 2)[2] == config.split("\n", 2)[2]
    assert code == 1 and ("container not found on PATH — install it (or generate here and deploy elsewhere) then "
                          "re-run `baectl setup` and choose Launch.") in output


def test_setup_keeps_secrets_out_of_readable_files_and_writes_through_no_link(tmp_path: Path) -> None:
    answers = "\n".join([
        "n", "n", "", "", "", "",                     # docker-compose, published; anthropic defaults
        "n",                                          # no second provider
        "y", "custom", "search", "http", "http://search:1/mcp", "y", "", "Bearer s3cret-header-value", "n",
        "n",                                          # no more MCP servers
        "", "", "", "", "",                           # settings
        "n",                                          # do not launch
    ]) + "\n"
    env = service_env(PATH=os.environ["PATH"], ANTHROPIC_API_KEY="sk-ant-from-env")
    code, output = run_on_terminal(["setup", "--dir", str(tmp_path)], answers, env)
    assert code == 0, output
    config = (tmp_path / "bae-config.toml").read_text()
    assert "s3cret" not in config and 'headers = { Authorization = "${MCP_SEARCH_AUTHORIZATION}" }' in config
    assert "MCP_SEARCH_AUTHORIZATION=Bearer s3cret-header-value" in (tmp_path / ".env").read_text().splitlines()
    assert stat.S_IMODE((tmp_path / ".env").stat().st_mode) == 0o600
    # The server reads the header from the environment the launcher gives it (.env).
    [server] = load_config(str(tmp_path / "bae-config.toml")).mcp_servers
    assert resolve_env(server.headers["Authorization"],
                       env={"MCP_SEARCH_AUTHORIZATION": "Bearer s3cret-header-value"}) == "Bearer s3cret-header-value"

    # A link planted where a backup goes is refused, not followed.
    exposed = tmp_path / "exposed"
    (tmp_path / ".env.bak").symlink_to(exposed)
    code, output = run_on_terminal(["setup", "--dir", str(tmp_path)], "n\nn\ny\n", env)
    assert code == 1
    assert "baectl: could not back up .env: it is a symbolic link; refusing to write through it" in output
    assert not exposed.exists()
    # And one where a generated file goes.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "bae-config.toml").symlink_to(exposed)
    assert fails(baectl(None, "setup", "--dir", str(fresh), ANTHROPIC_API_KEY="sk-ant-from-env")) == (
        f"could not write {fresh / 'bae-config.toml'}: it is a symbolic link; refusing to write through it")
    assert not exposed.exists() and not (fresh / ".env").exists()


def test_setup_launches_and_creates_the_default_profile_and_key(stack: StackClients, tmp_path: Path) -> None:
    """The launch step with a stand-in `docker` on PATH: `compose up` is a no-op (the test stack already
    runs on the chosen port), `compose exec … baectl` runs the real baectl against that stack."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    docker = bin_dir / "docker"
    docker.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'if [ "$2" = "exec" ]; then shift 5; '
        f'BAE_ADMIN_ADDR={stack.settings.admin_addr} BAE_ADMIN_TOKEN={stack.admin_key} '
        f'exec {sys.executable} -m bae.ctl "$@"; fi\n'
    )
    docker.chmod(0o755)
    port = stack.settings.addr.port
    answers = "\n".join(["n", "n", "", "mock", "", "", "n", "n", f"0.0.0.0:{port}", "", "", "", "", "y"]) + "\n"
    env = service_env(PATH=f"{bin_dir}:{os.environ['PATH']}", ANTHROPIC_API_KEY="sk-ant-x")
    code, output = run_on_terminal(["setup", "--dir", str(tmp_path)], answers, env)
    assert code == 0, output
    # The Compose found (`docker compose version` answers), then the stack, then baectl in the gateway.
    assert calls.read_text().splitlines()[:2] == ["compose version", "compose up -d"]
    assert "compose exec -T gateway baectl create profile default mock --json" in calls.read_text()
    profile_id = re.search(r"created profile 'default' \((pro_\w+)\)", output).group(1)
    key = re.search(r"created client key 'default':\r?\n  (bae_\w+)", output).group(1)
    assert f"export BAE_URL=http://localhost:{port}" in output and f"export BAE_API_KEY={key}" in output
    assert "copy the key now" in output
    assert stack.open_session(key)["profile"]["id"] == profile_id

    # Launching the saved setup again only restarts it.
    code, output = run_on_terminal(["setup", "--dir", str(tmp_path)], "n\nn\nn\ny\n", env)
    assert code == 0, output
    assert "Re-launched the saved configuration." in output
