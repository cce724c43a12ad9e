"""The console's sign-in routes and its session cookie on the admin port (docs/console.md).

POST /console/sign-in (an admin key) and POST /console/sign-in/link (a one-time link) start a
console session: the session service makes its token, which goes into the `bae_console` cookie
(HttpOnly, SameSite=Strict, Path=<prefix>/, Max-Age 12 h, Secure over https), and the answer
carries the session's CSRF token for the page's script. GET /console/session tells a page that
loads whether its cookie still holds a session; POST /console/sign-out ends it.

`ConsoleCookie` lets the admin API take the cookie in place of an Authorization header. The
gateway keeps no state for it: a session's CSRF token is derived from the cookie's value
(bae.common.console), so a mutation's X-CSRF-Token is checked here, and the session itself by the
session service, as it checks an admin key.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.message import Message
from starlette.datastructures import Headers
from starlette.requests import Request, cookie_parser
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from bae.common.console import COOKIE_NAME, MAX_TOKEN_CHARS, SESSION_SECONDS, csrf_matches
from bae.common.errors import BaeError, InvalidInput, TooLarge, Unauthenticated
from bae.common.jsontext import dump
from bae.common.protos import admin_api_pb2, edge_pb2, session_pb2
from bae.services.gateway.body import content_length, read_within
from bae.services.gateway.json_to_proto import Unreadable, read_body
from bae.services.gateway.problems import JSON, error_response, problem_response
from bae.services.gateway.router import Endpoint, MethodTable
from bae.services.gateway.upstream import CONSOLE_SESSION_SCOPE_KEY, Upstream

# A sign-in body is an admin key or a link: a few dozen bytes.
MAX_BODY_BYTES = 4096
CSRF_HEADER = "x-csrf-token"
_SAFE_METHODS = frozenset(("GET", "HEAD"))
CSRF_INVALID = "csrf_token_invalid"
CSRF_DETAIL = (
    "a request authenticated by the console's cookie must carry its session's CSRF token in X-CSRF-Token "
    "(the sign-in answer's csrf_token)"
)
NO_SESSION = "no console session; sign in"


def cookie_of(headers: Headers) -> str | None:
    """The request's `bae_console` cookie, None without one (or with a value too long to be one)."""
    header = headers.get("cookie")
    if header is None:
        return None
    value = cookie_parser(header).get(COOKIE_NAME)
    return value if value and len(value) <= MAX_TOKEN_CHARS else None


def set_cookie(response: Response, value: str, max_age: int, prefix: str, secure: bool) -> None:
    """Written out by hand: Starlette's set_cookie spells SameSite lower-case and orders the attributes its own way."""
    cookie = f"{COOKIE_NAME}={value}; HttpOnly; SameSite=Strict; Path={prefix}/; Max-Age={max_age}"
    response.headers.append("set-cookie", cookie + ("; Secure" if secure else ""))


def _answer(body: dict[str, Any], status: int = 200) -> Response:
    return Response(dump(body), status, {"cache-control": "no-store"}, media_type=JSON)


class SessionCalls:
    """The session service's calls the console's routes make, and the CSRF refusal they share."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream

    async def call(self, rpc: str, request: Message) -> Any:
        """`rpc(request)` on any replica; raises the refusal (a BaeError) instead."""
        timeout = self.upstream.timeout
        try:
            return await self.upstream.call(
                None, lambda stub, metadata: getattr(stub, rpc)(request, timeout=timeout, metadata=metadata)
            )
        except grpc.aio.AioRpcError as error:
            raise self.upstream.failure(error) from None

    async def csrf_refusal(self, token: str) -> Response:
        """The answer to a cookie-authenticated mutation without its CSRF token: 401 when the session
        has ended anyway (authentication comes first), else 403 csrf_token_invalid."""
        credential = edge_pb2.Credential(console_session=token)
        try:
            await self.call("CheckCredential", session_pb2.CredentialCheck(kind=edge_pb2.ADMIN_KEY, credential=credential))
        except BaeError as error:
            return error_response(error)
        return problem_response(403, CSRF_INVALID, CSRF_DETAIL)


class ConsoleCookie:
    """The admin port's app behind it takes the console cookie as its credential: on /admin/ routes,
    for a request without an Authorization header. One whose method is not GET or HEAD must carry
    the session's CSRF token (else 403 csrf_token_invalid)."""

    def __init__(self, app: ASGIApp, upstream: Upstream) -> None:
        self.app = app
        self.calls = SessionCalls(upstream)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/admin/"):
            headers = Headers(scope=scope)
            if "authorization" not in headers and (token := cookie_of(headers)) is not None:
                if scope["method"] not in _SAFE_METHODS and not csrf_matches(token, headers.get(CSRF_HEADER)):
                    response = await self.calls.csrf_refusal(token)
                    await response(scope, receive, send)
                    return
                scope[CONSOLE_SESSION_SCOPE_KEY] = token
        await self.app(scope, receive, send)


