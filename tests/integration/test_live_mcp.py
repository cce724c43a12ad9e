"""MCP servers through the whole stack: gateway -> session -> MCP servers, runner -> mock LLM.

Every stack here has the same registry: `local` (a stdio child of the session
service, its tools unprefixed), `web` (streamable HTTP, tools prefixed `web_`,
a `${VAR}` header), and two entries that can never connect.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from testkit import live
from testkit.live import at, notifications, payloads, result, types
from testkit.mcp_support import TOOLS_SERVER, http_tools_server, live_children, pid_alive
from testkit.mockllm import MockLLM, Reply
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = pytest.mark.stack

PYTHON = sys.executable
TOOL_NAMES = ["echo", "fail", "sleep", "request_header", "argv", "handshake", "environment", "output"]
WEB_TOOL_NAMES = [f"web_{name}" for name in TOOL_NAMES]
LLM_TOKEN = "sk-test-llm-token"
REDACTED = "\u2022" * 8
NOT_FOUND = "configured MCP server not found in bae-config.toml; skipping"
FAILED = "configured MCP server failed to connect; skipping"
ABANDONED = "Client tool call was abandoned before returning a result."


# --- fixtures -------------------------------------------------------------------


@pytest.fixture(scope="module")
def web_url() -> Iterator[str]:
    """One streamable-HTTP tools server for the module (tool names prefixed `web_`)."""
    with http_tools_server("web_") as url:
        yield url


def registry_toml(web_url: str) -> str:
    return f"""
[[mcp.servers]]
name = "local"
transport = "stdio"
command = "{PYTHON}"
args = ["{TOOLS_SERVER}", "stdio", "--label", "${{MCP_LABEL}}"]
env = {{ GREETING = "hello", WEB_TOKEN_COPY = "${{WEB_MCP_TOKEN}}" }}

[[mcp.servers]]
name = "web"
transport = "http"
url = "{web_url}"
headers = {{ Authorization = "Bearer ${{WEB_MCP_TOKEN}}", X-Static = "literal-secret-value" }}

[[mcp.servers]]
name = "broken"
transport = "stdio"
command = "/nonexistent/mcp-server"

[[mcp.servers]]
name = "unset"
transport = "sse"
url = "{web_url}"
headers = {{ Authorization = "Bearer ${{MCP_TOKEN_NOT_SET}}" }}
"""


class McpStack:
    """A running stack with the registry above, plus what its tests need to look at."""

    def __init__(self, running: RunningStack, label: str, secret: str) -> None:
        self.running = running
        self.label = label  # resolved into the stdio child's argv, so its PID can be found
        self.secret = secret  # the resolved value of the `web` Authorization header
        self.opened: list[tuple[str, str]] = []

    def new_session(self, mcp_servers: list[str], tools: tuple[str, ...] = ("get_time",)) -> tuple[str, str, dict]:
        """A registered session whose profile allows `tools` and the MCP servers named."""
        sid, skey, profile = live.new_session(self.running, tools, mcp_servers=mcp_servers)
        self.opened.append((sid, skey))
        self.register(sid, skey)
        return sid, skey, profile

    def register(self, sid: str, skey: str) -> None:
        live.register(self.running, sid, skey)

    def join(self, sid: str, profile: dict) -> str:
        skey = live.join(self.running, sid, profile)
        self.register(sid, skey)
        return skey

    def send(self, sid: str, skey: str, content) -> list[dict]:
        return live.send(self.running, sid, skey, content)

    def close(self, sid: str, skey: str) -> int:
        return self.running.client.delete(
            f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"}
        ).status_code

    def close_opened(self) -> None:
        """End the sessions a test opened, so their stdio children do not pile up in a shared stack."""
        while self.opened:
            self.close(*self.opened.pop())

    def events(self, sid: str, skey: str) -> list[dict]:
        page = self.running.client.get(f"/api/v1/sessions/{sid}/events", headers={"Authorization": f"Bearer {skey}"})
        assert page.status_code == 200, page.text
        return page.json()["items"]

    def log(self, service: str) -> str:
        return (self.running.tmp / "logs" / f"{service}.log").read_text()

    def stdio_children(self) -> set[int]:
        """Live processes started by the session service with this stack's label in their argv."""
        return set(live_children(self.running.stack.processes["session"].pid, self.label))


