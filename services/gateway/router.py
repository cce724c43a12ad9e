"""Path + method dispatch for one port, with RFC 7807 404/405 (SERVER-SPEC §17 O-6)."""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from bae.errors import Problem, internal, not_found
from services.gateway.http import Receive, Request, Scope, Send, respond_problem

log = logging.getLogger("bae.gateway")

Handler = Callable[[Request, Send], Awaitable[None]]

# The one placeholder a route template may hold; its value becomes Request.path_id.
ID = "{id}"


class Router:
    """An ASGI app serving a fixed table of routes: {template: {method: handler}}."""

    def __init__(self, routes: dict[str, dict[str, Handler]]) -> None:
        self._static: dict[str, dict[str, Handler]] = {}
        # Templates with an `{id}` segment, grouped by segment count.
        self._dynamic: dict[int, list[tuple[list[str], dict[str, Handler]]]] = {}
        for template, methods in routes.items():
            if ID in template:
                segments = template.split("/")
                self._dynamic.setdefault(len(segments), []).append((segments, methods))
            else:
                self._static[template] = methods

    def match(self, path: str) -> tuple[dict[str, Handler], str] | None:
        methods = self._static.get(path)
        if methods is not None:
            return methods, ""
        segments = path.split("/")
        for template, methods in self._dynamic.get(len(segments), ()):
            path_id = ""
            for expected, actual in zip(template, segments):
                if expected == ID:
                    if not actual:
                        break
                    path_id = actual
                elif expected != actual:
                    break
            else:
                return methods, path_id
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off and websockets are disabled; nothing else arrives
        method = scope["method"]
        path = scope["path"]
        matched = self.match(path)
        if matched is None:
            await respond_problem(send, not_found(f"no route for {method} {path}"))
            return
        methods, path_id = matched
        handler = methods.get("GET" if method == "HEAD" else method)
        if handler is None:
            allow = ", ".join(sorted(methods))
            await respond_problem(
                send,
                Problem(405, "method_not_allowed", f"method {method} is not allowed on {path}; allowed: {allow}"),
                [(b"allow", allow.encode())],
            )
            return
        started = False

        async def tracked_send(message: dict) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await handler(Request(scope, receive, path_id), tracked_send)
        except Exception:
            # A bug in the gateway: log it, never show the stack trace to the client.
            log.exception("unhandled error on %s %s", method, path)
            if not started:
                await respond_problem(send, internal())
            else:
                raise