async def _body(request: Request) -> bytes:
    """The request's body, at most MAX_BODY_BYTES; TooLarge beyond."""
    too_large = TooLarge(f"request body exceeds the limit of {MAX_BODY_BYTES} bytes")
    declared = content_length(request)
    if declared is not None and declared > MAX_BODY_BYTES:
        raise too_large
    return await read_within(request, MAX_BODY_BYTES, too_large)


async def _read(request: Request, body: Message) -> None:
    try:
        read_body(body, await _body(request), request.headers.get("content-type", ""))
    except Unreadable as failure:
        raise InvalidInput(failure.text) from None


class SignInRoutes:
    def __init__(self, upstream: Upstream, prefix: str) -> None:
        self.calls = SessionCalls(upstream)
        self.prefix = prefix

    def _started(self, request: Request, started: admin_api_pb2.ConsoleSessionStarted) -> Response:
        response = _answer({"csrf_token": started.session.csrf_token, "expires_at": started.session.expires_at})
        set_cookie(response, started.session_token, SESSION_SECONDS, self.prefix, request.url.scheme == "https")
        return response

    def _cleared(self, request: Request, response: Response) -> Response:
        set_cookie(response, "", 0, self.prefix, request.url.scheme == "https")
        return response

    async def sign_in(self, request: Request) -> Response:
        """POST /console/sign-in {"token": "<admin key>"}."""
        sign_in = admin_api_pb2.ConsoleSignInRequest()
        return await self._start(request, "SignInConsole", sign_in, sign_in.body)

    async def sign_in_link(self, request: Request) -> Response:
        """POST /console/sign-in/link {"link": "bcl_..."}."""
        exchange = admin_api_pb2.ExchangeConsoleLinkRequest()
        return await self._start(request, "ExchangeConsoleLink", exchange, exchange.body)

    async def _start(self, request: Request, rpc: str, call: Message, body: Message) -> Response:
        """Read the request's JSON into `body` (part of `call`), then `rpc(call)`: a new console session."""
        try:
            await _read(request, body)
            started = await self.calls.call(rpc, call)
        except BaeError as error:
            return error_response(error)
        return self._started(request, started)

    async def session(self, request: Request) -> Response:
        """GET /console/session: the cookie's session (its CSRF token, its end), else 401 and the cookie cleared."""
        token = cookie_of(request.headers)
        try:
            if token is None:
                raise Unauthenticated(NO_SESSION)
            credential = edge_pb2.Credential(console_session=token)
            session = await self.calls.call("GetConsoleSession", admin_api_pb2.ConsoleSessionRequest(credential=credential))
        except BaeError as error:
            response = error_response(error)
            return self._cleared(request, response) if token is not None and isinstance(error, Unauthenticated) else response
        return _answer({"csrf_token": session.csrf_token, "expires_at": session.expires_at})

    async def sign_out(self, request: Request) -> Response:
        """POST /console/sign-out (X-CSRF-Token): 204, the session ended and the cookie cleared."""
        token = cookie_of(request.headers)
        if token is None:
            return error_response(Unauthenticated(NO_SESSION))
        if not csrf_matches(token, request.headers.get(CSRF_HEADER)):
            return await self.calls.csrf_refusal(token)
        credential = edge_pb2.Credential(console_session=token)
        try:
            await self.calls.call("SignOutConsole", admin_api_pb2.ConsoleSessionRequest(credential=credential))
        except BaeError as error:
            return error_response(error)
        return self._cleared(request, Response(status_code=204, headers={"cache-control": "no-store"}))

    def routes(self) -> list[BaseRoute]:
        table: dict[str, Endpoint] = {
            "/console/sign-in": self.sign_in,
            "/console/sign-in/link": self.sign_in_link,
            "/console/sign-out": self.sign_out,
        }
        routes: list[BaseRoute] = [Route(path, MethodTable(path, {"POST": endpoint})) for path, endpoint in table.items()]
        routes.append(Route("/console/session", MethodTable("/console/session", {"GET": self.session})))
        return routes
