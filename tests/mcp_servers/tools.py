"""A real MCP server for tests, built on the mcp SDK's MCPServer.

    python tests/mcp_servers/tools.py stdio [--prefix P]
    python tests/mcp_servers/tools.py http --port N [--prefix P]   # streamable HTTP at /mcp

Tools (each name prefixed with P, default none):
- echo(text): returns text
- fail(message): a tool error, so the result has isError true
- sleep(seconds): sleeps, then returns "slept"
- request_header(name): the value of an HTTP request header ("" over stdio or when absent)
- argv(): the server's command-line arguments after the script path, space-joined
- handshake(): JSON of the client's initialize params (as sent, camelCase)
- environment(): JSON of the server's environment variables
- output(size): `size` bytes of text, the digits 0-9 over and over
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def build_server(prefix: str) -> MCPServer:
    server = MCPServer(name="bae-test-tools", version="1.0.0", log_level="WARNING")

    @server.tool(name=f"{prefix}echo", description="Return the given text unchanged.")
    def echo(text: str) -> str:
        return text

    @server.tool(name=f"{prefix}fail", description="Always fail with the given message.")
    def fail(message: str = "tool failed on purpose") -> str:
        raise ToolError(message)

    @server.tool(name=f"{prefix}sleep", description="Sleep for the given number of seconds.")
    async def sleep(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "slept"

    @server.tool(name=f"{prefix}request_header", description="Read one HTTP request header.")
    def request_header(name: str, ctx: Context) -> str:
        request = ctx.request_context.request
        headers = getattr(request, "headers", None)
        return headers.get(name, "") if headers is not None else ""

    @server.tool(name=f"{prefix}argv", description="The server's command-line arguments.")
    def argv() -> str:
        return " ".join(sys.argv[1:])

    @server.tool(name=f"{prefix}handshake", description="The client's initialize params.")
    def handshake(ctx: Context) -> str:
        params = ctx.request_context.session.client_params
        return json.dumps(params.model_dump(by_alias=True, mode="json", exclude_none=True) if params else None)

    @server.tool(name=f"{prefix}environment", description="The server's environment variables.")
    def environment() -> str:
        return json.dumps(dict(os.environ))

    @server.tool(name=f"{prefix}output", description="Return this many bytes of text.")
    def output(size: int) -> str:
        return digits(size)

    return server


def digits(size: int) -> str:
    return ("0123456789" * (size // 10 + 1))[:size]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--prefix", default="")
    parser.add_argument("--label", default="", help="ignored; lets tests pass resolved ${ENV} args")
    options = parser.parse_args()
    server = build_server(options.prefix)
    if options.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=options.port)


if __name__ == "__main__":
    main()