def launch(tmp: Path, mock: MockLLM, web_url: str, **env: str) -> McpStack:
    label = f"label-{uuid.uuid4().hex}"
    secret = f"secret-{uuid.uuid4().hex}"
    running = launch_stack(
        tmp, mock_provider_toml(mock.base_url) + registry_toml(web_url),
        MOCK_LLM_TOKEN=LLM_TOKEN, MCP_LABEL=label, WEB_MCP_TOKEN=secret, **env,
    )
    return McpStack(running, label, secret)


@pytest.fixture(scope="module")
def shared(tmp_path_factory, mock, web_url) -> Iterator[McpStack]:
    """One stack for every test that needs no settings of its own (a stack start costs seconds)."""
    stack = launch(tmp_path_factory.mktemp("mcp"), mock, web_url, BAE_TURN_TIMEOUT="1")
    yield stack
    stack.running.close()


@pytest.fixture
def stack(shared, mock) -> Iterator[McpStack]:
    mock.reset()
    yield shared
    shared.close_opened()


@pytest.fixture
def own_stack(tmp_path, mock, web_url) -> Iterator:
    """start(**env): a stack of this test's own, for settings the shared one cannot have."""
    started: list[McpStack] = []

    def start(**env: str) -> McpStack:
        mock.reset()
        started.append(launch(tmp_path, mock, web_url, **env))
        return started[-1]

    yield start
    for stack in started:
        stack.running.close()


def text_result(text: str) -> list[dict]:
    return [{"type": "text", "text": text}]


def advertised(request: dict) -> list[str]:
    return [tool["name"] for tool in request["body"]["tools"]]


# --- tool list merge ------------------------------------------------------------


def test_mcp_tools_follow_the_client_tools_for_every_driver(stack, mock):
    children = stack.stdio_children()
    sid, skey_a, profile = stack.new_session(["local", "web"])
    mock.enqueue(Reply.text("hi A"))
    result(stack.send(sid, skey_a, "hello"))
    tools = mock.requests[-1]["body"]["tools"]
    assert [tool["name"] for tool in tools] == ["get_time", *TOOL_NAMES, *WEB_TOOL_NAMES]
    echo = tools[1]
    assert echo["description"] == "Return the given text unchanged."
    assert echo["input_schema"]["type"] == "object" and "text" in echo["input_schema"]["properties"]

    # Connections are session-wide: a joined driver without client tools sees the same MCP tools.
    skey_b = stack.join(sid, profile)
    mock.enqueue(Reply.text("hi B"))
    result(stack.send(sid, skey_b, "hello from B"))
    assert advertised(mock.requests[-1]) == [*TOOL_NAMES, *WEB_TOOL_NAMES]
    assert len(stack.stdio_children() - children) == 1  # joining opens no second connection


def test_a_declared_client_tool_shadows_an_mcp_tool_of_the_same_name(stack, mock):
    sid, skey, _ = stack.new_session(["local"], tools=("echo",))
    mock.enqueue(Reply.tool_use([("tu_1", "echo", {"text": "mine"})]))
    paused = result(stack.send(sid, skey, "echo it"))
    tools = mock.requests[-1]["body"]["tools"]
    assert [tool["name"] for tool in tools] == ["echo", *(name for name in TOOL_NAMES if name != "echo")]
    assert tools[0]["description"] == "echo"  # the client's declaration, listed once
    assert payloads(paused["events"], "tool.call")[0]["dispatch"] == "client"
    assert "mcp.request" not in types(paused["events"])


# --- dispatch -------------------------------------------------------------------


