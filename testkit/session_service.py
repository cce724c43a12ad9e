"""One session service process on its own, and its REST handlers called over real gRPC as the gateway calls them."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from bae.common.errors import Problem
from bae.common.grpcutil import channel
from bae.common.protos import session_pb2, session_pb2_grpc
from testkit.processes import TEST_PLANE, ServiceProcess
from testkit.stack import stack_env

CONFIG = """
[[providers.entries]]
name = "mock"
provider = "anthropic"
model = "claude-test"
auth_token = "sk-secret"

[[mcp.servers]]
name = "zeta"
transport = "sse"
url = "http://127.0.0.1:1/sse"
headers = { Authorization = "Bearer x" }

[[mcp.servers]]
name = "alpha"
transport = "stdio"
command = "true"
"""


class Service:
    """One session service process and a channel to it."""

    def __init__(self, tmp: Path, args: list[str] = (), **env: str) -> None:
        config = tmp / "bae-config.toml"
        if not config.exists():
            config.write_text(CONFIG)
        self.env = stack_env(tmp, BAE_CONFIG=str(config), **env)
        self.process = ServiceProcess("services.session", "serve", *args, env=self.env, log_path=tmp / "session.log")
        self.process.wait_grpc_serving(self.env["BAE_SESSION_GRPC_ADDR"])
        self.channel = channel(self.env["BAE_SESSION_GRPC_ADDR"], TEST_PLANE)
        self.stub = session_pb2_grpc.SessionServiceStub(self.channel)
        key_file = Path(self.env["BAE_ADMIN_KEY_FILE"])
        self.admin_key = key_file.read_text().strip() if key_file.exists() else ""

    async def call(self, method: str, *, key: str | None = None, path_id: str = "", body=None,
                   query: dict | None = None, content_type: str = "application/json") -> dict | str:
        """The reply's JSON (parsed; "" for 204), or raises the Problem it failed with."""
        raw = body if isinstance(body, bytes) else (b"" if body is None else json.dumps(body).encode())
        request = session_pb2.RestRequest(
            authorization=f"Bearer {key}" if key is not None else "",
            has_authorization=key is not None,
            path_id=path_id,
            body=raw,
            content_type=content_type,
            query=query or {},
        )
        try:
            reply = await getattr(self.stub, method)(request, timeout=10)
        except grpc.aio.AioRpcError as error:
            problem = Problem.from_rpc_error(error)
            if problem is None:
                raise
            raise problem from None
        return json.loads(reply.json) if reply.json else ""

    async def admin(self, method: str, **kwargs):
        return await self.call(method, key=self.admin_key, **kwargs)

    async def stop(self) -> int:
        await self.channel.close()
        return self.process.stop(timeout=15)


async def problem_of(awaitable) -> Problem:
    """The Problem `awaitable` fails with (the test fails if it succeeds)."""
    with pytest.raises(Problem) as caught:
        await awaitable
    return caught.value


def profile_body(name: str, **fields) -> dict:
    """A CreateProfile body on the provider `mock` of CONFIG."""
    return {"name": name, "primary_provider": "mock", **fields}
