"""Session MCP connections against real MCP servers (stdio child processes and streamable HTTP)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
import uuid
from typing import Iterator

import pytest

from bae.common.config import Config, McpServer
from bae.services.session.remote.mcp import McpSessionConnections
from testkit.mcp_support import TOOLS_SERVER, http_tools_server, live_children, pid_alive
from testkit.ports import free_port

pytestmark = pytest.mark.stack

PYTHON = sys.executable
NOT_FOUND = "configured MCP server not found in bae-config.toml; skipping"
FAILED = "configured MCP server failed to connect; skipping"


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """One streamable-HTTP tools server (tool names prefixed `web_`) for the module."""
    with http_tools_server("web_") as url:
        yield url


def stdio(name: str, *extra_args: str) -> McpServer:
    return McpServer(name=name, transport="stdio", command=PYTHON, args=(TOOLS_SERVER, "stdio", *extra_args))


def http(name: str, url: str, transport: str = "http", **headers: str) -> McpServer:
    return McpServer(name=name, transport=transport, url=url, headers=headers)


def children_running(token: str) -> list[int]:
    """Our child processes whose command line contains `token`."""
    return live_children(os.getpid(), token)


async def connect(names: list[str], *servers: McpServer, call_timeout: float = 5.0) -> McpSessionConnections:
    return await McpSessionConnections.connect(
        "ses_test", names, Config(mcp_servers=servers), call_timeout=call_timeout
    )


def text_of(result) -> str:
    assert result.ok, result.error
    return result.result["content"][0]["text"]


async def test_connects_stdio_and_http_and_merges_their_tools(http_url):
    connections = await connect(["local", "web"], stdio("local"), http("web", http_url))
    try:
        names = [tool.name for tool in connections.tools]
        assert names[:8] == ["echo", "fail", "sleep", "request_header", "argv", "handshake", "environment", "output"]
        assert names[8:] == ["web_" + name for name in names[:8]]
        echo = connections.tools[0]
        assert echo.server_name == "local"
        assert echo.description == "Return the given text unchanged."
        assert echo.input_schema["type"] == "object"
        assert "text" in echo.input_schema["properties"]
        assert connections.route("echo") == "local"
        assert connections.route("web_echo") == "web"
        assert connections.route("nope") is None
        assert len(connections.child_pids()) == 1
    finally:
        await connections.close()


async def test_handshake_sends_the_spec_initialize_params(http_url):
    connections = await connect(["local", "web"], stdio("local"), http("web", http_url))
    try:
        expected = {
            "protocolVersion": "2024-11-05",
            "capabilities": {},
            "clientInfo": {"name": "bae", "version": "0.1.0"},
        }
        for tool in ("handshake", "web_handshake"):
            assert json.loads(text_of(await connections.call(tool, {}))) == expected
    finally:
        await connections.close()


async def test_call_echo_over_both_transports(http_url):
    connections = await connect(["local", "web"], stdio("local"), http("web", http_url))
    try:
        local = await connections.call("echo", {"text": "over stdio"})
        web = await connections.call("web_echo", {"text": "over http"})
        assert text_of(local) == "over stdio"
        assert text_of(web) == "over http"
        assert local.result["isError"] is False and local.error is None
    finally:
        await connections.close()


async def test_tool_error_is_a_completed_call_with_is_error(http_url):
    connections = await connect(["local", "web"], stdio("local"), http("web", http_url))
    try:
        for tool in ("fail", "web_fail"):
            result = await connections.call(tool, {"message": "broken on purpose"})
            assert result.ok and result.error is None
            assert result.result["isError"] is True
            assert "broken on purpose" in result.result["content"][0]["text"]
    finally:
        await connections.close()


async def test_unroutable_tool_is_an_error_result():
    connections = await connect([])
    result = await connections.call("nope", {})
    assert not result.ok
    assert result.error == "no MCP server is configured for tool 'nope'"


async def test_calls_on_one_connection_run_concurrently(http_url):
    connections = await connect(["local", "web"], stdio("local"), http("web", http_url))
    try:
        started = time.monotonic()
        results = await asyncio.gather(
            *(connections.call("sleep", {"seconds": 1.0}) for _ in range(3)),
            *(connections.call("web_sleep", {"seconds": 1.0}) for _ in range(3)),
        )
        assert [text_of(result) for result in results] == ["slept"] * 6
        assert time.monotonic() - started < 2.5  # serial would take 3 s per connection
    finally:
        await connections.close()


async def test_hung_call_times_out_and_the_connection_stays_usable(http_url):
    # The timeout bounds the handshake too: 3 s leaves room for a stdio child starting on a loaded machine.
    connections = await connect(["local", "web"], stdio("local"), http("web", http_url), call_timeout=3.0)
    try:
        started = time.monotonic()
        hung = await asyncio.gather(
            connections.call("sleep", {"seconds": 30}),
            connections.call("web_sleep", {"seconds": 30}),
        )
        assert time.monotonic() - started < 10
        for result in hung:
            assert not result.ok and result.result is None
            assert result.error == "tools/call timed out after 3s"
        assert text_of(await connections.call("echo", {"text": "still here"})) == "still here"
        assert text_of(await connections.call("web_echo", {"text": "still here"})) == "still here"
    finally:
        await connections.close()


async def test_unknown_server_is_skipped_and_logged_on_every_connect(caplog):
    caplog.set_level(logging.ERROR, logger="bae.session.mcp")
    for _ in range(2):
        connections = await McpSessionConnections.connect(
            "ses_unknown", ["ghost", "local"], Config(mcp_servers=(stdio("local"),)),
            profile_id="pro_1", profile_name="main",
        )
        try:
            assert connections.route("echo") == "local"
        finally:
            await connections.close()
    records = [r.getMessage() for r in caplog.records if NOT_FOUND in r.getMessage()]
    assert len(records) == 2
    for message in records:
        for field in ("mcp_server=ghost", "session_id=ses_unknown", "profile_id=pro_1", "profile_name=main"):
            assert field in message


async def test_failing_servers_are_skipped_and_logged(caplog, monkeypatch):
    caplog.set_level(logging.ERROR, logger="bae.session.mcp")
    monkeypatch.delenv("BAE_TEST_MCP_UNSET", raising=False)
    servers = (
        McpServer(name="bad-command", transport="stdio", command="/nonexistent/mcp-server"),
        http("refused", f"http://127.0.0.1:{free_port()}/mcp"),
        stdio("unset-env", "--label", "${BAE_TEST_MCP_UNSET}"),
        stdio("local"),
    )
    connections = await connect(["bad-command", "refused", "unset-env", "local"], *servers)
    try:
        assert {tool.server_name for tool in connections.tools} == {"local"}
        assert len(connections.child_pids()) == 1
    finally:
        await connections.close()
    messages = [r.getMessage() for r in caplog.records if FAILED in r.getMessage()]
    failures = {message.split("mcp_server=")[1].split()[0]: message for message in messages}
    assert set(failures) == {"bad-command", "refused", "unset-env"}
    assert "environment variable BAE_TEST_MCP_UNSET referenced by MCP server config is not set" in failures["unset-env"]


async def test_server_that_never_answers_is_skipped_and_its_child_killed(caplog):
    caplog.set_level(logging.ERROR, logger="bae.session.mcp")
    token = f"silent-{uuid.uuid4().hex}"
    silent = McpServer(
        name="silent", transport="stdio", command=PYTHON, args=("-c", "import time; time.sleep(60)", token)
    )
    started = time.monotonic()
    connections = await connect(["silent"], silent, call_timeout=0.5)
    assert time.monotonic() - started < 8
    assert connections.tools == []
    (failure,) = [r.getMessage() for r in caplog.records if FAILED in r.getMessage()]
    assert "mcp_server=silent" in failure and "initialize timed out after 0.5s" in failure
    assert children_running(token) == []


async def test_cancelled_connect_leaves_no_child_behind():
    token = f"slow-{uuid.uuid4().hex}"
    silent = McpServer(
        name="silent", transport="stdio", command=PYTHON, args=("-c", "import time; time.sleep(60)", token)
    )
    task = asyncio.create_task(connect(["silent"], silent, call_timeout=30))
    deadline = time.monotonic() + 10
    while not children_running(token):
        assert time.monotonic() < deadline, "stdio child never started"
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert children_running(token) == []


async def test_headers_and_args_resolve_env_at_connect_time(http_url, monkeypatch, caplog):
    # INFO, the default: at DEBUG the SDK logs message payloads, which here echo the secret back.
    caplog.set_level(logging.INFO)
    secret = f"secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("BAE_TEST_MCP_TOKEN", secret)
    servers = (
        http("web", http_url, Authorization="Bearer ${BAE_TEST_MCP_TOKEN}"),
        stdio("local", "--label", "${BAE_TEST_MCP_TOKEN}"),
    )
    connections = await connect(["web", "local"], *servers)
    try:
        seen = await connections.call("web_request_header", {"name": "authorization"})
        assert text_of(seen) == f"Bearer {secret}"
        assert text_of(await connections.call("argv", {})) == f"stdio --label {secret}"
        assert secret not in repr(servers)
    finally:
        await connections.close()
    assert secret not in caplog.text


async def test_sse_transport_speaks_streamable_http(http_url):
    connections = await connect(["legacy"], http("legacy", http_url, transport="sse"))
    try:
        assert connections.route("web_echo") == "legacy"
        assert text_of(await connections.call("web_echo", {"text": "sse"})) == "sse"
    finally:
        await connections.close()


async def test_route_table_last_writer_wins_on_tool_name_collisions():
    servers = (stdio("first", "--label", "first"), stdio("second", "--label", "second"))
    connections = await connect(["first", "second"], *servers)
    try:
        names = [tool.name for tool in connections.tools]
        assert sorted(names) == sorted(set(names)), "each tool is listed once"
        assert connections.route("argv") == "second"
        assert {tool.server_name for tool in connections.tools} == {"second"}
        assert text_of(await connections.call("argv", {})) == "stdio --label second"
        assert len(connections.child_pids()) == 2
    finally:
        await connections.close()


async def test_close_kills_stdio_children_and_is_idempotent(http_url):
    connections = await connect(["a", "b", "web"], stdio("a"), stdio("b"), http("web", http_url))
    pids = connections.child_pids()
    assert len(pids) == 2 and all(pid_alive(pid) for pid in pids)
    await connections.close()
    assert not any(pid_alive(pid) for pid in pids)
    assert connections.child_pids() == []
    await connections.close()
    for tool in ("echo", "web_echo"):
        result = await connections.call(tool, {"text": "late"})
        assert not result.ok and result.error


async def test_close_ends_calls_in_flight(http_url):
    connections = await connect(["local", "web"], stdio("local"), http("web", http_url), call_timeout=30)
    pids = connections.child_pids()
    calls = asyncio.gather(
        connections.call("sleep", {"seconds": 30}),
        connections.call("web_sleep", {"seconds": 30}),
    )
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await connections.close()
    results = await asyncio.wait_for(calls, timeout=10)
    assert time.monotonic() - started < 10
    assert all(not result.ok and result.error for result in results)
    assert not any(pid_alive(pid) for pid in pids)


async def test_server_dying_mid_session_yields_error_results():
    connections = await connect(["local"], stdio("local"))
    try:
        (pid,) = connections.child_pids()
        os.kill(pid, signal.SIGKILL)
        result = await asyncio.wait_for(connections.call("echo", {"text": "anyone?"}), timeout=5)
        assert not result.ok
        assert result.error == "-32000: Connection closed"
    finally:
        await connections.close()


async def test_a_transport_failure_is_reported_without_addresses():
    """A server gone mid-session fails the call by its kind; the address stays in the log."""
    with http_tools_server("gone_") as url:
        connections = await connect(["gone"], http("gone", url), call_timeout=3.0)
    try:  # the server has stopped: the next call fails below the protocol
        outcome = await connections.call("gone_echo", {"text": "anyone?"})
        assert not outcome.ok
        host_port = url.split("//", 1)[1].split("/", 1)[0]
        assert outcome.error and host_port not in outcome.error and "127.0.0.1" not in outcome.error, outcome.error
    finally:
        await connections.close()