def test_mcp_only_round_trip_records_the_exact_sequence(stack, mock):
    sid, skey, _ = stack.new_session(["local", "web"])
    mock.enqueue(Reply.tool_use([("tu_1", "echo", {"text": "hello"})]), Reply.text("done"))
    frames = stack.send(sid, skey, "echo hello")
    outcome = result(frames)
    assert outcome["message"] == {"role": "assistant", "content": text_result("done")}
    events = outcome["events"]
    assert types(events) == [
        "client.message.send", "provider.request", "provider.response",
        "tool.call", "mcp.request", "mcp.response", "tool.result",
        "provider.request", "provider.response", "server.message.send",
    ]
    assert types(notifications(frames)) == types(events)[1:]  # all but the caller's own message
    assert events[3]["payload"] == {
        "id": "tu_1", "name": "echo", "input": {"text": "hello"}, "dispatch": "mcp", "server_name": "local",
    }
    assert events[4]["payload"] == {
        "method": "tools/call", "server_name": "local", "tool": "echo", "input": {"text": "hello"},
    }
    response = events[5]["payload"]
    assert response["server_name"] == "local" and response["ok"] is True
    assert response["result"]["content"] == text_result("hello")
    assert response["result"]["isError"] is False
    assert events[6]["payload"] == {
        "tool_use_id": "tu_1", "dispatch": "mcp", "server_name": "local", "is_error": False,
        "content": text_result("hello"),
    }
    # The provider saw the MCP result as the user turn after its tool_use.
    sent = mock.requests[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "tu_1", "content": text_result("hello"), "is_error": False}
    ]
    assert "dispatch" not in json.dumps(sent)
    # Durable: the replay holds the same events.
    assert [e["id"] for e in stack.events(sid, skey)[-10:]] == [e["id"] for e in events]


def test_tool_errors_and_unroutable_names_are_error_results_and_the_turn_goes_on(stack, mock):
    sid, skey, _ = stack.new_session(["local"])
    mock.enqueue(
        Reply.tool_use([("tu_f", "fail", {"message": "broken on purpose"}), ("tu_x", "no_such_tool", {"a": 1})]),
        Reply.text("recovered"),
    )
    outcome = result(stack.send(sid, skey, "try both"))
    events = outcome["events"]
    assert outcome["message"]["content"] == text_result("recovered")
    assert [(p["dispatch"], p["server_name"]) for p in payloads(events, "tool.call")] == [
        ("mcp", "local"), ("mcp", None),
    ]
    assert [p["server_name"] for p in payloads(events, "mcp.request")] == ["local", None]
    failed, unroutable = payloads(events, "mcp.response")
    assert failed["server_name"] == "local" and failed["ok"] is False
    assert failed["result"]["isError"] is True
    assert "broken on purpose" in failed["result"]["content"][0]["text"]
    no_server = "no MCP server is configured for tool 'no_such_tool'"
    assert unroutable == {"server_name": None, "ok": False, "error": no_server}
    tool_error, unserved = payloads(events, "tool.result")
    assert tool_error["is_error"] is True and tool_error["content"] == failed["result"]["content"]
    assert unserved == {
        "tool_use_id": "tu_x", "dispatch": "mcp", "server_name": None, "is_error": True,
        "content": text_result(f"MCP error: {no_server}"),
    }
    assert types(events)[-3:] == ["provider.request", "provider.response", "server.message.send"]
    last_user = mock.requests[-1]["body"]["messages"][-1]["content"]
    assert [(block["tool_use_id"], block["is_error"]) for block in last_user] == [("tu_f", True), ("tu_x", True)]


