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
Standalone (benchmarks): `python -m testkit.mockllm --port 9100`; `--text-pieces N`
makes that default answer N pieces of "tok " (N output tokens) and `--pace S` puts S
seconds between two events when it is streamed.

Streaming. A request whose body has `"stream": true` gets the same reply as a
`text/event-stream`, in the provider's own framing; everything else gets the JSON
body as before. Anthropic: message_start, content_block_start, one ping,
content_block_delta (text_delta / thinking_delta then signature_delta /
input_json_delta), content_block_stop per block, message_delta and message_stop.
OpenAI: `data:` lines of chat.completion.chunk (first the role, then content and
tool_calls deltas, then finish_reason; a last `choices: []` chunk with the usage
when the request asks `stream_options.include_usage`), then `data: [DONE]`.
Assembled (start from message_start's message or the first chunk, append the
deltas, merge message_delta or the last chunks), a stream equals the body the same
reply gives unstreamed. How it streams is scripted on the reply:

    ev = threading.Event()
    llm.enqueue(Reply.text("Hello big world").streaming(pace=0.01, pause_at=2, resume=ev))

- text is cut at word boundaries keeping the spaces ("Hello ", "big ", "world"), or
  as `pieces=(...)` says; thinking text and a tool call's JSON input
  (json.dumps of it) are cut at word boundaries;
- `pace`: seconds between two stream events;
- `pause_at=n, resume=event`: after the n-th content delta (0: before the first),
  wait for `resume` (at most 120 s);
- `fail_at=n, failure="cut"`: after the n-th content delta, close the connection
  (no end events, no [DONE]; uvicorn logs that it closed it; the anthropic SDK
  raises httpx2.RemoteProtocolError, the openai SDK APIConnectionError); `failure="error"` sends the provider's in-stream
  error instead (Anthropic `event: error` overloaded_error, OpenAI a `data:
  {"error": ...}` line) and ends the response.
Content deltas are counted over all blocks (text, thinking, tool input pieces) as
the path sends them: OpenAI has no thinking, so `Reply.thinking` sends only its
text there. A count beyond the deltas the stream has answers 500 with the reason.
A client that closes the connection before a stream ends (or before a held reply
is sent) is listed in `aborted`. A reply with `usage=None` streams no usage.

It is a raw ASGI app under uvicorn in a background thread: asyncio serves
concurrent requests without a thread per request.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import uvicorn

ANTHROPIC_PATH = "/v1/messages"
OPENAI_PATH = "/v1/chat/completions"
DEFAULT_USAGE = (10, 5)
FAILURES = ("cut", "error")
# What the real APIs send in the stream when they fail mid-answer.
ANTHROPIC_STREAM_ERROR = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
OPENAI_STREAM_ERROR = {
    "error": {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "param": None,
        "code": None,
    }
}


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
    # A thinking block before the text (Anthropic only; see `thinking`).
    thinking_text: str = ""
    # How a streamed answer goes (see `streaming`); a reply that is not streamed ignores these.
    pieces: tuple[str, ...] | None = None
    pace: float = 0.0
    pause_at: int | None = None
    resume: threading.Event | None = None
    fail_at: int | None = None
    failure: str = "cut"

    def __post_init__(self) -> None:
        # A script that cannot be played fails where it is written, not as a puzzling answer.
        if self.pieces is not None and "".join(self.pieces) != self.reply_text:
            raise ValueError(f"pieces {self.pieces!r} do not join into the text {self.reply_text!r}")
        if self.pieces is not None and "" in self.pieces:
            raise ValueError("an empty piece would be a content delta carrying nothing")
        if (self.pause_at is None) != (self.resume is None):
            raise ValueError("pause_at and resume go together")
        if self.failure not in FAILURES:
            raise ValueError(f"failure must be one of {FAILURES}, not {self.failure!r}")
        if self.pace < 0 or min(self.pause_at or 0, self.fail_at or 0) < 0:
            raise ValueError("pace, pause_at and fail_at cannot be negative")

    def streaming(
        self,
        *,
        pieces: Sequence[str] | None = None,
        pace: float | None = None,
        pause_at: int | None = None,
        resume: threading.Event | None = None,
        fail_at: int | None = None,
        failure: str | None = None,
    ) -> "Reply":
        """This reply, streamed as told when the request asks for a stream; what is not given is kept.

        pieces: the text's deltas, exactly (default: cut at word boundaries, spaces kept);
        pace: seconds between two stream events; pause_at/resume: after the n-th content delta,
        wait until `resume` is set; fail_at/failure: after the n-th content delta, "cut" the
        connection or send the provider's in-stream "error"."""
        given = {
            "pieces": None if pieces is None else tuple(pieces),
            "pace": pace,
            "pause_at": pause_at,
            "resume": resume,
            "fail_at": fail_at,
            "failure": failure,
        }
        return replace(self, **{name: value for name, value in given.items() if value is not None})

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
    def thinking(cls, thinking_text: str, text: str, usage: tuple[int, int] | None = DEFAULT_USAGE) -> "Reply":
        """Anthropic: a thinking block (with a mock signature), then the text. OpenAI's chat
        completions carry no thinking, so there it is the text alone."""
        return cls("text", reply_text=text, thinking_text=thinking_text, usage=usage)

    @classmethod
    def truncated(cls, text: str, usage: tuple[int, int] | None = DEFAULT_USAGE) -> "Reply":
        """Cut off by the output budget: stop_reason max_tokens / finish_reason length."""
        return cls("truncated", reply_text=text, usage=usage)


