"""Session-wide MCP client connections (SERVER-SPEC §9.2, §9.3).

One `McpSessionConnections` per session: at session create it connects every
MCP server the profile names (stdio child process, or MCP Streamable HTTP for
both `http` and `sse`), runs the handshake, lists tools, and from then on
routes `tools/call` to the server that listed the tool. Servers that are
missing from the registry or fail to connect are logged and skipped; MCP never
fails session creation.

Each connection's SDK context managers (transport + ClientSession) live in
one long-lived asyncio task that enters and exits them, because anyio task
groups must be exited by the task that entered them. Calls run in the
caller's task, so any number may be in flight on one connection at once, and
close() may be called from any task.

`${ENV}` tokens in headers and stdio command/args/env are resolved immediately
before connecting; resolved values are handed to the transport only and never
stored on these objects, logged or returned.

Every message read from a server is bounded by `BAE_MCP_OUTPUT_LIMIT` as it is read
(`mcp_stdio.py`, `mcp_output.py`, `mcp_http.py`): a stdio server's over-long tools/call
result is shortened, an HTTP server's fails the call.

A stdio child gets a minimal environment, never the session service's own
(which holds provider tokens, the database path and the admin key file):
the SDK's safe defaults (HOME, LOGNAME, PATH, SHELL, TERM, USER), the locale
and time zone variables below when set, and the server's declared `env`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx2
import mcp_types as types
from mcp import ClientSession, MCPError
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import TypeAdapter

from bae import __version__
from bae.common.config import Config, McpServer, resolve_env
from bae.common.redact import redact, register_config
from bae.common.settings import DEFAULT_MCP_OUTPUT_LIMIT
from bae.services.session.engine.ports import McpCallResult, McpTool
from bae.services.session.remote.mcp_http import CappedTransport
from bae.services.session.remote.mcp_stdio import bounded_stdio_client
from bae.services.session.store.records import ProfileRecord

log = logging.getLogger("bae.session.mcp")

# §9.2 handshake: the protocol version BAE offers and the clientInfo it sends.
PROTOCOL_VERSION = "2024-11-05"
CLIENT_INFO = types.Implementation(name="bae", version=__version__)

DEFAULT_CALL_TIMEOUT = 30.0
# How long a graceful close may take (stdio: stdin EOF, then SIGTERM/SIGKILL of the
# process group, all bounded inside the SDK; http: DELETE of the MCP session)
# before the connection task is cancelled outright.
CLOSE_GRACE_SECONDS = 8.0
# Spawning a stdio child retries only errors that mean "try again shortly".
SPAWN_RETRY_SECONDS = 3.0
SPAWN_RETRY_INTERVAL = 0.1
TRANSIENT_SPAWN_ERRNOS = frozenset({errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE})
# A server whose tools/list pagination never ends cannot hang session creation.
MAX_TOOL_PAGES = 100
# Idle read timeout for the HTTP client: the standalone GET event stream may sit
# silent for long stretches; requests themselves are bounded by the call timeout.
HTTP_STREAM_READ_TIMEOUT = 300.0
# Passed to stdio children besides the SDK's defaults: how text and times render.
INHERITED_ENV_VARS = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ")
ENV_WHAT = "MCP server config"

_RAW_RESULT = TypeAdapter(dict[str, Any])
T = TypeVar("T")


class McpSessionConnections:
    """All MCP connections of one session, plus the tool-name route table."""

    def __init__(
        self, session_id: str, call_timeout: float = DEFAULT_CALL_TIMEOUT, output_limit: int = DEFAULT_MCP_OUTPUT_LIMIT
    ) -> None:
        self.session_id = session_id
        self.tools: list[McpTool] = []
        self._call_timeout = call_timeout
        self._output_limit = output_limit
        self._connections: list[_Connection] = []
        self._by_server: dict[str, _Connection] = {}
        self._routes: dict[str, str] = {}

    @classmethod
    async def connect(
        cls,
        session_id: str,
        server_names: Sequence[str],
        config: Config,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        output_limit: int = DEFAULT_MCP_OUTPUT_LIMIT,
        profile_id: str | None = None,
        profile_name: str | None = None,
    ) -> McpSessionConnections:
        """Connect every named server concurrently; merge tools in `server_names` order.

        Never raises because of MCP: missing and failing servers are logged and skipped.
        """
        connections = cls(session_id, call_timeout, output_limit)
        context = _LogContext(session_id, profile_id, profile_name)
        try:
            async with asyncio.TaskGroup() as group:
                opening = [
                    group.create_task(connections._open(name, config.mcp_server(name), context))
                    for name in server_names
                ]
        except BaseException:
            # Cancelled mid-connect: every opened child must still go away.
            await connections.close()
            raise
        merged: dict[str, McpTool] = {}
        for name, task in zip(server_names, opening):
            tools = task.result()
            if tools is None:
                continue
            for tool in tools:
                # Last writer wins, for both the listed definition and the route.
                merged.pop(tool.name, None)
                merged[tool.name] = tool
                connections._routes[tool.name] = name
        connections.tools = list(merged.values())
        return connections

    async def _open(self, name: str, server: McpServer | None, context: _LogContext) -> list[McpTool] | None:
        if server is None:
            log.error(
                "configured MCP server not found in bae-config.toml; skipping %s",
                context.fields(name),
            )
            return None
        connection = _Connection(name, self._call_timeout, self._output_limit)
        self._connections.append(connection)
        try:
            tools = await connection.open(server)
        except Exception as exc:
            log.error(
                "configured MCP server failed to connect; skipping %s error=%r",
                context.fields(name),
                _describe(exc),
            )
            self._connections.remove(connection)
            return None
        self._by_server[name] = connection
        return tools

    def route(self, tool_name: str) -> str | None:
        """The server serving `tool_name`, or None when no connected server listed it."""
        return self._routes.get(tool_name)

    async def call(self, tool_name: str, arguments: dict[str, Any]) -> McpCallResult:
        """`tools/call` on the routed server; never raises for MCP failures."""
        server_name = self._routes.get(tool_name)
        if server_name is None:
            return McpCallResult(ok=False, error=f"no MCP server is configured for tool '{tool_name}'")
        return await self._by_server[server_name].call(tool_name, arguments)

    async def close(self) -> None:
        """Kill stdio children and close HTTP sessions. Idempotent."""
        connections, self._connections = self._connections, []
        await asyncio.gather(*(connection.close() for connection in connections))

    def child_pids(self) -> list[int]:
        """PIDs of the live stdio children."""
        return [c.pid for c in self._connections if c.pid is not None]


class McpConnector:
    """Connects a session's profile's MCP servers, as the registry in bae-config.toml declares them."""

    def __init__(
        self, config: Config, *, call_timeout: float = DEFAULT_CALL_TIMEOUT, output_limit: int = DEFAULT_MCP_OUTPUT_LIMIT
    ) -> None:
        self._config = config
        register_config(config)  # its credential headers are redacted from what a server answers
        self._call_timeout = call_timeout
        self._output_limit = output_limit

    async def connect(self, session_id: str, profile: ProfileRecord) -> McpSessionConnections:
        return await McpSessionConnections.connect(
            session_id, list(profile.mcp_servers), self._config, call_timeout=self._call_timeout,
            output_limit=self._output_limit, profile_id=profile.id, profile_name=profile.name,
        )


@dataclass(frozen=True)
class _LogContext:
    session_id: str
    profile_id: str | None
    profile_name: str | None

    def fields(self, server_name: str) -> str:
        return (
            f"profile_id={self.profile_id} profile_name={self.profile_name} "
            f"mcp_server={server_name} session_id={self.session_id}"
        )


class _Connection:
    """One MCP server connection owned by a dedicated task."""

    def __init__(self, server_name: str, call_timeout: float, output_limit: int) -> None:
        self.server_name = server_name
        self.pid: int | None = None
        self._call_timeout = call_timeout
        self._output_limit = output_limit
        self._session: ClientSession | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[list[McpTool]] | None = None

    async def open(self, server: McpServer) -> list[McpTool]:
        """Connect and list tools; raises what made the connection fail."""
        ready = self._ready = asyncio.get_running_loop().create_future()
        # Nobody awaits `ready` any more if open() is cancelled; retrieve its outcome anyway.
        ready.add_done_callback(lambda future: future.cancelled() or future.exception())
        self._task = asyncio.create_task(self._hold(server, ready), name=f"mcp:{server.name}")
        try:
            return await asyncio.shield(ready)
        except BaseException:
            await self.close()
            raise

    async def _hold(self, server: McpServer, ready: asyncio.Future[list[McpTool]]) -> None:
        """Enter the transport and session, handshake, then keep them open until close()."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                session = await self._open_session(stack, server)
                tools = await self._handshake(session)
                self._session = session
                ready.set_result(tools)
                await self._stop.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(ConnectionAbortedError("closed while connecting"))
            raise
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.warning("MCP server connection ended mcp_server=%s error=%r", self.server_name, _describe(exc))
        finally:
            self._session = None

    async def _open_session(self, stack: contextlib.AsyncExitStack, server: McpServer) -> ClientSession:
        if server.transport == "stdio":
            read, write = await self._open_stdio(stack, server)
        else:
            # §9.2: `sse` entries speak MCP Streamable HTTP too.
            read, write = await self._open_http(stack, server)
        return await stack.enter_async_context(ClientSession(read, write, client_info=CLIENT_INFO))

    async def _open_stdio(self, stack: contextlib.AsyncExitStack, server: McpServer) -> tuple[Any, Any]:
        assert server.command is not None  # config validation: a stdio server has a command
        command = resolve_env(server.command, what=ENV_WHAT)
        args = [resolve_env(arg, what=ENV_WHAT) for arg in server.args]
        env = {
            **get_default_environment(),
            **{name: os.environ[name] for name in INHERITED_ENV_VARS if name in os.environ},
            **{name: resolve_env(value, what=ENV_WHAT) for name, value in server.env.items()},
        }
        stderr = stack.enter_context(open(os.devnull, "w"))  # noqa: ASYNC230  # §9.2: child stderr is discarded; /dev/null never blocks
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SPAWN_RETRY_SECONDS
        while True:
            try:
                child = await stack.enter_async_context(
                    bounded_stdio_client(command, args, env, limit=self._output_limit, errlog=stderr)
                )
                break
            except OSError as exc:
                if exc.errno not in TRANSIENT_SPAWN_ERRNOS or loop.time() >= deadline:
                    raise
                await asyncio.sleep(SPAWN_RETRY_INTERVAL)
        self.pid = child.pid
        return child.read, child.write

    async def _open_http(self, stack: contextlib.AsyncExitStack, server: McpServer) -> tuple[Any, Any]:
        headers = {key: resolve_env(value, what=ENV_WHAT) for key, value in server.headers.items()}
        client = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=headers,
                timeout=httpx2.Timeout(self._call_timeout, read=HTTP_STREAM_READ_TIMEOUT),
                transport=CappedTransport(self._output_limit),
            )
        )
        assert server.url is not None  # config validation: an http server has a url
        return await stack.enter_async_context(
            streamable_http_client(server.url, http_client=client, max_sse_event_size=self._output_limit)
        )

    async def _handshake(self, session: ClientSession) -> list[McpTool]:
        """§9.2: initialize, notifications/initialized, tools/list (every page)."""
        request = types.InitializeRequest(
            params=types.InitializeRequestParams(
                protocol_version=PROTOCOL_VERSION,
                capabilities=types.ClientCapabilities(),
                client_info=CLIENT_INFO,
            )
        )
        result = await self._bounded("initialize", session.send_request(request, types.InitializeResult))
        if result.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
            raise RuntimeError(f"server chose unsupported protocol version {result.protocol_version}")
        session.adopt(result)
        await self._bounded("notifications/initialized", session.send_notification(types.InitializedNotification()))
        listed: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self._bounded("tools/list", session.list_tools(params=params))
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return [
            McpTool(
                name=tool.name,
                description=tool.description or "",
                input_schema=tool.input_schema or {"type": "object"},
                server_name=self.server_name,
            )
            for tool in listed
        ]

    async def call(self, tool_name: str, arguments: dict[str, Any]) -> McpCallResult:
        session = self._session
        if session is None:
            return McpCallResult(ok=False, error=f"MCP server '{self.server_name}' is not connected")
        request = types.CallToolRequest(params=types.CallToolRequestParams(name=tool_name, arguments=arguments))
        try:
            # Kept verbatim: the engine reads content/isError with the spec's defaults.
            # The SDK types result models only; the raw dict adapter is what keeps the result verbatim.
            raw = await self._bounded("tools/call", session.send_request(request, _RAW_RESULT))  # type: ignore[type-var]
        except Exception as exc:
            return McpCallResult(ok=False, error=self._reported(exc))
        return McpCallResult(ok=True, result=raw)

    def _reported(self, exc: BaseException) -> str:
        """The error text for events and the model: the server's own answer or a timeout as
        they are; anything else (a transport failure, which may name hosts) only by its kind,
        with the detail in the log."""
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if isinstance(exc, (MCPError, RequestTimeout)):
            return redact(_describe(exc))  # a server may repeat part of its credential header
        log.warning("MCP call failed mcp_server=%s error=%r", self.server_name, redact(_describe(exc)))
        return f"the call to MCP server '{self.server_name}' failed ({type(exc).__name__}); see the server log"

    async def _bounded(self, method: str, request: Awaitable[T]) -> T:
        """Await one MCP request within the per-request timeout (§9.2)."""
        try:
            async with asyncio.timeout(self._call_timeout) as deadline:
                return await request
        except TimeoutError:
            if deadline.expired():
                raise RequestTimeout(f"{method} timed out after {self._call_timeout:g}s") from None
            raise

    async def close(self) -> None:
        task = self._task
        if task is None:
            return
        self._session = None  # new calls fail fast from here on
        self._stop.set()
        if self._ready is not None and not self._ready.done():
            task.cancel()  # still handshaking: nothing to wind down gracefully
        _, pending = await asyncio.wait({task}, timeout=CLOSE_GRACE_SECONDS)
        if pending:
            task.cancel()
            await asyncio.wait({task})


class RequestTimeout(Exception):
    """An MCP request outlived the per-request timeout."""


def _describe(exc: BaseException) -> str:
    """One line for logs and error payloads; JSON-RPC errors as `<code>: <message>`."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return f"{exc.code}: {exc.message}"
    if isinstance(exc, RequestTimeout):
        return str(exc)
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