def test_several_mcp_calls_in_one_message_overlap_and_keep_the_model_order(stack, mock):
    sid, skey, _ = stack.new_session(["local", "web"])
    mock.enqueue(
        Reply.tool_use([
            ("tu_1", "sleep", {"seconds": 1}),
            ("tu_2", "web_sleep", {"seconds": 1}),
            ("tu_3", "echo", {"text": "quick"}),  # finishes first, recorded last
        ]),
        Reply.text("all done"),
    )
    events = result(stack.send(sid, skey, "three at once"))["events"]
    assert types(events)[3:15] == [
        "tool.call", "tool.call", "tool.call", "mcp.request", "mcp.request", "mcp.request",
        "mcp.response", "tool.result", "mcp.response", "tool.result", "mcp.response", "tool.result",
    ]
    assert [p["tool_use_id"] for p in payloads(events, "tool.result")] == ["tu_1", "tu_2", "tu_3"]
    assert [p["content"] for p in payloads(events, "tool.result")] == [
        text_result("slept"), text_result("slept"), text_result("quick"),
    ]
    # Server-side timestamps: each sleep took its full second, yet all three calls fit in one.
    requests = [e for e in events if e["event_type"] == "mcp.request"]
    responses = [e for e in events if e["event_type"] == "mcp.response"]
    assert at(responses[0]) - at(requests[0]) >= 0.99
    assert at(responses[1]) - at(requests[1]) >= 0.99
    assert at(responses[2]) - at(requests[0]) < 1.7  # one after the other would take 2 s
    last_user = mock.requests[-1]["body"]["messages"][-1]["content"]
    assert [block["tool_use_id"] for block in last_user] == ["tu_1", "tu_2", "tu_3"]


def digits(size: int) -> str:
    """What the test server's `output` tool returns."""
    return ("0123456789" * (size // 10 + 1))[:size]


def test_a_stdio_result_over_the_output_limit_reaches_the_model_and_the_log_cut(stack, mock):
    limit = 1024 * 1024  # BAE_MCP_OUTPUT_LIMIT's default
    size = 2_000_000
    sid, skey, _ = stack.new_session(["local"])
    mock.enqueue(Reply.tool_use([("tu_big", "output", {"size": size})]), Reply.text("read it"))
    events = result(stack.send(sid, skey, "print a lot"))["events"]
    cut = text_result(digits(size)[:limit] + f"\n[output truncated: {size - limit} bytes omitted]\n")
    # The MCP result as read: its text cut, structuredContent (the same text again) left out.
    (response,) = payloads(events, "mcp.response")
    assert response == {"server_name": "local", "ok": True, "result": {"content": cut, "isError": False}}
    (stored,) = payloads(events, "tool.result")
    assert stored["content"] == cut and stored["is_error"] is False
    # The provider got the same cut text, and the log holds the result nowhere longer than that.
    assert mock.requests[-1]["body"]["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "tu_big", "content": cut, "is_error": False}
    ]
    logged = stack.events(sid, skey)
    assert [e["id"] for e in logged[-len(events):]] == [e["id"] for e in events]
    assert max(len(json.dumps(e["payload"])) for e in logged) < limit + 4096


def test_an_http_result_over_the_output_limit_is_an_error_result(stack, mock):
    sid, skey, _ = stack.new_session(["web"])
    mock.enqueue(Reply.tool_use([("tu_big", "web_output", {"size": 2_000_000})]), Reply.text("no luck"))
    events = result(stack.send(sid, skey, "print a lot"))["events"]
    (response,) = payloads(events, "mcp.response")
    assert response["ok"] is False and "1048576 byte" in response["error"], response
    (stored,) = payloads(events, "tool.result")
    assert stored["is_error"] is True and stored["content"] == text_result(f"MCP error: {response['error']}")


# --- mixed client + MCP turns ----------------------------------------------------

MIXED_REPLY = Reply.tool_use([("tu_m", "echo", {"text": "from mcp"}), ("tu_c", "get_time", {})])
MCP_RESULT_BLOCK = {"type": "tool_result", "tool_use_id": "tu_m", "content": text_result("from mcp"), "is_error": False}


def pause_mixed(stack: McpStack, mock: MockLLM) -> tuple[str, str, dict]:
    """A turn whose one assistant message holds an MCP and a client tool_use: it pauses."""
    sid, skey, profile = stack.new_session(["local"])
    mock.enqueue(MIXED_REPLY)
    paused = result(stack.send(sid, skey, "both please"))
    assert types(paused["events"]) == [
        "client.message.send", "provider.request", "provider.response", "tool.call", "tool.call",
        "mcp.request", "mcp.response", "tool.result", "server.message.send",
    ]
    assert paused["message"] == {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "tu_m", "name": "echo", "input": {"text": "from mcp"}, "dispatch": "mcp"},
            {"type": "tool_use", "id": "tu_c", "name": "get_time", "input": {}, "dispatch": "client"},
        ],
    }
    assert paused["events"][-1]["payload"] == paused["message"]
    return sid, skey, profile


