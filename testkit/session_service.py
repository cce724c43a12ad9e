"""One session service process on its own, and its REST handlers called over real gRPC as the gateway calls them:
each request built from JSON by the gateway's own translation, each reply written back as the gateway writes it."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from bae.common import error_codes
from bae.common.grpcutil import channel
from bae.common.protos import edge_pb2, session_pb2, session_pb2_grpc
from bae.services.gateway.declaration import ROUTES
from bae.services.gateway.json_to_proto import Unreadable, read_body
from bae.services.gateway.problems import status_of
from bae.services.gateway.proto_to_json import to_json
from testkit.processes import TEST_PLANE, ServiceProcess
from testkit.stack import TEST_LIMITS, stack_env

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
CONFIG += TEST_LIMITS


class Refused(Exception):
    """What a refused call answers over HTTP: its status, problem type, detail and Retry-After."""

    def __init__(self, status: int, type: str, detail: str, retry_after: int | None = None) -> None:
        super().__init__(f"{status} {type}: {detail}")
        self.status, self.type, self.detail, self.retry_after = status, type, detail, retry_after


ROUTES_BY_RPC = {route.rpc: route for route in ROUTES}


class Service:
    """One session service process and a channel to it."""

    def __init__(self, tmp: Path, args: list[str] = (), **env: str) -> None:
        config = tmp / "bae-config.toml"
        if not config.exists():
            config.write_text(CONFIG)
        self.env = stack_env(tmp, BAE_CONFIG=str(config), **env)
        self.process = ServiceProcess("bae.services.session", "serve", *args, env=self.env, log_path=tmp / "session.log")
        self.process.wait_grpc_serving(self.env["BAE_SESSION_GRPC_ADDR"])
        self.channel = channel(self.env["BAE_SESSION_GRPC_ADDR"], TEST_PLANE)
        self.stub = session_pb2_grpc.SessionServiceStub(self.channel)
        key_file = Path(self.env["BAE_ADMIN_KEY_FILE"])
        self.admin_key = key_file.read_text().strip() if key_file.exists() else ""

    async def call(self, method: str, *, key: str | None = None, path_id: str = "", body=None,
                   query: dict | None = None, content_type: str = "application/json",
                   authorization: str | None = None) -> dict | str:
        """The reply's JSON (parsed; "" for 204), or raises Refused with what the call failed with.
        `authorization` is a whole Authorization header, in place of `key`'s."""
        route = ROUTES_BY_RPC[method]
        request = route.request()
        if authorization is None and key is not None:
            authorization = f"Bearer {key}"
        credential = edge_pb2.Credential(authorization=authorization or "", present=authorization is not None)
        getattr(request, route.credential_field).CopyFrom(credential)
        if route.id_field:
            setattr(request, route.id_field, path_id)
        for name, value in (query or {}).items():
            setattr(request, name, value)
        if route.body_field:
            raw = body if isinstance(body, bytes) else (b"" if body is None else json.dumps(body).encode())
            try:
                read_body(getattr(request, route.body_field), raw, content_type)
            except Unreadable as failure:
                # As the gateway does: the credential first.
                check = session_pb2.CredentialCheck(kind=route.credential, credential=credential, session_id=path_id)
                await self._answer(self.stub.CheckCredential(check, timeout=10))
                raise Refused(400, "bad_request", failure.text) from None
        if route.streaming:
            reply = await self._answer(_whole_page(getattr(self.stub, method)(request, timeout=10)))
        else:
            reply = await self._answer(getattr(self.stub, method)(request, timeout=10))
        return "" if route.status == 204 else json.loads(to_json(reply))

    @staticmethod
    async def _answer(call):
        try:
            return await call
        except grpc.aio.AioRpcError as error:
            raised = error_codes.raised_by(error)
            if raised is None:
                raise
            raise Refused(status_of(raised), raised.reason, raised.detail, raised.retry_after) from None

    async def admin(self, method: str, **kwargs):
        return await self.call(method, key=self.admin_key, **kwargs)

    async def stop(self) -> int:
        await self.channel.close()
        return self.process.stop(timeout=15)


async def _whole_page(call):
    """A page of events read to its end: its last item's payload pieces appended (session.proto, ListEvents)."""
    page = None
    async for message in call:
        if page is None:
            page = message
        else:
            page.items[-1].payload.json += message.items[0].payload.json
    return page


async def problem_of(awaitable) -> Refused:
    """What `awaitable` is refused with (the test fails if it succeeds)."""
    with pytest.raises(Refused) as caught:
        await awaitable
    return caught.value


def profile_body(name: str, **fields) -> dict:
    """A CreateProfile body on the provider `mock` of CONFIG."""
    return {"name": name, "primary_provider": "mock", **fields}
