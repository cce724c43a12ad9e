"""The wire, byte for byte: a scripted set of requests over every route and JSON-RPC method, their
refusals included (bad keys, bad bodies, bad params, each validation text), answered as recorded.

The recording (tests/fixtures/wire-recording.json) holds each answer's status, the headers a client
reads (content type, Allow, Retry-After) and its whole body, NDJSON frames included, with ids, keys
and timestamps replaced by stable names (`<ses_1>`, `<time>`) in order of first appearance. A change
to the recording is a change to the wire: `BAE_RECORD_WIRE=1` writes it anew, and its diff is what
changed.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator

import httpx
import pytest

from testkit import ROOT
from testkit.mockllm import MockLLM, Reply
from testkit.inprocess import launch_inprocess_stack
from testkit.stack import StackClients, mock_provider_toml

pytestmark = pytest.mark.inprocess

RECORDING = ROOT / "tests" / "fixtures" / "wire-recording.json"
HEADERS = ("content-type", "allow", "retry-after")
MAX_BODY = 256 * 1024

# Each kind of value that differs from run to run, and the name it is recorded under.
_VARIABLE = re.compile(
    r"(?P<session_key>bae_ses_[0-9a-f]{48})"
    r"|(?P<client_key>bae_[0-9a-f]{48})"
    r"|(?P<key_prefix>(?<=\"prefix\":\")bae_[0-9a-f]{4})"
    r"|(?P<webhook_secret>whsec_[0-9A-Za-z+/=]{32})"
    r"|(?P<id>\b(?:pro|key|ses|evt|tu|sub|sbx|msg|sch|run|trg|trn|wh)_[0-9A-Za-z]{8,})"
    r"|(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)"
    r"|(?P<mock>127\.0\.0\.1:\d+)"
)


class Normalizer:
    """Names each variable value by its kind and order of first appearance, the same for one run."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.counts: dict[str, int] = {}

    def __call__(self, text: str) -> str:
        return _VARIABLE.sub(self._name, text)

    def _name(self, match: re.Match) -> str:
        kind = match.lastgroup or "value"
        if kind in ("time", "duration"):
            return f"<{kind}>"
        value = match.group(0)
        if value not in self.names:
            prefix = value.split("_", 1)[0] if kind == "id" else kind
            self.counts[prefix] = self.counts.get(prefix, 0) + 1
            self.names[value] = f"<{prefix}_{self.counts[prefix]}>"
        return self.names[value]