def assert_mcp_ran_once(stack: McpStack, sid: str, skey: str) -> None:
    events = stack.events(sid, skey)
    assert types(events).count("mcp.request") == 1
    assert types(events).count("mcp.response") == 1
    assert [p["tool_use_id"] for p in payloads(events, "tool.result")].count("tu_m") == 1


def test_mixed_turn_pauses_then_merges_both_results_into_one_user_turn(stack, mock):
    sid, skey, _ = pause_mixed(stack, mock)
    mock.enqueue(Reply.text("both done"))
    client_result = {"type": "tool_result", "tool_use_id": "tu_c", "content": "12:00"}
    resumed = result(stack.send(sid, skey, [client_result]))
    assert resumed["message"]["content"] == text_result("both done")
    assert types(resumed["events"]) == [
        "client.message.send", "tool.result", "provider.request", "provider.response", "server.message.send",
    ]
    assert resumed["events"][0]["payload"] == {"role": "user", "content": [MCP_RESULT_BLOCK, client_result]}
    assert resumed["events"][1]["payload"] == {
        "tool_use_id": "tu_c", "dispatch": "client", "server_name": None, "is_error": False, "content": "12:00",
    }
    assert_mcp_ran_once(stack, sid, skey)
    sent = mock.requests[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert [block["tool_use_id"] for block in sent[2]["content"]] == ["tu_m", "tu_c"]
    assert sent[2]["content"][0] == MCP_RESULT_BLOCK


@pytest.mark.parametrize("how", ["plain_message", "timeout"])
def test_abandoned_pause_keeps_the_parked_mcp_result(stack, mock, how):
    sid, skey, profile = pause_mixed(stack, mock)
    if how == "timeout":
        skey = stack.join(sid, profile)
        time.sleep(1.1)  # BAE_TURN_TIMEOUT=1: the paused turn expires
    mock.enqueue(Reply.text("moving on"))
    outcome = result(stack.send(sid, skey, "never mind"))
    assert types(outcome["events"])[:2] == ["client.message.send", "tool.result"]
    assert outcome["events"][0]["payload"]["content"] == [
        MCP_RESULT_BLOCK,
        {"type": "tool_result", "tool_use_id": "tu_c", "content": ABANDONED, "is_error": True},
        {"type": "text", "text": "never mind"},
    ]
    assert outcome["events"][1]["payload"]["tool_use_id"] == "tu_c"
    assert outcome["message"]["content"] == text_result("moving on")
    assert_mcp_ran_once(stack, sid, skey)
    abandoned = payloads(stack.events(sid, skey), "session.error")
    assert [p["reason"] for p in abandoned] == (["driver_turn_abandoned"] if how == "timeout" else [])


# --- skipped servers ---------------------------------------------------------------


def test_unknown_and_failing_servers_are_skipped_and_logged_on_every_open(stack, mock):
    opened = []
    for _ in range(2):
        sid, skey, _ = stack.new_session(["ghost", "broken", "unset", "local"])
        opened.append(sid)
        mock.enqueue(Reply.text("only local"))
        outcome = result(stack.send(sid, skey, "hi"))
        assert outcome["message"]["content"] == text_result("only local")
        assert advertised(mock.requests[-1]) == ["get_time", *TOOL_NAMES]
    for sid in opened:
        lines = [line for line in stack.log("session").splitlines() if f"session_id={sid}" in line]
        not_found = [line for line in lines if NOT_FOUND in line]
        failed = {line.split("mcp_server=")[1].split()[0]: line for line in lines if FAILED in line}
        assert len(not_found) == 1 and "mcp_server=ghost" in not_found[0]
        assert sorted(failed) == ["broken", "unset"]
        assert "environment variable MCP_TOKEN_NOT_SET referenced by MCP server config is not set" in failed["unset"]


def test_hung_call_ends_with_an_error_result_after_the_configured_timeout(own_stack, mock):
    stack = own_stack(BAE_MCP_TIMEOUT="1")
    sid, skey, _ = stack.new_session(["web"])
    mock.enqueue(
        Reply.tool_use([("tu_1", "web_sleep", {"seconds": 10})]),
        Reply.tool_use([("tu_2", "web_echo", {"text": "still connected"})]),  # the connection outlives the timeout
        Reply.text("gave up waiting"),
    )
    started = time.monotonic()
    outcome = result(stack.send(sid, skey, "sleep long"))
    assert time.monotonic() - started < 5
    assert outcome["message"]["content"] == text_result("gave up waiting")
    timed_out = "tools/call timed out after 1s"
    first_response, second_response = payloads(outcome["events"], "mcp.response")
    assert first_response == {"server_name": "web", "ok": False, "error": timed_out}
    assert payloads(outcome["events"], "tool.result")[0] == {
        "tool_use_id": "tu_1", "dispatch": "mcp", "server_name": "web", "is_error": True,
        "content": text_result(f"MCP error: {timed_out}"),
    }
    assert second_response["ok"] is True and second_response["result"]["content"] == text_result("still connected")


# --- lifecycle ---------------------------------------------------------------------


def echo_turn(stack: McpStack, mock: MockLLM, sid: str, skey: str, text: str) -> dict:
    mock.enqueue(Reply.tool_use([("tu_e", "echo", {"text": text})]), Reply.text("echoed"))
    outcome = result(stack.send(sid, skey, f"echo {text}"))
    (response,) = payloads(outcome["events"], "mcp.response")
    assert response["ok"] is True and response["result"]["content"] == text_result(text), response
    return outcome


def web_session_id(stack: McpStack, mock: MockLLM, sid: str, skey: str) -> str:
    """The MCP session id BAE's connection to `web` holds (the test tool reads its own request header)."""
    mock.enqueue(Reply.tool_use([("tu_s", "web_request_header", {"name": "mcp-session-id"})]), Reply.text("ok"))
    (read,) = payloads(result(stack.send(sid, skey, "which MCP session?"))["events"], "tool.result")
    session_id = read["content"][0]["text"]
    assert session_id, read
    return session_id


def mcp_session_alive(url: str, session_id: str) -> bool:
    """Ask the HTTP server itself: a terminated MCP session id is answered 404."""
    response = httpx.post(
        url,
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"Accept": "application/json, text/event-stream", "Mcp-Session-Id": session_id,
                 "Mcp-Protocol-Version": "2024-11-05"},
        timeout=10,
    )
    assert response.status_code in (200, 404), response.text
    return response.status_code == 200


