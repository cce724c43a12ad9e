"""The console's files, served with the headers every console answer carries."""

from __future__ import annotations

import html
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

from bae.common.errors import echo
from bae.services.gateway.problems import problem_response

STATIC = Path(__file__).parent / "static"

# Only the server's own files run, style and connect; no inline script, no frames, no plugins.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


def with_security_headers(message: Message) -> Message:
    if message["type"] == "http.response.start":
        message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
    return message


class Assets:
    """`/console/static/...`: the files under static/, revalidated on each load (no-cache), so a
    server upgrade is seen at once."""

    def __init__(self) -> None:
        self._files = StaticFiles(directory=STATIC)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"cache-control", b"no-cache")]
            await send(with_security_headers(message))

        try:
            await self._files(scope, receive, send_with_headers)
        except HTTPException as exc:  # StaticFiles' 404 and 405, answered in the API's problem shape
            path = echo(scope["path"])
            if exc.status_code == 404:
                response = problem_response(404, "not_found", f"no console file {path}")
            else:
                response = problem_response(
                    405, "method_not_allowed", f"{echo(scope['method'])} is not allowed on {path}"
                )
            await response(scope, receive, send)


class Shell:
    """`/console/`: the one HTML page; the scripts route within it (`#/sessions`, ...). The prefix
    a proxy serves the admin port under goes into the base URL and a meta tag the scripts read."""

    def __init__(self, prefix: str) -> None:
        page = (STATIC / "index.html").read_text(encoding="utf-8")
        self._page = page.replace("{{prefix}}", html.escape(prefix, quote=True))

    async def page(self, request: Request) -> Response:
        response = Response(self._page, media_type="text/html; charset=utf-8")
        response.headers["cache-control"] = "no-cache"
        for name, value in SECURITY_HEADERS:
            response.headers[name.decode()] = value.decode()
        return response