class Script:
    """Sends requests to a stack and records each answer as the recording shows it."""

    def __init__(self, stack: StackClients) -> None:
        self.client = httpx.Client(base_url=stack.client_url, timeout=30)
        self.admin = httpx.Client(base_url=stack.admin_url, timeout=30)
        self.admin_auth = f"Bearer {stack.admin_key}"
        self.normalize = Normalizer()
        self.entries: list[dict[str, Any]] = []
        self._rpc_ids = iter(range(1, 1_000_000))
        # The first event of the session the client script drives: where a replay starts.
        self.first_event_id = ""

    def close(self) -> None:
        self.client.close()
        self.admin.close()

    def send(self, name: str, port: str, method: str, path: str, *, auth: str | None = None,
             body: Any = None, raw: bytes | None = None, content_type: str | None = "application/json",
             params: dict | None = None) -> httpx.Response:
        headers = {}
        if auth is not None:
            headers["Authorization"] = auth
        content = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        if content is not None and content_type is not None:
            headers["Content-Type"] = content_type
        client = self.client if port == "client" else self.admin
        response = client.request(method, path, content=content, headers=headers, params=params)
        self.entries.append({
            "name": name,
            "request": self.normalize(f"{method} {port} {response.request.url.raw_path.decode()}"),
            "status": response.status_code,
            "headers": {h: self.normalize(response.headers[h]) for h in HEADERS if h in response.headers},
            "body": self.normalize(response.text),
        })
        return response

    def admin_call(self, name: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("auth", self.admin_auth)
        return self.send(name, "admin", method, path, **kwargs)

    def rpc(self, name: str, session_id: str, key: str | None, method: str | None, params: Any = ...,
            *, notification: bool = False, raw: bytes | None = None) -> list[dict]:
        envelope: dict[str, Any] = {"jsonrpc": "2.0"}
        if not notification:
            envelope["id"] = next(self._rpc_ids)
        if method is not None:
            envelope["method"] = method
        if params is not ...:
            envelope["params"] = params
        response = self.send(name, "client", "POST", f"/api/v1/sessions/{session_id}/rpc",
                             auth=None if key is None else f"Bearer {key}", body=envelope, raw=raw)
        return [json.loads(line) for line in response.text.splitlines()] if response.status_code == 200 else []


BAD_KEYS = {
    "no Authorization header": None,
    "not a Bearer token": "Basic abc",
    "a bare scheme": "Bearer",
    "a lowercase scheme and an unknown key": "bearer nope",
    "an unknown key": "Bearer bae_" + "0" * 48,
}


def profile_body(**fields: Any) -> dict:
    return {"name": "p", "primary_provider": "mock", **fields}


def run_admin_script(s: Script) -> dict[str, Any]:
    """Every admin route: its answers and its refusals. Returns what the client script needs."""
    for label, auth in BAD_KEYS.items():
        s.admin_call(f"list profiles with {label}", "GET", "/admin/v1/profiles", auth=auth)
    s.admin_call("a bad admin key goes before a bad body", "POST", "/admin/v1/profiles", auth="Bearer nope",
                 raw=b"{", content_type="text/plain")

    # Profiles: the body's checks, in order.
    post = "/admin/v1/profiles"
    s.admin_call("profile body without a content type", "POST", post, raw=b"{}", content_type=None)
    s.admin_call("profile body as text/plain", "POST", post, raw=b"{}", content_type="text/plain")
    s.admin_call("profile body as application/vnd.x+json", "POST", post, body=profile_body(name="vnd"),
                 content_type="application/vnd.x+json; charset=utf-8")
    s.admin_call("profile body that is not JSON", "POST", post, raw=b"{nope")
    s.admin_call("profile body that is empty", "POST", post, raw=b"")
    s.admin_call("profile body with NaN", "POST", post, raw=b'{"name": NaN}')
    s.admin_call("profile body null", "POST", post, raw=b"null")
    for label, body in [
        ("an array", []), ("a number", 5), ("a string", "x"),
        ("without name", {"primary_provider": "mock"}),
        ("with a numeric name", {"name": 5, "primary_provider": "mock"}),
        ("with a null name", {"name": None, "primary_provider": "mock"}),
        ("with a numeric name and no primary", {"name": 5}),
        ("without primary", {"name": "x"}),
        ("with a boolean primary", {"name": "x", "primary_provider": True}),
        ("with a float primary", {"name": "x", "primary_provider": 1.5}),
        ("with an object primary", {"name": "x", "primary_provider": {}}),
        ("with a long string where a list goes", profile_body(fallback_providers="y" * 300)),
        ("with an empty name", profile_body(name="")),
        ("with a blank name", profile_body(name="  \t")),
        ("with an empty primary", profile_body(primary_provider="")),
        ("with an empty name and a numeric primary", {"name": "", "primary_provider": 5}),
        ("with an empty name and a bad list", profile_body(name="", fallback_providers=5)),
        ("with fallback_providers a number", profile_body(fallback_providers=5)),
        ("with fallback_providers holding a number", profile_body(fallback_providers=["a", 5])),
        ("with mcp_servers an object", profile_body(mcp_servers={})),
        ("with mcp_servers holding null", profile_body(mcp_servers=[None])),
        ("with allowed_tools a string", profile_body(allowed_tools="get_time")),
        ("with allowed_tools holding a list", profile_body(allowed_tools=[[]])),
        ("with available_sandboxes true", profile_body(available_sandboxes=True)),
        ("with available_sandboxes holding a number", profile_body(available_sandboxes=[1])),
        ("with bad available_sandboxes and allowed_tools", profile_body(available_sandboxes=5, allowed_tools=5)),
        ("with bad mcp_servers and available_sandboxes", profile_body(mcp_servers=5, available_sandboxes=5)),
    ]:
        s.admin_call(f"profile body {label}", "POST", post, body=body)

    main = s.admin_call("create a profile", "POST", post, body=profile_body(
        name="main", allowed_tools=["get_time", "clock", "remote_subagent_status"], mcp_servers=[],
        fallback_providers=None, available_sandboxes=[], unknown={"ignored": True})).json()
    s.admin_call("create a profile with null lists", "POST", post, body=profile_body(
        name="nulls", fallback_providers=None, mcp_servers=None, allowed_tools=None, available_sandboxes=None))
    other = s.admin_call("create a second profile", "POST", post, body=profile_body(name="other")).json()
    unconfigured = s.admin_call("create a profile whose primary is not configured", "POST", post,
                                body=profile_body(name="unconfigured", primary_provider="nope")).json()
    s.admin_call("create a profile with a taken name", "POST", post, body=profile_body(name="main"))
    s.admin_call("create a doomed profile", "POST", post, body=profile_body(name="doomed"))

    for query in [{}, {"limit": "1"}, {"limit": "2", "cursor": "1"}, {"limit": "0"}, {"limit": "-1"},
                  {"limit": "abc"}, {"limit": "1.5"}, {"limit": "+2"}, {"limit": "0003"}, {"limit": "9" * 40},
                  {"limit": ""}, {"cursor": "abc"}, {"cursor": "-1"}, {"cursor": "9" * 19}, {"cursor": "x" * 300},
                  {"cursor": ""}, {"cursor": "99"}, {"limit": "x", "cursor": "y"}]:
        s.admin_call(f"list profiles {query}", "GET", "/admin/v1/profiles", params=query)
    s.admin_call("list profiles with a bad limit and a bad key", "GET", "/admin/v1/profiles",
                 params={"limit": "x"}, auth="Bearer nope")

    pid = main["id"]
    s.admin_call("get a profile", "GET", f"/admin/v1/profiles/{pid}")
    s.admin_call("get an unknown profile", "GET", "/admin/v1/profiles/pro_nope")
    s.admin_call("get a profile with a bad key", "GET", f"/admin/v1/profiles/{pid}", auth="Bearer nope")
    s.admin_call("HEAD a profile", "HEAD", f"/admin/v1/profiles/{pid}")
    s.admin_call("replace a profile", "PUT", f"/admin/v1/profiles/{pid}", body=profile_body(
        name="main", allowed_tools=["get_time", "clock"], fallback_providers=["mock"]))
    s.admin_call("replace a profile with a bad body", "PUT", f"/admin/v1/profiles/{pid}", body={"name": 5})
    s.admin_call("replace an unknown profile", "PUT", "/admin/v1/profiles/pro_nope", body=profile_body(name="z"))
    s.admin_call("replace an unknown profile with a bad body", "PUT", "/admin/v1/profiles/pro_nope", body={})
    s.admin_call("replace a profile with a taken name", "PUT", f"/admin/v1/profiles/{other['id']}",
                 body=profile_body(name="main"))

    # Keys.
    for label, body in [
        ("empty", {}), ("without profile_id", {"name": "k"}), ("with a numeric name", {"name": 1, "profile_id": pid}),
        ("with an empty name", {"name": " ", "profile_id": pid}), ("with a null profile_id", {"name": "k", "profile_id": None}),
        ("with an empty name and a numeric profile_id", {"name": "", "profile_id": 5}),
        ("with an unknown profile", {"name": "k", "profile_id": "pro_nope"}),
        ("that is a list", [1]),
    ]:
        s.admin_call(f"key body {label}", "POST", "/admin/v1/keys", body=body)
    s.admin_call("key body as text", "POST", "/admin/v1/keys", raw=b"name=k", content_type="text/plain")
    key = s.admin_call("create a key", "POST", "/admin/v1/keys", body={"name": "laptop", "profile_id": pid}).json()
    second = s.admin_call("create a second key", "POST", "/admin/v1/keys", body={"name": "b", "profile_id": pid}).json()
    other_key = s.admin_call("create a key on the second profile", "POST", "/admin/v1/keys",
                             body={"name": "o", "profile_id": other["id"]}).json()
    unconfigured_key = s.admin_call("create a key on the unconfigured profile", "POST", "/admin/v1/keys",
                                    body={"name": "u", "profile_id": unconfigured["id"]}).json()
    doomed_key = s.admin_call("create a key to revoke", "POST", "/admin/v1/keys",
                              body={"name": "d", "profile_id": pid}).json()
    s.admin_call("list keys", "GET", "/admin/v1/keys")
    s.admin_call("list keys, one a page", "GET", "/admin/v1/keys", params={"limit": "1"})
    s.admin_call("list keys with a bad cursor", "GET", "/admin/v1/keys", params={"cursor": "z"})
    s.admin_call("revoke an unknown key", "DELETE", "/admin/v1/keys/key_nope")
    s.admin_call("revoke a key", "DELETE", f"/admin/v1/keys/{doomed_key['id']}")
    s.admin_call("revoke it again", "DELETE", f"/admin/v1/keys/{doomed_key['id']}")
    s.admin_call("delete a profile in use", "DELETE", f"/admin/v1/profiles/{pid}")
    s.admin_call("delete an unknown profile", "DELETE", "/admin/v1/profiles/pro_nope")
    doomed = next(p for p in s.admin.get("/admin/v1/profiles", headers={"Authorization": s.admin_auth},
                                         params={"limit": "200"}).json()["items"] if p["name"] == "doomed")
    s.admin_call("delete a profile", "DELETE", f"/admin/v1/profiles/{doomed['id']}")
    s.admin_call("delete it again", "DELETE", f"/admin/v1/profiles/{doomed['id']}")

    # Registries and config.
    for path in ("/admin/v1/mcp-servers", "/admin/v1/providers", "/admin/v1/config", "/admin/v1/sandbox-status"):
        s.admin_call(f"GET {path}", "GET", path)
        s.admin_call(f"GET {path} with a bad key", "GET", path, auth="Bearer nope")

    # What the gateway answers itself.
    s.admin_call("an unknown admin route", "GET", "/admin/v1/nope")
    s.admin_call("a client route on the admin port", "GET", "/api/v1/meta")
    s.admin_call("a trailing slash", "GET", "/admin/v1/profiles/")
    s.admin_call("PATCH a profile", "PATCH", f"/admin/v1/profiles/{pid}")
    s.admin_call("POST the sessions list", "POST", "/admin/v1/sessions", body={})
    s.admin_call("admin readyz", "GET", "/readyz")
    return {"profile": main, "key": key, "second": second, "other_key": other_key,
            "unconfigured_key": unconfigured_key, "revoked_key": doomed_key}


def tool(name: str, **fields: Any) -> dict:
    return {"name": name, "description": f"the {name} tool", "input_schema": {"type": "object"}, **fields}


def subagent_tool(**fields: Any) -> dict:
    return {"name": "helper", "image": "img:1", "subagents": [
        {"harness": "claude", "command_template": "run {model}", "prompt_via": "stdin", "timeout_secs": 60}],
        **fields}


def run_client_script(s: Script, admin: dict[str, Any]) -> None:
    key, second = f"Bearer {admin['key']['key']}", f"Bearer {admin['second']['key']}"
    s.send("healthz", "client", "GET", "/healthz")
    s.send("meta", "client", "GET", "/api/v1/meta")
    s.send("client readyz", "client", "GET", "/readyz")
    s.send("an unknown client route", "client", "GET", "/api/v1/nope")
    s.send("an admin route on the client port", "client", "GET", "/admin/v1/profiles")
    s.send("GET the sessions collection", "client", "GET", "/api/v1/sessions")
    s.send("PUT a session", "client", "PUT", "/api/v1/sessions/ses_x", body={})

    opens = "/api/v1/sessions"
    for label, auth in BAD_KEYS.items():
        s.send(f"open a session with {label}", "client", "POST", opens, auth=auth, body={})
    s.send("open a session with a revoked key", "client", "POST", opens, auth=f"Bearer {admin['revoked_key']['key']}",
           body={})
    s.send("open a session with the admin key", "client", "POST", opens, auth=s.admin_auth, body={})
    s.send("a bad key goes before a bad body", "client", "POST", opens, auth="Bearer nope", raw=b"[",
           content_type=None)
    s.send("open body without a content type", "client", "POST", opens, auth=key, raw=b"{}", content_type=None)
    s.send("open body as form data", "client", "POST", opens, auth=key, raw=b"a=1",
           content_type="application/x-www-form-urlencoded")
    s.send("open body that is not JSON", "client", "POST", opens, auth=key, raw=b'{"tools": [}')
    s.send("open body with invalid UTF-8", "client", "POST", opens, auth=key, raw=b'{"client_version": "\xff"}')
    s.send("open body with a number too large", "client", "POST", opens, auth=key, raw=b'{"x": 1e999}')
    s.send("open without a body", "client", "POST", opens, auth=key, content_type=None)
    s.send("open body null", "client", "POST", opens, auth=key, raw=b"null")
    s.send("open body over the size limit", "client", "POST", opens, auth=key, raw=b" " * (MAX_BODY + 1))
    s.send("open body over the size limit with a bad key", "client", "POST", opens, auth="Bearer nope",
           raw=b" " * (MAX_BODY + 1))
    s.send("a large body with a bad key", "client", "POST", opens, auth="Bearer nope", raw=b" " * 100_000 + b"{}")
    s.send("a large body", "client", "POST", opens, auth=key, raw=b'{"client_version":"large"}' + b" " * 100_000)
    for label, body in [
        ("an array", []), ("a string", "s"), ("true", True),
        ("client_version a number", {"client_version": 5}),
        ("client_version an object", {"client_version": {}}),
        ("tools a number", {"tools": 5}),
        ("tools a long string", {"tools": "t" * 300}),
        ("tools holding a number", {"tools": [5]}),
        ("a tool without name", {"tools": [{"description": "d"}]}),
        ("a tool with a numeric name", {"tools": [{"name": 5}]}),
        ("a tool with a null name", {"tools": [{"name": None}]}),
        ("a tool with a numeric description", {"tools": [{"name": "get_time", "description": 5}]}),
        ("a tool with a numeric name and description", {"tools": [{"name": 5, "description": 5}]}),
        ("a second tool that is bad", {"tools": [tool("get_time"), {"name": []}]}),
        ("sandbox_tools an object", {"sandbox_tools": {}}),
        ("a sandbox tool with a numeric name", {"sandbox_tools": [{"name": 1}]}),
        ("subagent_tools a string", {"subagent_tools": "x"}),
        ("a subagent tool that is a string", {"subagent_tools": ["x"]}),
        ("a subagent tool without name", {"subagent_tools": [{"image": "i"}]}),
        ("a subagent tool with a numeric image", {"subagent_tools": [subagent_tool(image=5)]}),
        ("subagents a number", {"subagent_tools": [subagent_tool(subagents=5)]}),
        ("a subagent entry that is a number", {"subagent_tools": [subagent_tool(subagents=[5])]}),
        ("a subagent timeout that is a string", {"subagent_tools": [subagent_tool(subagents=[{"timeout_secs": "1"}])]}),
        ("a subagent timeout that is true", {"subagent_tools": [subagent_tool(subagents=[{"timeout_secs": True}])]}),
        ("a subagent timeout that is a float", {"subagent_tools": [subagent_tool(subagents=[{"timeout_secs": 1.5}])]}),
        ("a subagent harness that is a number", {"subagent_tools": [subagent_tool(subagents=[{"harness": 1}])]}),
        ("a subagent harness and timeout both bad",
         {"subagent_tools": [subagent_tool(subagents=[{"harness": 1, "timeout_secs": "x"}])]}),
        ("a subagent prompt_via that is a number", {"subagent_tools": [subagent_tool(subagents=[{"prompt_via": 1}])]}),
        ("a subagent command_template that is a list",
         {"subagent_tools": [subagent_tool(subagents=[{"command_template": []}])]}),
        ("compaction a number", {"compaction": 5}),
        ("compaction a string", {"compaction": "auto"}),
        ("compaction without mode", {"compaction": {}}),
        ("compaction mode a number", {"compaction": {"mode": 1}}),
        ("compaction mode null", {"compaction": {"mode": None}}),
        ("compaction mode unknown", {"compaction": {"mode": "sometimes"}}),
        ("compaction mode long and unknown", {"compaction": {"mode": "m" * 300}}),
        ("auto compaction without size", {"compaction": {"mode": "auto"}}),
        ("auto compaction with a string size", {"compaction": {"mode": "auto", "size": "5000"}}),
        ("auto compaction with a null size", {"compaction": {"mode": "auto", "size": None}}),
        ("auto compaction with a float size", {"compaction": {"mode": "auto", "size": 5000.0}}),
        ("auto compaction with a boolean size", {"compaction": {"mode": "auto", "size": True}}),
        ("auto compaction with a negative size", {"compaction": {"mode": "auto", "size": -1}}),
        ("auto compaction with a size over u64", {"compaction": {"mode": "auto", "size": 2**64}}),
        ("auto compaction with a small size", {"compaction": {"mode": "auto", "size": 999}}),
        ("auto compaction with a zero size", {"compaction": {"mode": "auto", "size": 0}}),
        ("client compaction with a numeric prompt", {"compaction": {"mode": "client", "prompt": 1}}),
        ("a bad tool and a bad compaction", {"tools": 5, "compaction": 5}),
        ("a small size and a bad tool", {"tools": [{"name": 1}], "compaction": {"mode": "auto", "size": 1}}),
        ("a tool outside the allowlist", {"tools": [tool("shell")]}),
        ("the reserved tool name", {"tools": [tool("remote_subagent_status")]}),
        ("the reserved sandbox tool name", {"sandbox_tools": [tool("remote_subagent_status")]}),
        ("a subagent tool with an empty name", {"subagent_tools": [subagent_tool(name=" ")]}),
        ("a subagent tool with the reserved name", {"subagent_tools": [subagent_tool(name="remote_subagent_status")]}),
        ("a subagent tool without image", {"subagent_tools": [subagent_tool(image=None)]}),
        ("a subagent tool without subagents", {"subagent_tools": [subagent_tool(subagents=[])]}),
        ("a subagent with a duplicate harness", {"subagent_tools": [subagent_tool(subagents=[
            {"harness": "a", "command_template": "x"}, {"harness": "a", "command_template": "x"}])]}),
        ("a subagent with a bad prompt_via", {"subagent_tools": [subagent_tool(subagents=[
            {"harness": "a", "command_template": "x", "prompt_via": "pipe"}])]}),
        ("a subagent with a bad template", {"subagent_tools": [subagent_tool(subagents=[
            {"harness": "a", "command_template": "run {nope}"}])]}),
        ("a subagent with a prompt placeholder on stdin", {"subagent_tools": [subagent_tool(subagents=[
            {"harness": "a", "command_template": "run {prompt}"}])]}),
        ("a subagent with a zero timeout", {"subagent_tools": [subagent_tool(subagents=[
            {"harness": "a", "command_template": "x", "timeout_secs": 0}])]}),
    ]:
        s.send(f"open body {label}", "client", "POST", opens, auth=key, body=body)
    s.send("open a session on a profile whose primary is not configured", "client", "POST", opens,
           auth=f"Bearer {admin['unconfigured_key']['key']}", body={})

    opened = s.send("open a session", "client", "POST", opens, auth=key, body={
        "client_version": "1.2.3", "tools": [tool("get_time")], "sandbox_tools": [tool("clock", description=None)],
        "subagent_tools": [subagent_tool()], "compaction": {"mode": "auto", "size": 5000, "prompt": "ignored"},
        "unknown": [1, 2]}).json()
    sid, skey = opened["session_id"], opened["session_key"]
    s.send("open a session with client compaction", "client", "POST", opens, auth=key,
           body={"compaction": {"mode": "client", "prompt": "Summarize.", "size": "ignored"}})
    s.send("open a session with null fields", "client", "POST", opens, auth=key,
           body={"client_version": None, "tools": None, "sandbox_tools": None, "subagent_tools": None,
                 "compaction": None})
    s.send("open a session with a tool without schema", "client", "POST", opens, auth=key,
           body={"tools": [{"name": "get_time", "input_schema": None}, {"name": "clock", "input_schema": "x"}]})
    s.send("open a session with application/json; charset", "client", "POST", opens, auth=key,
           body={}, content_type="application/json; charset=utf-8")

    # Join.
    join = f"/api/v1/sessions/{sid}/join"
    s.send("join with a bad key", "client", "POST", join, auth="Bearer nope", body={})
    s.send("join with a session key", "client", "POST", join, auth=f"Bearer {skey}", body={})
    s.send("join with compaction", "client", "POST", join, auth=second, body={"compaction": {"mode": "client"}})
    s.send("join with null compaction", "client", "POST", join, auth=second, body={"compaction": None})
    s.send("join with compaction and a bad tool", "client", "POST", join, auth=second,
           body={"tools": 5, "compaction": None})
    s.send("join with a bad tool", "client", "POST", join, auth=second, body={"tools": [{"name": 5}]})
    s.send("join as a list", "client", "POST", join, auth=second, body=[])
    s.send("join without a content type", "client", "POST", join, auth=second, raw=b"{}", content_type=None)
    s.send("join an unknown session", "client", "POST", "/api/v1/sessions/ses_nope/join", auth=second, body={})
    s.send("join with another profile's key", "client", "POST", join, auth=f"Bearer {admin['other_key']['key']}",
           body={})
    s.send("join with a tool outside the allowlist", "client", "POST", join, auth=second, body={"tools": [tool("x")]})
    joined = s.send("join", "client", "POST", join, auth=second, body={"client_version": "2", "tools": [tool("clock")]})
    second_skey = joined.json()["session_key"]

    # Participants and events.
    for label, auth in BAD_KEYS.items():
        s.send(f"participants with {label}", "client", "GET", f"/api/v1/sessions/{sid}/participants", auth=auth)
    auth = f"Bearer {skey}"
    s.send("participants", "client", "GET", f"/api/v1/sessions/{sid}/participants", auth=auth)
    s.send("participants of another session", "client", "GET", "/api/v1/sessions/ses_nope/participants", auth=auth)
    events = f"/api/v1/sessions/{sid}/events"
    s.send("events", "client", "GET", events, auth=auth)
    s.send("events with a client key", "client", "GET", events, auth=key)
    for query in [{"limit": "1"}, {"limit": "1", "cursor": "1"}, {"limit": "0"}, {"limit": "x"}, {"cursor": "x"},
                  {"cursor": "1" * 19}, {"limit": "201"}]:
        s.send(f"events {query}", "client", "GET", events, auth=auth, params=query)
    s.send("events with a bad limit and a bad key", "client", "GET", events, auth="Bearer nope", params={"limit": "x"})
    s.send("events with a bad cursor and no key", "client", "GET", events, params={"cursor": "x"})

    run_rpc_script(s, sid, skey, second_skey)

    # Close.
    s.send("close with a bad key", "client", "DELETE", f"/api/v1/sessions/{sid}", auth="Bearer nope")
    s.send("close", "client", "DELETE", f"/api/v1/sessions/{sid}", auth=auth)
    s.send("close again", "client", "DELETE", f"/api/v1/sessions/{sid}", auth=auth)
    s.send("participants of a closed session", "client", "GET", f"/api/v1/sessions/{sid}/participants", auth=auth)
    s.send("join a closed session", "client", "POST", join, auth=second, body={})
    s.rpc("registerDriver on a closed session", sid, skey, "session.registerDriver")
    s.rpc("updateClientTools on a closed session", sid, second_skey, "session.updateClientTools", {"tools": []})
    s.rpc("subscribe to a closed session replays and ends", sid, skey, "session.subscribe",
          {"since_event_id": s.first_event_id})
    s.rpc("subscribe to a closed session without since_event_id", sid, skey, "session.subscribe")
    s.rpc("subscribe with params that are a list", sid, skey, "session.subscribe", [1])
    s.rpc("subscribe with a numeric since_event_id", sid, skey, "session.subscribe", {"since_event_id": 5})
    s.rpc("subscribe with an unknown since_event_id", sid, skey, "session.subscribe", {"since_event_id": "evt_x"})
    s.send("events of the closed session", "client", "GET", events, auth=auth)

    # Admin views of what the client side did.
    for query in [{}, {"state": "open"}, {"state": "closed"}, {"state": "error"}, {"state": ""},
                  {"state": "bogus"}, {"state": "bogus", "limit": "x"}, {"limit": "2"}, {"limit": "2", "cursor": "2"},
                  {"created_after": "2026-01-01", "created_before": "2026-01-01T00:00:00Z"},
                  {"created_after": "2026-02-01T00:00:00Z", "created_before": "2026-01-01T00:00:00Z"},
                  {"id_prefix": "ses_*"}, {"profile_id": "p" * 65}, {"state": "closed", "id_prefix": "ses_"}]:
        s.admin_call(f"list sessions {query}", "GET", "/admin/v1/sessions", params=query)
    s.admin_call("a session's events", "GET", f"/admin/v1/sessions/{sid}/events", params={"limit": "3"})
    s.admin_call("a session's events, page 2", "GET", f"/admin/v1/sessions/{sid}/events",
                 params={"limit": "3", "cursor": "3"})
    s.admin_call("an unknown session's events", "GET", "/admin/v1/sessions/ses_nope/events")
    s.admin_call("an unknown session's events with a bad limit", "GET", "/admin/v1/sessions/ses_nope/events",
                 params={"limit": "x"})
    s.admin_call("list keys after use", "GET", "/admin/v1/keys")
    s.admin_call("a session's summary", "GET", f"/admin/v1/sessions/{sid}")
    s.admin_call("an unknown session's summary", "GET", "/admin/v1/sessions/ses_nope")
    s.admin_call("a session's summary with a bad key", "GET", f"/admin/v1/sessions/{sid}", auth="Bearer nope")


def run_rpc_script(s: Script, sid: str, skey: str, second_skey: str) -> None:
    # Authentication and the envelope (SERVER-SPEC §6.2).
    for label, auth in BAD_KEYS.items():
        s.send(f"rpc with {label}", "client", "POST", f"/api/v1/sessions/{sid}/rpc", auth=auth,
               body={"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver"})
    s.rpc("rpc with a bad key and a bad envelope", sid, "nope", None, raw=b"{")
    s.rpc("rpc on another session", "ses_nope", skey, "session.registerDriver")
    for label, raw in [("not JSON", b"{"), ("empty", b""), ("NaN", b'{"jsonrpc":"2.0","id":1,"x":NaN}'),
                       ("a batch", b'[{"jsonrpc":"2.0","id":1,"method":"session.subscribe"}]'), ("42", b"42"),
                       ("without jsonrpc", b'{"id":7,"method":"session.registerDriver"}'),
                       ("jsonrpc 1.0", b'{"jsonrpc":"1.0","id":"a","method":"session.registerDriver"}'),
                       ("jsonrpc 1.0 notification", b'{"jsonrpc":"1.0","method":"session.registerDriver"}'),
                       ("without method", b'{"jsonrpc":"2.0","id":null}'),
                       ("a numeric method", b'{"jsonrpc":"2.0","id":[1,{"a":2}],"method":5}'),
                       ("an unknown method", b'{"jsonrpc":"2.0","id":3,"method":"session.nope"}'),
                       ("an unknown method notification", b'{"jsonrpc":"2.0","method":"session.nope"}'),
                       ("text content type", None)]:
        if raw is None:
            s.send("rpc with a text content type", "client", "POST", f"/api/v1/sessions/{sid}/rpc",
                   auth=f"Bearer {skey}", raw=b'{"jsonrpc":"2.0","id":"t","method":"session.unsubscribe"}',
                   content_type="text/plain")
            continue
        s.rpc(f"envelope {label}", sid, skey, None, raw=raw)

    # The driver gate comes first (-32001), for every method that has it.
    for method, params in [("session.sendMessage", {}), ("session.compact", 5), ("session.updateClientTools", 5),
                           ("session.startRemoteSandbox", {}), ("session.stopRemoteSandbox", {}),
                           ("session.execRemoteSandbox", {}), ("session.reportLocalSandbox", {}),
                           ("session.reportLocalSubagent", {}), ("session.cancelSubagent", {})]:
        s.rpc(f"{method} before registerDriver", sid, skey, method, params)

    s.rpc("registerDriver with params that are a number", sid, skey, "session.registerDriver", 5)
    s.rpc("registerDriver again", sid, skey, "session.registerDriver")
    s.send("participants after registering", "client", "GET", f"/api/v1/sessions/{sid}/participants",
           auth=f"Bearer {skey}")
    s.rpc("registerDriver as a notification", sid, second_skey, "session.registerDriver", notification=True)
    s.rpc("registerDriver with a null id", sid, second_skey, "session.registerDriver", raw=b'{"jsonrpc":"2.0",'
          b'"id":null,"method":"session.registerDriver"}')
    s.rpc("registerDriver with an object id", sid, second_skey, "session.registerDriver",
          raw=b'{"jsonrpc":"2.0","id":{"b":[1.50,"x"]},"method":"session.registerDriver","params":null}')

    # updateClientTools.
    for label, params in [("params a list", [1]), ("params a string", "x"), ("params null", None),
                          ("without tools", {}), ("tools null", {"tools": None}), ("tools a number", {"tools": 5}),
                          ("tools an object", {"tools": {}}), ("a tool that is a number", {"tools": [5]}),
                          ("a tool without name", {"tools": [{}]}), ("a tool with an empty name", {"tools": [{"name": " "}]}),
                          ("a tool with a numeric name", {"tools": [{"name": 5}]}),
                          ("a tool with a numeric description", {"tools": [{"name": "get_time", "description": 5}]}),
                          ("a tool outside the allowlist", {"tools": [{"name": "shell"}]}),
                          ("the reserved name", {"tools": [{"name": "remote_subagent_status"}]}),
                          ("two tools", {"tools": [tool("get_time"), {"name": "clock", "input_schema": None}]}),
                          ("no tools", {"tools": []})]:
        s.rpc(f"updateClientTools with {label}", sid, skey, "session.updateClientTools", params)

    # sendMessage: params, then a turn.
    for label, params in [("params a list", [1]), ("params null", None), ("params absent", ...),
                          ("without message", {}), ("message null", {"message": None}), ("message a string", {"message": "hi"}),
                          ("message without content", {"message": {}}), ("content null", {"message": {"content": None}}),
                          ("content a number", {"message": {"content": 5}}),
                          ("content an object", {"message": {"content": {"text": "x"}}}),
                          ("role a number", {"message": {"content": "hi", "role": 5}}),
                          ("role a number without content", {"message": {"role": 5}}),
                          ("content and role both bad", {"message": {"content": 5, "role": 5}})]:
        s.rpc(f"sendMessage with {label}", sid, skey, "session.sendMessage", params)
    frames = s.rpc("a text turn", sid, skey, "session.sendMessage", {"message": {"role": "user", "content": "Hello"}})
    s.first_event_id = frames[-1]["result"]["events"][0]["id"]
    s.rpc("a turn with content blocks and a null role", sid, skey, "session.sendMessage",
          {"message": {"role": None, "content": [{"type": "text", "text": "Blocks, \u00e9 \u2603"}],
                       "extra": 1.50}})
    s.rpc("a turn as a notification", sid, skey, "session.sendMessage", {"message": {"content": "quiet"}},
          notification=True)

    # compact.
    for label, params in [("a numeric prompt", {"prompt": 5}), ("params a list", [])]:
        s.rpc(f"compact with {label}", sid, skey, "session.compact", params)
    s.rpc("compact", sid, skey, "session.compact", {"prompt": None})

    # Sandbox methods (no container is started: each answer comes before any would be).
    for label, params in [("without image", {}), ("an empty image", {"image": " "}), ("a numeric image", {"image": 5}),
                          ("params a list", [1]), ("an image not in the profile", {"image": "python:3.12"})]:
        s.rpc(f"startRemoteSandbox with {label}", sid, skey, "session.startRemoteSandbox", params)
    s.rpc("stopRemoteSandbox without a sandbox", sid, skey, "session.stopRemoteSandbox", [1])
    for label, params in [("without command", {}), ("a numeric command", {"command": 5}),
                          ("an empty command", {"command": ""}), ("params a string", "ls")]:
        s.rpc(f"execRemoteSandbox with {label}", sid, skey, "session.execRemoteSandbox", params)
    for label, params in [
        ("params a list", [1]), ("without state", {}), ("an unknown state", {"state": "paused"}),
        ("a numeric state", {"state": 1}), ("unsandboxed a string", {"state": "running", "unsandboxed": "yes"}),
        ("unsandboxed null", {"state": "running", "unsandboxed": None, "image": "x"}),
        ("a numeric image", {"state": "running", "image": 5}),
        ("an image while unsandboxed", {"state": "running", "unsandboxed": True, "image": "x"}),
        ("no image", {"state": "running"}),
        ("an unknown state and a bad unsandboxed", {"state": "x", "unsandboxed": "x"}),
        ("running", {"state": "running", "image": "python:3.12", "container_id": "c1", "detail": "up"}),
        ("unsandboxed", {"state": "stopped", "unsandboxed": True}),
        ("an error", {"state": "error", "image": "python:3.12", "detail": None, "container_id": None}),
    ]:
        s.rpc(f"reportLocalSandbox with {label}", sid, skey, "session.reportLocalSandbox", params)

    ident = {"subagent_id": "sa1", "harness": "claude", "model": "m"}
    for label, params in [
        ("params a list", [1]), ("without state", {}), ("an unknown state", {"state": "done", **ident}),
        ("without subagent_id", {"state": "start", "harness": "h", "model": "m"}),
        ("an empty harness", {**ident, "state": "start", "harness": " "}),
        ("a numeric model", {**ident, "state": "start", "model": 5}),
        ("a numeric detail", {**ident, "state": "start", "detail": 5}),
        ("a numeric reason", {**ident, "state": "failed", "reason": 5}),
        ("a string exit_code", {**ident, "state": "completed", "exit_code": "0"}),
        ("a boolean exit_code", {**ident, "state": "completed", "exit_code": True}),
        ("a float exit_code", {**ident, "state": "completed", "exit_code": 0.5}),
        ("an unknown state and a bad detail", {**ident, "state": "x", "detail": 5}),
        ("start", {**ident, "state": "start", "detail": "go"}),
        ("running", {**ident, "state": "running"}),
        ("completed", {**ident, "state": "completed", "exit_code": 0, "reason": "ignored"}),
        ("failed", {**ident, "state": "failed", "reason": "crashed", "exit_code": 2}),
        ("cancelled", {**ident, "state": "cancelled", "reason": "user", "exit_code": 9}),
    ]:
        s.rpc(f"reportLocalSubagent with {label}", sid, skey, "session.reportLocalSubagent", params)
    for label, params in [("without subagent_id", {}), ("an empty subagent_id", {"subagent_id": ""}),
                          ("a numeric subagent_id", {"subagent_id": 1}), ("params null", None),
                          ("an unknown subagent", {"subagent_id": "sa1"})]:
        s.rpc(f"cancelSubagent with {label}", sid, skey, "session.cancelSubagent", params)

    s.rpc("unsubscribe with params that are a number", sid, skey, "session.unsubscribe", 5)
    s.rpc("unsubscribe as a notification", sid, skey, "session.unsubscribe", notification=True)


def run_automation_script(s: Script, admin: dict[str, Any]) -> None:
    """Schedules, HTTP triggers and webhooks: their admin routes, the trigger call, and their refusals."""
    other, other_key = admin["other_key"]["profile_id"], admin["other_key"]["id"]
    main = admin["profile"]["id"]
    schedule = {"name": "nightly", "profile_id": other, "client_key_id": other_key, "cron": "0 0 29 2 *",
                "timezone": "Europe/Paris", "message": "Triage the night's failures."}
    post = "/admin/v1/schedules"
    for label, body in [
        ("not an object", []), ("without cron", {k: v for k, v in schedule.items() if k != "cron"}),
        ("with a six-field cron", {**schedule, "cron": "* * * * * *"}),
        ("with an unknown time zone", {**schedule, "timezone": "Mars/Olympus"}),
        ("with an unknown overlap", {**schedule, "overlap": "sometimes"}),
        ("with an unknown catch_up", {**schedule, "catch_up": "all"}),
        ("with close_after a string", {**schedule, "close_after": "yes"}),
        ("on a profile with client tools", {**schedule, "profile_id": main, "client_key_id": admin["key"]["id"]}),
        ("with a key of another profile", {**schedule, "client_key_id": admin["key"]["id"]}),
        ("on an unknown profile", {**schedule, "profile_id": "pro_nope"}),
    ]:
        s.admin_call(f"create a schedule {label}", "POST", post, body=body)
    created = s.admin_call("create a schedule", "POST", post, body=schedule).json()
    sch = f"{post}/{created['id']}"
    s.admin_call("list schedules", "GET", post)
    s.admin_call("get a schedule", "GET", sch)
    s.admin_call("get an unknown schedule", "GET", f"{post}/sch_nope")
    s.admin_call("replace a schedule", "PUT", sch, body={**schedule, "overlap": "queue", "catch_up": "none",
                                                            "close_after": False, "enabled": False})
    s.admin_call("list a schedule's runs", "GET", f"{sch}/runs")
    s.admin_call("list an unknown schedule's runs", "GET", f"{post}/sch_nope/runs")
    s.admin_call("list schedules with a bad key", "GET", post, auth="Bearer nope")
    s.admin_call("delete a schedule", "DELETE", sch)
    s.admin_call("delete it again", "DELETE", sch)

    trigger = {"name": "ci-failure", "profile_id": other, "message_template": "Build {build} failed on {branch}.",
               "input_schema": {"type": "object", "required": ["build", "branch"],
                                "properties": {"build": {"type": "integer"}, "branch": {"type": "string"}}}}
    post = "/admin/v1/triggers"
    for label, body in [
        ("with a schema that is not a schema", {**trigger, "input_schema": {"type": 5}}),
        ("with a template that reads an attribute", {**trigger, "message_template": "{build.__class__}"}),
        ("with an unclosed placeholder", {**trigger, "message_template": "Build {build"}),
        ("with a name that is not a path segment", {**trigger, "name": "a/b"}),
    ]:
        s.admin_call(f"create a trigger {label}", "POST", post, body=body)
    created = s.admin_call("create a trigger", "POST", post, body=trigger).json()
    trg = f"{post}/{created['id']}"
    s.admin_call("create a trigger with a taken name", "POST", post, body=trigger)
    s.admin_call("list triggers", "GET", post)
    s.admin_call("get a trigger", "GET", trg)
    s.admin_call("replace a trigger", "PUT", trg, body={**trigger, "close_after": False})
    s.admin_call("list a trigger's runs", "GET", f"{trg}/runs")
    call = "/api/v1/triggers/ci-failure"
    other_auth = f"Bearer {admin['other_key']['key']}"
    s.send("call a trigger without a key", "client", "POST", call, body={"build": 1, "branch": "main"})
    s.send("call a trigger with a key of another profile", "client", "POST", call,
           auth=f"Bearer {admin['key']['key']}", body={"build": 1, "branch": "main"})
    s.send("call an unknown trigger", "client", "POST", "/api/v1/triggers/nope", auth=other_auth, body={})
    s.send("call a trigger with input its schema refuses", "client", "POST", call, auth=other_auth,
           body={"build": "seven", "branch": "main"})
    s.send("call a trigger with a body that is not JSON", "client", "POST", call, auth=other_auth, raw=b"{")
    s.send("call a trigger with a bad wait", "client", "POST", call, auth=other_auth, params={"wait": "maybe"},
           body={"build": 1, "branch": "main"})
    s.send("call a trigger", "client", "POST", call, auth=other_auth, body={"build": 7, "branch": "main"})

    post = "/admin/v1/webhooks"
    hook = {"url": "https://93.184.215.14/hooks/bae", "event_types": ["session.close"], "profile_id": other}
    for label, body in [
        ("on a loopback address", {**hook, "url": "http://127.0.0.1:9/hook"}),
        ("on a private address", {**hook, "url": "http://10.1.2.3/hook"}),
        ("on the metadata address", {**hook, "url": "http://169.254.169.254/latest"}),
        ("with a URL that is not http", {**hook, "url": "ftp://93.184.215.14/x"}),
        ("with no event types", {**hook, "event_types": []}),
        ("with an unknown event type", {**hook, "event_types": ["session.nope"]}),
        ("on an unknown profile", {**hook, "profile_id": "pro_nope"}),
    ]:
        s.admin_call(f"create a webhook {label}", "POST", post, body=body)
    created = s.admin_call("create a webhook", "POST", post, body=hook).json()
    wh = f"{post}/{created['id']}"
    s.admin_call("list webhooks", "GET", post)
    s.admin_call("get a webhook", "GET", wh)
    s.admin_call("replace a webhook", "PUT", wh, body={**hook, "event_types": ["*"], "enabled": False})
    s.admin_call("rotate a webhook's secret", "POST", f"{wh}/rotate-secret")
    s.admin_call("list a webhook's deliveries", "GET", f"{wh}/deliveries")
    s.admin_call("retry an unknown delivery", "POST", f"{wh}/deliveries/msg_nope/retry")
    s.admin_call("delete a webhook", "DELETE", wh)
    s.admin_call("get a deleted webhook", "GET", wh)


def record_wire(stack: StackClients) -> list[dict[str, Any]]:
    script = Script(stack)
    try:
        admin = run_admin_script(script)
        run_client_script(script, admin)
        run_automation_script(script, admin)
    finally:
        script.close()
    return script.entries


@pytest.fixture(scope="module")
def mock_llm() -> Iterator[MockLLM]:
    llm = MockLLM().start()
    yield llm
    llm.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, mock_llm: MockLLM) -> Iterator[StackClients]:
    config = mock_provider_toml(mock_llm.base_url) + (
        '[[mcp.servers]]\nname = "notes"\ntransport = "http"\nurl = "http://127.0.0.1:9/mcp"\n'
        'headers = { Authorization = "Bearer ${NOTES_TOKEN}", Accept = "x" }\n'
        '[[mcp.servers]]\nname = "files"\ntransport = "stdio"\ncommand = "true"\nargs = ["-v"]\n'
        'env = { HOME = "/tmp", A = "b" }\n'
        '[[providers.entries]]\nname = "second"\nprovider = "openai"\nmodel = "gpt"\n'
        'auth_token = "${MOCK_LLM_TOKEN}"\n')
    running = launch_inprocess_stack(tmp_path_factory.mktemp("wire"), config, MOCK_LLM_TOKEN="t", NOTES_TOKEN="n",
                           BAE_MAX_BODY_BYTES=str(MAX_BODY))
    yield running
    running.close()


def test_the_wire_is_as_recorded(stack: StackClients, mock_llm: MockLLM) -> None:
    mock_llm.enqueue(Reply.text("Hi there."), Reply.text("Blocks seen."), Reply.text("Quiet."),
                     Reply.text("The summary."), Reply.text("Triaged."))
    entries = record_wire(stack)
    if os.environ.get("BAE_RECORD_WIRE") == "1":
        RECORDING.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
    recorded = json.loads(RECORDING.read_text())
    assert [entry["name"] for entry in entries] == [entry["name"] for entry in recorded]
    differences = [
        f"{new['name']}:\n  recorded {json.dumps(old, ensure_ascii=False)}\n  answered {json.dumps(new, ensure_ascii=False)}"
        for old, new in zip(recorded, entries) if old != new
    ]
    assert not differences, "\n".join(differences)
