"""The console's cookie and CSRF check in the gateway (bae/services/gateway/console/session.py), against a
stand-in for the session service: the cookie's attributes (Secure over https, the prefix in its Path) and
what the admin port's cookie filter lets through."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import Message
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from bae.common.console import csrf_token
from bae.common.protos import admin_api_pb2
from bae.services.gateway.console.session import ConsoleCookie, SignInRoutes
from bae.services.gateway.upstream import credential_of

pytestmark = pytest.mark.unit

TOKEN = "bcs_" + "ab" * 24
STARTED = admin_api_pb2.ConsoleSessionStarted(
    session_token=TOKEN,
    session=admin_api_pb2.ConsoleSession(csrf_token=csrf_token(TOKEN), expires_at="2026-07-08T00:00:00.000Z"),
)


class Stub:
    """Answers every call of the session service with `STARTED` (or an empty reply), recording the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Message]] = []

    def __getattr__(self, rpc: str) -> Any:
        async def call(request: Message, **_: Any) -> Message:
            self.calls.append((rpc, request))
            return STARTED if rpc == "SignInConsole" else admin_api_pb2.NoContent()

        return call


class FakeUpstream:
    timeout = 5.0

    def __init__(self) -> None:
        self.stub = Stub()

    async def call(self, session_id: str | None, invoke: Any) -> Any:
        return await invoke(self.stub, ())


def cookie_header(response: Any) -> str:
    [header] = response.headers.get_list("set-cookie")
    return header


@pytest.mark.parametrize(("base_url", "prefix", "expected"), [
    ("http://admin", "", "bae_console=" + TOKEN + "; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200"),
    ("https://admin", "", "bae_console=" + TOKEN + "; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200; Secure"),
    ("https://admin", "/ops/bae", "bae_console=" + TOKEN + "; HttpOnly; SameSite=Strict; Path=/ops/bae/; Max-Age=43200; Secure"),
])
def test_the_cookie_of_a_sign_in(base_url, prefix, expected):
    upstream = FakeUpstream()
    app = Starlette(routes=SignInRoutes(upstream, prefix).routes())  # type: ignore[arg-type]
    with TestClient(app, base_url=base_url) as client:
        response = client.post("/console/sign-in", json={"token": "bae_admin_x"})
        assert response.status_code == 200
        assert cookie_header(response) == expected
        assert response.json() == {"csrf_token": csrf_token(TOKEN), "expires_at": "2026-07-08T00:00:00.000Z"}
        [(rpc, request)] = upstream.stub.calls
        assert rpc == "SignInConsole" and request.body.token == "bae_admin_x"  # type: ignore[attr-defined]
        out = client.post("/console/sign-out", headers={"cookie": f"bae_console={TOKEN}",
                                                        "x-csrf-token": csrf_token(TOKEN)})
        assert out.status_code == 204
        assert cookie_header(out) == expected.replace(TOKEN, "").replace("Max-Age=43200", "Max-Age=0")


def test_the_cookie_filter_hands_the_cookie_on_once_the_csrf_token_matches():
    seen: list[str] = []

    async def endpoint(request: Request) -> JSONResponse:
        seen.append(credential_of(request).console_session)
        return JSONResponse({})

    inner = Starlette(routes=[Route("/admin/v1/things", endpoint, methods=["GET", "POST"]),
                              Route("/other", endpoint, methods=["GET", "POST"])])
    upstream = FakeUpstream()
    with TestClient(ConsoleCookie(inner, upstream)) as client:  # type: ignore[arg-type]
        cookie = {"cookie": f"bae_console={TOKEN}"}
        assert client.get("/admin/v1/things", headers=cookie).status_code == 200
        refused = client.post("/admin/v1/things", headers=cookie)
        assert refused.status_code == 403 and refused.json()["type"] == "csrf_token_invalid"
        assert upstream.stub.calls[-1][0] == "CheckCredential"  # the session was alive: 403, not 401
        assert client.post("/admin/v1/things", headers={**cookie, "x-csrf-token": "x"}).status_code == 403
        assert client.post("/admin/v1/things", headers={**cookie, "x-csrf-token": csrf_token(TOKEN)}).status_code == 200
        # An Authorization header wins: the cookie is not passed on, and no CSRF token is asked for.
        assert client.post("/admin/v1/things", headers={**cookie, "authorization": "Bearer k"}).status_code == 200
        # Only the admin API's paths take it.
        assert client.get("/other", headers=cookie).status_code == 200
        assert client.get("/admin/v1/things", headers={"cookie": "bae_console=" + "x" * 300}).status_code == 200
    assert seen == [TOKEN, TOKEN, "", "", ""]
