"""The bare ASGI plumbing the gateway needs: request fields in, one response out.

Plain ASGI instead of a framework keeps the per-request cost to a few
function calls (the gateway sits on every request's latency path).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable
from urllib.parse import parse_qsl

from bae.errors import Problem

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = b"application/json"
NDJSON = b"application/x-ndjson"


class Request:
    """One HTTP request as the handlers see it."""

    __slots__ = ("scope", "receive", "path_id")

    def __init__(self, scope: Scope, receive: Receive, path_id: str) -> None:
        self.scope = scope
        self.receive = receive
        # The `{id}` path segment ("" on routes without one).
        self.path_id = path_id

    def header(self, name: bytes) -> str | None:
        """The first value of a header (lowercase name), byte-for-byte as latin-1 text."""
        for key, value in self.scope["headers"]:
            if key == name:
                return value.decode("latin-1")
        return None

    def query(self) -> dict[str, str]:
        raw = self.scope["query_string"]
        if not raw:
            return {}
        return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))

    async def body(self) -> bytes:
        chunks = []
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def disconnected(self) -> None:
        """Returns once the client has gone away (call only after the body was read)."""
        while (await self.receive())["type"] != "http.disconnect":
            pass


async def start(send: Send, status: int, content_type: bytes | None, extra: list | None = None) -> None:
    headers = [(b"content-type", content_type)] if content_type else []
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes | None = JSON,
    extra: list | None = None,
) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await start(send, status, content_type, headers)
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def respond_problem(send: Send, problem: Problem, extra: list | None = None) -> None:
    # The spec shows RFC 7807 bodies as application/json, not application/problem+json.
    await respond(send, problem.status, problem.to_json().encode(), JSON, extra)


async def write(send: Send, chunk: bytes) -> None:
    """One body chunk of a streaming response, sent to the socket at once."""
    await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def finish(send: Send) -> None:
    await send({"type": "http.response.body", "body": b"", "more_body": False})
