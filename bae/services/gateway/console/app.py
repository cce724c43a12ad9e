"""The console's routes on the admin port, mounted at /console."""

from __future__ import annotations

from starlette.responses import RedirectResponse, Response
from starlette.requests import Request
from starlette.routing import BaseRoute, Mount, Route

from bae.services.gateway.console.assets import Assets, Shell
from bae.services.gateway.console.session import SignInRoutes
from bae.services.gateway.upstream import Upstream


def console_routes(prefix: str, upstream: Upstream) -> list[BaseRoute]:
    shell = Shell(prefix)

    async def to_shell(request: Request) -> Response:
        return RedirectResponse(f"{prefix}/console/", status_code=308)

    return [
        Route("/console", to_shell),
        Route("/console/", shell.page),
        *SignInRoutes(upstream, prefix).routes(),
        Mount("/console/static", app=Assets()),
    ]
