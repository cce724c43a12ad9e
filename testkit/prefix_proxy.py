"""A reverse proxy that serves the admin port under a path prefix, as an operator's proxy would.

`/bae/console/` on the proxy is `/console/` on the admin port: the prefix is stripped on the way in
and nothing is rewritten on the way out, so only BAE_CONSOLE_PREFIX makes the console's links,
requests and cookie path come back through the proxy. Responses are streamed (the event stream
passes through as it is written). Requests outside the prefix are 404 here, so a console that
forgot the prefix fails its test.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, Router

from testkit.ports import free_port

# Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus those httpx sets itself.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "host", "content-length"}


def proxy_app(prefix: str, upstream: str) -> Router:
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(60, read=None))

    async def forward(request: Request) -> Response:
        path = request.url.path
        if not path.startswith(f"{prefix}/"):
            return PlainTextResponse(f"the proxy serves only {prefix}/", status_code=404)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        outgoing = client.build_request(
            request.method, path.removeprefix(prefix), params=request.url.query, headers=headers,
            content=await request.body(),
        )
        answer = await client.send(outgoing, stream=True)

        async def body() -> AsyncIterator[bytes]:
            async for chunk in answer.aiter_raw():
                yield chunk

        response = StreamingResponse(body(), status_code=answer.status_code, background=BackgroundTask(answer.aclose))
        # Raw, so that repeated headers (Set-Cookie) pass as they came.
        response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.multi_items()
                                if k.lower() not in HOP_BY_HOP]
        return response

    return Router([Route("/{path:path}", forward, methods=["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"])])


@contextmanager
def prefix_proxy(prefix: str, upstream: str) -> Iterator[str]:
    """Serve `upstream` (an origin, e.g. the admin port's) under `prefix` on a loopback port; yields the
    proxy's origin."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(proxy_app(prefix, upstream), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"the prefix proxy could not start on port {port}")
            threading.Event().wait(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
