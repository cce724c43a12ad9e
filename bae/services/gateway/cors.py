"""CORS on the client port (BAE_CORS_ORIGINS), so that pages on the listed origins call the client API.

Starlette's CORSMiddleware does the work. It wraps the whole client app, the rate limit included, so
that every answer the app writes (a 401, 413 or 429 problem, an NDJSON or event stream) carries the
headers a browser needs before it lets the page read it. Credentials mode stays off: keys travel in
the Authorization header, never in cookies, so `*` is answered as `*`. The admin port is never
wrapped: its token must never be usable from a web page's script.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.routing import Route, Router
from starlette.types import ASGIApp

from bae.common.errors import InvalidInput
from bae.services.gateway.problems import error_response
from bae.services.gateway.router import MethodTable

# Request headers a page may set: the credential, the JSON body's type, the SSE resume point, the
# request id the gateway echoes (observe.py).
ALLOWED_HEADERS = ("Authorization", "Content-Type", "Last-Event-ID", "X-Request-Id")
# Response headers a page may read besides the CORS-safelisted ones: what a refused request says
# about when to retry (rate_limit.py, problems.py), and the request id to quote in a report.
EXPOSED_HEADERS = ("RateLimit", "RateLimit-Policy", "Retry-After", "X-Request-Id")
# Seconds a browser may keep a preflight's answer (Starlette's default, said here for the docs).
MAX_AGE = 600


class Cors(CORSMiddleware):
    """CORSMiddleware whose refused preflight is a problem like every other error of the gateway
    (Starlette answers it in plain text)."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        refused = bytes(response.body).decode().removeprefix("Disallowed CORS ")
        problem = error_response(InvalidInput(f"CORS preflight refused: {refused} not allowed"))
        problem.headers.update({
            name: value for name, value in response.headers.items()
            if name.startswith("access-control-") or name == "vary"
        })
        return problem


def served_methods(router: Router) -> list[str]:
    """The methods `router`'s routes answer (build_router's method tables)."""
    return sorted({
        method
        for route in router.routes
        if isinstance(route, Route) and isinstance(route.app, MethodTable)
        for method in route.app.endpoints
    })


def with_cors(router: Router, app: ASGIApp, origins: tuple[str, ...]) -> ASGIApp:
    """`app` (the client port's `router`, with what wraps it) answering CORS for `origins`; unchanged
    when there are none."""
    if not origins:
        return app
    return Cors(
        app,
        allow_origins=origins,
        allow_methods=served_methods(router),
        allow_headers=ALLOWED_HEADERS,
        expose_headers=EXPOSED_HEADERS,
        max_age=MAX_AGE,
    )