DEFAULT_REPLY = Reply.text("ok")


def render_anthropic(reply: Reply, model: str, serial: int) -> dict:
    content: list[dict] = []
    if reply.thinking_text:
        content.append({"type": "thinking", "thinking": reply.thinking_text, "signature": "mock-signature"})
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


# One stream event as sent, and whether it is a content delta (what pause_at and fail_at count).
StreamItem = tuple[bytes, bool]


def word_pieces(text: str) -> list[str]:
    """"Hello big world" -> ["Hello ", "big ", "world"]: each word with the white space after it."""
    return re.findall(r"\S+\s*|\s+", text)


def anthropic_event(data: dict) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def anthropic_stream(reply: Reply, body: dict) -> list[StreamItem]:
    """The event stream that assembles into `body` (render_anthropic's), as the Messages API sends it."""
    message = {**body, "content": [], "stop_reason": None, "stop_sequence": None}
    if "usage" in body:
        # The output count so far: the real API starts it at 1 or so and sends the total in message_delta.
        message["usage"] = {**body["usage"], "output_tokens": min(1, body["usage"]["output_tokens"])}
    items: list[StreamItem] = [(anthropic_event({"type": "message_start", "message": message}), False)]
    ping = anthropic_event({"type": "ping"})
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            start: dict = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in reply.pieces or word_pieces(block["text"])]
        elif block["type"] == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": piece} for piece in word_pieces(block["thinking"])]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            pieces = word_pieces(json.dumps(block["input"]))
            deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
        items.append((anthropic_event({"type": "content_block_start", "index": index, "content_block": start}), False))
        if index == 0:
            items.append((ping, False))
        items += [
            (anthropic_event({"type": "content_block_delta", "index": index, "delta": delta}), True) for delta in deltas
        ]
        if block["type"] == "thinking":
            signature = {"type": "signature_delta", "signature": block["signature"]}
            items.append((anthropic_event({"type": "content_block_delta", "index": index, "delta": signature}), False))
        items.append((anthropic_event({"type": "content_block_stop", "index": index}), False))
    if not body["content"]:
        items.append((ping, False))
    end: dict = {"type": "message_delta", "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None}}
    if "usage" in body:
        end["usage"] = {"output_tokens": body["usage"]["output_tokens"]}
    items.append((anthropic_event(end), False))
    items.append((anthropic_event({"type": "message_stop"}), False))
    return items


def openai_line(data: dict) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def openai_stream(reply: Reply, body: dict, include_usage: bool) -> list[StreamItem]:
    """The chat.completion.chunk lines that assemble into `body` (render_openai's)."""
    head = {key: body[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    if include_usage:
        head["usage"] = None  # as the real API does: every chunk but the last has it, empty

    def chunk(delta: dict, finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return openai_line({**head, "choices": [choice]})

    message = body["choices"][0]["message"]
    # No text at all assembles into content null, as the unstreamed message has it.
    items: list[StreamItem] = [(chunk({"role": "assistant", "content": "" if message["content"] else None}), False)]
    if message["content"]:
        items += [(chunk({"content": piece}), True) for piece in reply.pieces or word_pieces(message["content"])]
    for index, call in enumerate(message.get("tool_calls", [])):
        opening = {"index": index, "id": call["id"], "type": "function",
                   "function": {"name": call["function"]["name"], "arguments": ""}}
        items.append((chunk({"tool_calls": [opening]}), False))
        items += [
            (chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}), True)
            for piece in word_pieces(call["function"]["arguments"])
        ]
    items.append((chunk({}, body["choices"][0]["finish_reason"]), False))
    if include_usage and "usage" in body:
        items.append((openai_line({**head, "choices": [], "usage": body["usage"]}), False))
    items.append((b"data: [DONE]\n\n", False))
    return items


def after_delta(items: list[StreamItem], n: int | None) -> int | None:
    """The position of the item to send next once n content deltas are out (0: the first delta's), or None
    for no n; ValueError when the stream has fewer deltas."""
    if n is None:
        return None
    deltas = [position for position, (_, is_delta) in enumerate(items) if is_delta]
    if n > len(deltas) or not deltas:
        raise ValueError(f"the stream has {len(deltas)} content deltas; the script counts to {n}")
    return deltas[0] if n == 0 else deltas[n - 1] + 1


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
    # What an empty queue answers.
    default_reply: Reply = DEFAULT_REPLY

    def __post_init__(self) -> None:
        self._queue: deque[Reply] = deque()
        # The requests whose client closed the connection before the answer was complete (a held
        # reply before its release, a stream before its end): a provider call aborted by its caller.
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
        reply = self._queue.popleft() if self._queue else self.default_reply
        items: list[StreamItem] | None = None
        pause = fail = None
        # An error or raw reply is answered whole: the real APIs fail before a stream starts that way.
        if isinstance(body, dict) and body.get("stream") is True and reply.kind not in ("error", "raw"):
            items = self._stream(reply, path, body)
            status, payload = 200, b""
            try:
                pause, fail = after_delta(items, reply.pause_at), after_delta(items, reply.fail_at)
            except ValueError as error:
                items = None
                status, payload = 500, json.dumps({"error": f"mock LLM script: {error}"}).encode()
        else:
            status, payload = self._render(reply, path, body)
        if reply.seconds:
            await asyncio.sleep(reply.seconds)
        if reply.release is not None and not await released(reply.release, receive):
            self.aborted.append(request)
            return
        if items is None:
            await respond(send, status, payload, reply.headers)
        elif not await stream(send, receive, items, reply, pause, fail, path == ANTHROPIC_PATH):
            self.aborted.append(request)

    def _render(self, reply: Reply, path: str, body: Any) -> tuple[int, bytes]:
        if reply.kind == "error":
            return reply.status, str(reply.body).encode()
        if reply.kind == "raw":
            return reply.status, json.dumps(reply.body).encode()
        return 200, json.dumps(self._body(reply, path, body)).encode()

    def _body(self, reply: Reply, path: str, body: Any) -> dict:
        model = body.get("model", "mock-model") if isinstance(body, dict) else "mock-model"
        render = render_anthropic if path == ANTHROPIC_PATH else render_openai
        return render(reply, model, next(self._serial))

    def _stream(self, reply: Reply, path: str, body: dict) -> list[StreamItem]:
        whole = self._body(reply, path, body)
        if path == ANTHROPIC_PATH:
            return anthropic_stream(reply, whole)
        options = body.get("stream_options")
        return openai_stream(reply, whole, isinstance(options, dict) and options.get("include_usage") is True)


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


async def stream(
    send, receive, items: list[StreamItem], reply: Reply, pause: int | None, fail: int | None, anthropic: bool
) -> bool:
    """Send `items` as an event stream, paced, paused and broken as `reply` says (`pause` and `fail` are
    positions in `items`); False when the client closed the connection before the end."""
    gone = asyncio.ensure_future(disconnected(receive))
    try:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    *((name.encode(), value.encode()) for name, value in reply.headers),
                ],
            }
        )
        for position, (data, _) in enumerate(items):
            if position and reply.pace and await until_gone(gone, asyncio.sleep(reply.pace)):
                return False
            if position == pause and reply.resume is not None:
                if await until_gone(gone, asyncio.to_thread(reply.resume.wait, 120)):
                    return False  # the thread waits on until the test sets the event
            if gone.done():
                return False
            if position == fail:
                if reply.failure == "cut":
                    # Returning with the response incomplete makes uvicorn close the connection (it logs
                    # that it did): the client's read ends mid-body.
                    return True
                error = anthropic_event(ANTHROPIC_STREAM_ERROR) if anthropic else openai_line(OPENAI_STREAM_ERROR)
                await send({"type": "http.response.body", "body": error})
                return True
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return True
    finally:
        gone.cancel()


