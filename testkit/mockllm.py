"""A scripted mock LLM: Anthropic Messages and OpenAI Chat Completions over real HTTP.

Tests script replies in order; each reply is rendered in the wire format of the
path it is served on, so one script drives either provider kind (or a
fallback chain that mixes them):

    with MockLLM() as llm:
        llm.enqueue(Reply.error(500, "boom"))
        llm.enqueue(Reply.tool_use([("tu_1", "get_weather", {"city": "Paris"})]))
        ...  # point a provider entry's base_url at llm.base_url
        assert llm.requests[0]["headers"]["x-api-key"] == "sk-test"

With an empty queue it answers the text "ok", so load tests need no scripting.
Standalone (benchmarks): `python -m testkit.mockllm --port 9100`.

It is a raw ASGI app under uvicorn in a background thread: asyncio serves
concurrent requests without a thread per request.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import uvicorn

ANTHROPIC_PATH = "/v1/messages"
OPENAI_PATH = "/v1/chat/completions"
DEFAULT_USAGE = (10, 5)


@dataclass(frozen=True)
class Reply:
    """One scripted answer; build it with the class methods below."""

    kind: str  # "text" | "tool_use" | "error" | "raw" | "hang" | "truncated"
    # (not `text`: that name is the constructor Reply.text)
    reply_text: str = ""
    tool_uses: tuple[tuple[str, str, Any], ...] = ()
    # (input, output) or (input, output, cache read, cache creation), as Anthropic counts them:
    # `input` is the part of the prompt neither read from nor written to the cache.
    usage: tuple[int, ...] | None = DEFAULT_USAGE
    status: int = 200
    body: Any = None
    seconds: float = 0.0
    # Response headers beyond content-type and content-length, e.g. (("retry-after", "1"),).
    headers: tuple[tuple[str, str], ...] = ()
    # Set for a held reply: it is sent only once this is set (see `held`).
    release: threading.Event | None = None

    @classmethod
    def text(cls, text: str, usage: tuple[int, int] | None = DEFAULT_USAGE) -> "Reply":
        return cls("text", reply_text=text, usage=usage)

    @classmethod
    def tool_use(
        cls,
        calls: list[tuple[str, str, Any]],
        text: str = "",
        usage: tuple[int, int] | None = DEFAULT_USAGE,
    ) -> "Reply":
        """calls: [(tool_use_id, tool_name, input_object), ...]; `text` precedes them."""
        return cls("tool_use", reply_text=text, tool_uses=tuple(calls), usage=usage)

    @classmethod
    def error(cls, status: int, body_text: str, headers: dict[str, str] | None = None) -> "Reply":
        """`headers`: e.g. {"retry-after": "1"} on a 429."""
        return cls("error", status=status, body=body_text, headers=tuple((headers or {}).items()))

    @classmethod
    def raw(cls, json_body: Any, status: int = 200) -> "Reply":
        """Sent as-is (JSON-encoded) whatever the path."""
        return cls("raw", status=status, body=json_body)

    @classmethod
    def hang(cls, seconds: float) -> "Reply":
        """Answer "ok" only after `seconds` (exercises per-attempt timeouts)."""
        return cls("hang", reply_text="ok", seconds=seconds)

    @classmethod
    def held(cls, release: threading.Event, then: "Reply | None" = None) -> "Reply":
        """Answer `then` (default "ok") only once `release` is set: a provider call in flight for as
        long as the test needs, with no timing to guess. A client that closes the connection
        before then gets nothing, and the request is listed in `aborted`."""
        return replace(then or cls.text("ok"), release=release)

    @classmethod
    def truncated(cls, text: str, usage: tuple[int, int] | None = DEFAULT_USAGE) -> "Reply":
        """Cut off by the output budget: stop_reason max_tokens / finish_reason length."""
        return cls("truncated", reply_text=text, usage=usage)


DEFAULT_REPLY = Reply.text("ok")


def render_anthropic(reply: Reply, model: str, serial: int) -> dict:
    content: list[dict] = []
    if reply.reply_text:
        content.append({"type": "text", "text": reply.reply_text})
    for tool_use_id, name, tool_input in reply.tool_uses:
        content.append({"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input})
    stop_reason = {"tool_use": "tool_use", "truncated": "max_tokens"}.get(reply.kind, "end_turn")
    body: dict = {
        "id": f"msg_mock_{serial}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
    }
    if reply.usage is not None:
        body["usage"] = {"input_tokens": reply.usage[0], "output_tokens": reply.usage[1]}
        if len(reply.usage) == 4:
            body["usage"].update(cache_read_input_tokens=reply.usage[2], cache_creation_input_tokens=reply.usage[3])
    return body


def render_openai(reply: Reply, model: str, serial: int) -> dict:
    message: dict = {"role": "assistant", "content": reply.reply_text or None}
    if reply.tool_uses:
        message["tool_calls"] = [
            {
                "id": tool_use_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(tool_input)},
            }
            for tool_use_id, name, tool_input in reply.tool_uses
        ]
    finish_reason = {"tool_use": "tool_calls", "truncated": "length"}.get(reply.kind, "stop")
    body: dict = {
        "id": f"chatcmpl-mock-{serial}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if reply.usage is not None:
        fresh, completion, cache_read, cache_creation = (*reply.usage, 0, 0)[:4]
        prompt = fresh + cache_read + cache_creation  # OpenAI's prompt count includes the cached part
        body["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if len(reply.usage) == 4:
            body["usage"]["prompt_tokens_details"] = {"cached_tokens": cache_read}
    return body


@dataclass
class MockLLM:
    """The mock server; `start()`/`stop()` or use it as a context manager."""

    host: str = "127.0.0.1"
    port: int = 0
    requests: list[dict] = field(default_factory=list)
    # Off when nothing reads them (the mock served on its own, as the benchmarks run it): a long
    # benchmark would otherwise keep every request body, and the collector's pauses over them
    # would show in its figures.
    keep_requests: bool = True

    def __post_init__(self) -> None:
        self._queue: deque[Reply] = deque()
        # The requests of held replies whose client closed the connection before the release
        # (never answered): a provider call aborted by its caller.
        self.aborted: list[dict] = []
        self._serial = itertools.count(1)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # -- scripting ----------------------------------------------------------

    def enqueue(self, *replies: Reply) -> None:
        self._queue.extend(replies)

    def reset(self) -> None:
        """Forget scripted replies and received requests (a server shared by several tests)."""
        self._queue.clear()
        self.requests.clear()
        self.aborted.clear()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> "MockLLM":
        sock = self._listen()
        self._server = uvicorn.Server(self._config())
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="mockllm", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("mock LLM failed to start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = None
        self._thread = None

    def __enter__(self) -> "MockLLM":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Foreground mode for the standalone script."""
        uvicorn.Server(self._config()).run(sockets=[self._listen()])

    def _listen(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit this. uvicorn writes a response's head and
        # body separately; with Nagle on, the body waits ~40 ms for a delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.host, self.port))
        sock.listen(1024)
        self.port = sock.getsockname()[1]
        return sock

    def _config(self) -> uvicorn.Config:
        return uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            interface="asgi3",
            # a hanging reply must not hold up the test's teardown
            timeout_graceful_shutdown=1,
        )

    # -- the ASGI app -------------------------------------------------------

    async def app(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return
        raw = await read_body(receive)
        path = scope["path"]
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        headers = {key.decode().lower(): value.decode() for key, value in scope["headers"]}
        request = {"path": path, "headers": headers, "body": body, "received": time.monotonic()}
        if self.keep_requests:
            # Runs on the server thread; a list append is atomic, so readers need no lock.
            self.requests.append(request)

        if scope["method"] != "POST" or path not in (ANTHROPIC_PATH, OPENAI_PATH):
            await respond(send, 404, b'{"error":"not found"}')
            return
        reply = self._queue.popleft() if self._queue else DEFAULT_REPLY
        status, payload = self._render(reply, path, body)
        if reply.seconds:
            await asyncio.sleep(reply.seconds)
        if reply.release is not None and not await released(reply.release, receive):
            self.aborted.append(request)
            return
        await respond(send, status, payload, reply.headers)

    def _render(self, reply: Reply, path: str, body: Any) -> tuple[int, bytes]:
        if reply.kind == "error":
            return reply.status, str(reply.body).encode()
        if reply.kind == "raw":
            return reply.status, json.dumps(reply.body).encode()
        model = body.get("model", "mock-model") if isinstance(body, dict) else "mock-model"
        render = render_anthropic if path == ANTHROPIC_PATH else render_openai
        return 200, json.dumps(render(reply, model, next(self._serial))).encode()


async def read_body(receive) -> bytes:
    """The whole request body of an ASGI HTTP request."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def released(release: threading.Event, receive) -> bool:
    """Wait for `release` (at most 120 s); False when the client closed the connection first."""
    waiting = asyncio.ensure_future(asyncio.to_thread(release.wait, 120))
    gone = asyncio.ensure_future(disconnected(receive))
    done, _ = await asyncio.wait((waiting, gone), return_when=asyncio.FIRST_COMPLETED)
    if gone in done:
        return False  # the thread waits on until the test releases it
    gone.cancel()
    return True


async def disconnected(receive) -> None:
    """Returns once the client has closed the connection (the request's body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def respond(send, status: int, payload: bytes, headers: tuple[tuple[str, str], ...] = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *((name.encode(), value.encode()) for name, value in headers),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def serve_from_command_line(
    mock_class: type[MockLLM], name: str, default_host: str, *, keep_requests: bool = True
) -> None:
    """`--host`/`--port` from the command line, then serve `mock_class` in the foreground."""
    parser = argparse.ArgumentParser(description=f"Serve the {name}.")
    parser.add_argument("--host", default=default_host)
    parser.add_argument("--port", type=int, default=9100)
    args = parser.parse_args()
    print(f"{name} listening on http://{args.host}:{args.port}", flush=True)
    mock_class(host=args.host, port=args.port, keep_requests=keep_requests).serve_forever()


if __name__ == "__main__":
    # Nothing can read the requests of this one (the compose tests' mock serves them).
    serve_from_command_line(MockLLM, "mock LLM", "127.0.0.1", keep_requests=False)
