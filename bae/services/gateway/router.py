"""A port's route table on Starlette's Router, with RFC 7807 404/405 (SERVER-SPEC §17 O-6).

Each path is one Route that takes every method and hands the request to the
path's own method table: Starlette's 404 and 405 are plain text, and its
Allow header would name HEAD and come in set order. No middleware stack:
the gateway sits on every request's latency path.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable, Sequence

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, Router
from starlette.types import Receive, Scope, Send

from bae.common.errors import Internal, NotFound, echo
from bae.services.gateway.problems import error_response, problem_response

log = logging.getLogger("bae.gateway")

Endpoint = Callable[[Request], Awaitable[Response]]


class MethodTable:
    """The ASGI app of one path: the endpoint for the request's method, else a 405 problem."""

    def __init__(self, route: str, endpoints: dict[str, Endpoint]) -> None:
        self.route = route  # the path template, for access lines and span names
        self.allow = ", ".join(sorted(endpoints))
        self.endpoints = dict(endpoints)
        if "GET" in endpoints:
            # uvicorn leaves the body out of a HEAD response.
            self.endpoints["HEAD"] = endpoints["GET"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        endpoint = self.endpoints.get(method)
        if endpoint is None:
            detail = f"method {echo(method)} is not allowed on {echo(scope['path'])}; allowed: {self.allow}"
            response = problem_response(405, "method_not_allowed", detail, {"allow": self.allow})
        else:
            try:
                response = await endpoint(Request(scope, receive))
            except ClientDisconnect:
                return  # gone before its request body arrived: nobody to answer
            except Exception:
                # A bug in the gateway: log it, never show the stack trace to the client.
                log.exception("unhandled error on %s %s", method, scope["path"])
                response = error_response(Internal("internal server error"))
        await response(scope, receive, send)


async def no_route(scope: Scope, receive: Receive, send: Send) -> None:
    response = error_response(NotFound(f"no route for {echo(scope['method'])} {echo(scope['path'])}"))
    await response(scope, receive, send)


def build_router(table: dict[str, dict[str, Endpoint]], more: Sequence[BaseRoute] = ()) -> Router:
    """An ASGI app serving {path template: {method: endpoint}}; `{id}` matches one non-empty segment.
    A literal path is tried before the templates (`/admin/v1/sessions/import` before `/admin/v1/sessions/{id}`);
    otherwise the table's order is kept. `more` (the console's routes) is tried last."""
    ordered = sorted(table.items(), key=lambda item: "{" in item[0])
    return Router(
        [*(Route(path, MethodTable(path, endpoints)) for path, endpoints in ordered), *more],
        redirect_slashes=False,  # a path is a route or a 404, never a redirect
        default=no_route,
    )