def test_closing_a_session_kills_its_stdio_server_and_ends_its_http_session(stack, mock, web_url):
    children = stack.stdio_children()
    closed_by_client, skey, _ = stack.new_session(["local", "web"])
    echo_turn(stack, mock, closed_by_client, skey, "one")
    (first,) = stack.stdio_children() - children
    http_session = web_session_id(stack, mock, closed_by_client, skey)
    revoked, other_skey, other_profile = stack.new_session(["local"])
    echo_turn(stack, mock, revoked, other_skey, "two")
    (second,) = stack.stdio_children() - children - {first}
    assert mcp_session_alive(web_url, http_session)

    assert stack.close(closed_by_client, skey) == 200
    assert not pid_alive(first) and pid_alive(second)
    assert not mcp_session_alive(web_url, http_session)

    # Revoking the only key of a session closes it too, with the same teardown.
    (key,) = [k for k in stack.running.admin.get("/admin/v1/keys").json()["items"]
              if k["profile_id"] == other_profile["id"]]
    assert stack.running.admin.delete(f"/admin/v1/keys/{key['id']}").status_code == 204
    assert not pid_alive(second)
    assert stack.stdio_children() == children


def test_an_open_session_reconnects_its_servers_after_a_session_service_restart(own_stack, mock):
    stack = own_stack()
    sid, skey, _ = stack.new_session(["local", "web"])
    echo_turn(stack, mock, sid, skey, "before")
    (before,) = stack.stdio_children()

    stack.running.stack.restart("session")
    assert not pid_alive(before)  # shutdown closed the connections
    assert stack.stdio_children() == set()  # nothing connects until the session is used

    # The driver's registration is in the log: it sends again without registering.
    outcome = echo_turn(stack, mock, sid, skey, "after")
    assert advertised(mock.requests[-2]) == ["get_time", *TOOL_NAMES, *WEB_TOOL_NAMES]
    assert payloads(outcome["events"], "tool.call")[0]["server_name"] == "local"
    (after,) = stack.stdio_children()
    assert after != before


