"""The demo provider: a scripted echo model, so a first session needs no API key.

DEMO ONLY, never a real model. The runner serves it on BAE_DEMO_PROVIDER_ADDR (loopback only),
and only when that is set (`make demo` / `bae run --demo` set it, with a
bae-config.toml entry pointing at it). It speaks the Anthropic Messages wire
(`POST /v1/messages`), so the runner reaches it through the same SDK client and
attempt walk as a real provider. Its script, applied to the last message:

- tool results: one text block, `[demo] <tool> returned: <content>` per result;
- user text in which names of the request's tools are each followed by a JSON
  object (`add {"a": 2, "b": 3}`): one `tool_use` per such name, in the order
  of the text, each with its object as input, preceded by
  `[demo] calling <tool>, <tool>…`. Where names overlap, the one that starts
  first wins, then the longest (`bash {…}` calls `bash`, not `sh`). An object
  that is not valid JSON is answered `[demo] cannot read the input of <tool>:
  <reason>`, with no tool call;
- other user text naming one of the request's tools: a `tool_use` of the first
  such tool in the request's order (input `{}`), preceded by `[demo] calling <tool>`;
- any other user text: `[demo] you said: <text>`.

Names match case-insensitively, anywhere in the text. A request with `"stream": true` (a client or
a subscriber asked for deltas) is answered with the same message as Anthropic's server-sent events,
its text in word-sized deltas.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bae.common.settings import Address
from bae.services.runner.canonical import JsonObject

log = logging.getLogger("bae.runner.demo")

PREFIX = "[demo]"
MAX_BODY_BYTES = 16 * 1024 * 1024


def _text_of(content: Any) -> str:
    """The text of a message's or tool result's content (a string or a block list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(block.get("text", "") for block in content
                        if isinstance(block, dict) and block.get("type") == "text")
    return ""


def _tool_names(messages: list[JsonObject]) -> dict[str, str]:
    """tool_use id -> tool name, over the whole history (to name each result's tool)."""
    names: dict[str, str] = {}
    for message in messages:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                names[str(block.get("id"))] = str(block.get("name"))
    return names


def _tool_use(name: str, tool_input: JsonObject) -> JsonObject:
    return {"type": "tool_use", "id": f"toolu_demo_{secrets.token_hex(8)}", "name": name, "input": tool_input}


def _calls_with_input(text: str, names: list[str]) -> list[JsonObject] | str:
    """The tool_use blocks of each name followed by a JSON object, in text order; a reason
    (the answer's text) when such an object does not parse; [] when no name is followed by one."""
    found: list[tuple[int, int, int, str]] = []  # (start, -length, end, name): the earliest, then the longest
    for name in names:
        for match in re.finditer(re.escape(name) + r"\s*(?=\{)", text, re.IGNORECASE):
            found.append((match.start(), -len(name), match.end(), name))
    blocks: list[JsonObject] = []
    consumed = 0  # where the last object ended: a name inside it is part of that input
    decoder = json.JSONDecoder()
    for start, _, end, name in sorted(found):
        if start < consumed:
            continue
        try:
            tool_input, consumed = decoder.raw_decode(text, end)
        except json.JSONDecodeError as exc:
            return f"{PREFIX} cannot read the input of {name}: {exc}"
        blocks.append(_tool_use(name, tool_input))  # a value read from a "{" is an object
    return blocks


def reply_blocks(messages: list[JsonObject], tools: list[JsonObject]) -> list[JsonObject]:
    """The scripted answer to a request's messages and tools (see the module docstring)."""
    last = messages[-1] if messages else {}
    content = last.get("content")
    results = [block for block in content if isinstance(block, dict) and block.get("type") == "tool_result"] \
        if isinstance(content, list) else []
    if results:
        by_id = _tool_names(messages)
        lines = [f"{PREFIX} {by_id.get(str(r.get('tool_use_id')), 'the tool')} returned: {_text_of(r.get('content'))}"
                 for r in results]
        return [{"type": "text", "text": "\n".join(lines)}]
    text = _text_of(content)
    names = [tool["name"] for tool in tools
             if isinstance(tool, dict) and isinstance(tool.get("name"), str) and tool["name"]]
    calls = _calls_with_input(text, names)
    if isinstance(calls, str):
        return [{"type": "text", "text": calls}]
    if calls:
        called = ", ".join(str(block["name"]) for block in calls)
        return [{"type": "text", "text": f"{PREFIX} calling {called}"}, *calls]
    lowered = text.lower()
    for name in names:
        if name.lower() in lowered:
            return [{"type": "text", "text": f"{PREFIX} calling {name}"}, _tool_use(name, {})]
    return [{"type": "text", "text": f"{PREFIX} you said: {text}"}]


async def _bounded_body(request: Request) -> bytes | None:
    """The body, or None as soon as it is known to be over MAX_BODY_BYTES (announced, or counted
    as it arrives): the rest is never read, so a huge body costs no more memory than the limit."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def messages_endpoint(request: Request) -> Response:
    body = await _bounded_body(request)
    if body is None:
        return _error(413, f"request too large (over {MAX_BODY_BYTES} bytes)")
    try:
        parsed = json.loads(body)
        messages, tools = parsed.get("messages") or [], parsed.get("tools") or []
        if not isinstance(messages, list) or not isinstance(tools, list):
            raise ValueError("messages and tools must be arrays")
    except (ValueError, AttributeError) as exc:
        return _error(400, f"invalid request: {exc}")
    blocks = reply_blocks(messages, tools)
    message = {
        "id": f"msg_demo_{secrets.token_hex(8)}",
        "type": "message",
        "role": "assistant",
        "model": str(parsed.get("model", "")),
        "content": blocks,
        "stop_reason": "tool_use" if blocks[-1]["type"] == "tool_use" else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": len(body) // 4, "output_tokens": sum(len(json.dumps(b)) for b in blocks) // 4},
    }
    if parsed.get("stream") is True:
        frames = "".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in stream_events(message))
        return Response(frames, media_type="text/event-stream")
    return JSONResponse(message)


def _pieces(text: str) -> list[str]:
    """`text` in word-sized pieces (each with the space before the next word), so a stream has
    several deltas to show."""
    return re.findall(r"\S+\s*|\s+", text) or [""]


def stream_events(message: JsonObject) -> list[JsonObject]:
    """`message` as the Anthropic Messages stream sends it (`"stream": true`): message_start, each
    content block's start, deltas (text in word-sized pieces, a tool input as one JSON piece) and
    stop, message_delta with the stop reason and output tokens, message_stop."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    events: list[JsonObject] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        if block["type"] == "tool_use":
            events.append({"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}})
            events.append({"type": "content_block_delta", "index": index,
                           "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
        else:
            events.append({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
            events.extend({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}
                          for piece in _pieces(block["text"]))
        events.append({"type": "content_block_stop", "index": index})
    events.append({"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                   "usage": {"output_tokens": usage["output_tokens"]}})
    events.append({"type": "message_stop"})
    return events


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": "invalid_request_error", "message": message}},
                        status_code=status)


class DemoProvider:
    """The demo endpoint on `address`, in the runner's event loop."""

    def __init__(self, address: Address) -> None:
        app = Starlette(routes=[Route("/v1/messages", messages_endpoint, methods=["POST"])])
        config = uvicorn.Config(app, host=address.host, port=address.port, lifespan="off",
                                access_log=False, log_config=None, server_header=False)
        config.load()
        self.address = address
        self.server = uvicorn.Server(config)
        self.server.lifespan = config.lifespan_class(config)

    async def start(self) -> None:
        await self.server.startup()  # a port that cannot be bound ends the process (exit 1)
        log.warning("DEMO provider (scripted echo model, not a real LLM) serving on http://%s", self.address)

    async def stop(self) -> None:
        await self.server.shutdown()