async def until_gone(gone: asyncio.Future[None], waiting: Any) -> bool:
    """Await `waiting` unless the client goes first; True when it went."""
    task = asyncio.ensure_future(waiting)
    done, _ = await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    if task not in done:
        task.cancel()
        return True
    return False


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
    """`--host`/`--port` (and how the default reply streams) from the command line, then serve `mock_class` in
    the foreground."""
    parser = argparse.ArgumentParser(description=f"Serve the {name}.")
    parser.add_argument("--host", default=default_host)
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument(
        "--text-pieces", type=int, default=0, metavar="N",
        help='the default reply is N pieces of "tok " (streamed one per delta) instead of "ok"',
    )
    parser.add_argument(
        "--pace", type=float, default=0.0, metavar="S", help="seconds between two events of a streamed reply"
    )
    args = parser.parse_args()
    if args.text_pieces < 0 or args.pace < 0:
        parser.error("--text-pieces and --pace cannot be negative")
    # One output token a piece, as a benchmark reading the usage expects of a long answer.
    default_reply = Reply.text("tok " * args.text_pieces, usage=(10, args.text_pieces)) if args.text_pieces else DEFAULT_REPLY
    default_reply = default_reply.streaming(pace=args.pace)
    print(f"{name} listening on http://{args.host}:{args.port}", flush=True)
    mock_class(
        host=args.host, port=args.port, keep_requests=keep_requests, default_reply=default_reply
    ).serve_forever()


if __name__ == "__main__":
    # Nothing can read the requests of this one (the compose tests' mock serves them).
    serve_from_command_line(MockLLM, "mock LLM", "127.0.0.1", keep_requests=False)