# --- admin views and secrets ---------------------------------------------------------


def test_admin_views_redact_secrets_that_resolve_only_when_connecting(stack, mock, web_url):
    admin = stack.running.admin
    assert admin.get("/admin/v1/mcp-servers").json() == {
        "items": [
            {"name": "broken", "transport": "stdio"},
            {"name": "local", "transport": "stdio"},
            {"name": "unset", "transport": "sse"},
            {"name": "web", "transport": "http"},
        ]
    }
    config = admin.get("/admin/v1/config")
    assert config.status_code == 200
    assert config.json()["mcp"]["servers"] == [
        {"name": "broken", "transport": "stdio", "command": "/nonexistent/mcp-server", "args": [], "url": None,
         "headers": {}, "env": {}},
        {"name": "local", "transport": "stdio", "command": PYTHON, "url": None, "headers": {},
         "args": [TOOLS_SERVER, "stdio", "--label", "${MCP_LABEL}"],
         "env": {"GREETING": REDACTED, "WEB_TOKEN_COPY": REDACTED}},
        {"name": "unset", "transport": "sse", "command": None, "args": [], "url": web_url,
         "headers": {"Authorization": REDACTED}, "env": {}},
        {"name": "web", "transport": "http", "command": None, "args": [], "url": web_url,
         "headers": {"Authorization": REDACTED, "X-Static": REDACTED}, "env": {}},
    ]
    assert "literal-secret-value" not in config.text and stack.secret not in config.text

    # The stdio args and the http header are resolved for the connections themselves...
    sid, skey, _ = stack.new_session(["local", "web"])
    mock.enqueue(
        Reply.tool_use([("tu_a", "argv", {}), ("tu_w", "web_echo", {"text": "over http"})]), Reply.text("seen")
    )
    events = result(stack.send(sid, skey, "show me"))["events"]
    assert [p["content"] for p in payloads(events, "tool.result")] == [
        text_result(f"stdio --label {stack.label}"), text_result("over http"),
    ]
    # ...and never logged by any service or recorded in the session's events.
    for service in ("session", "runner", "gateway"):
        assert stack.secret not in stack.log(service)
    assert stack.secret not in json.dumps(stack.events(sid, skey))
    # The server did receive the resolved header (the test tool echoes it back).
    mock.enqueue(Reply.tool_use([("tu_h", "web_request_header", {"name": "authorization"})]), Reply.text("ok"))
    events = result(stack.send(sid, skey, "which header?"))["events"]
    assert payloads(events, "tool.result")[0]["content"] == text_result(f"Bearer {stack.secret}")


def test_a_stdio_child_sees_a_minimal_environment_plus_its_declared_env(stack, mock):
    sid, skey, _ = stack.new_session(["local"])
    mock.enqueue(Reply.tool_use([("tu_env", "environment", {})]), Reply.text("seen"))
    (read,) = payloads(result(stack.send(sid, skey, "what is your environment?"))["events"], "tool.result")
    environment = json.loads(read["content"][0]["text"])
    # The declared env, resolved; nothing of the session service's own settings or provider tokens.
    assert environment["GREETING"] == "hello" and environment["WEB_TOKEN_COPY"] == stack.secret
    assert [name for name in environment if name.startswith("BAE_")] == []
    assert LLM_TOKEN not in environment.values() and "MOCK_LLM_TOKEN" not in environment
    assert set(environment) <= {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LANGUAGE", "LC_ALL",
                                "LC_CTYPE", "TZ", "GREETING", "WEB_TOKEN_COPY"}
