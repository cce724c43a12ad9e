"""The OpenAI Chat Completions wire format: translation both ways (SERVER-SPEC §8.5)."""

from __future__ import annotations

import json
from typing import Any

from bae.services.runner.canonical import (
    Block,
    DeltaKind,
    JsonObject,
    Message,
    Piece,
    Usage,
    WireFormatError,
    content_blocks,
    optional_count,
    read_usage,
)


def request_body(model: str, max_tokens: int, messages: list[Message], tools: list[JsonObject]) -> JsonObject:
    """The body sent: translated messages; `tools` only when there are some."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": translate_messages(messages),
    }
    if tools:
        body["tools"] = translate_tools(tools)
    return body


def translate_tools(tools: list[JsonObject]) -> list[JsonObject]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool.get("name"),
                "description": tool.get("description"),
                "parameters": tool.get("input_schema") or {},
            },
        }
        for tool in tools
    ]


def translate_messages(messages: list[Message]) -> list[JsonObject]:
    translated: list[JsonObject] = []
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if isinstance(content, str):
            translated.append({"role": role, "content": content})
        elif role == "assistant":
            translated.append(_assistant_message(content_blocks(content)))
        else:
            translated.extend(_tool_and_text_messages(role, content_blocks(content)))
    return translated


def _joined_text(blocks: list[Block]) -> str:
    return "\n".join(
        block.get("text", "")
        for block in blocks
        if isinstance(block, dict) and block.get("type") == "text"
    )


def _assistant_message(blocks: list[Block]) -> JsonObject:
    text = _joined_text(blocks)
    tool_calls = [
        {
            "id": block.get("id"),
            "type": "function",
            "function": {
                "name": block.get("name"),
                "arguments": json.dumps(block.get("input", {}), separators=(",", ":")),
            },
        }
        for block in blocks
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]
    if not tool_calls:
        return {"role": "assistant", "content": text}
    # The API rejects an empty tool_calls array, so it is present only with calls.
    return {"role": "assistant", "content": text or None, "tool_calls": tool_calls}


def _tool_and_text_messages(role: str | None, blocks: list[Block]) -> list[JsonObject]:
    """One `tool` message per tool_result, then the remaining text as one message."""
    translated = [
        {
            "role": "tool",
            "tool_call_id": block.get("tool_use_id"),
            "content": _tool_result_text(block.get("content")),
        }
        for block in blocks
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    text = _joined_text(blocks)
    if text:
        translated.append({"role": role, "content": text})
    return translated


def _tool_result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(block, dict) and block.get("type") == "text" for block in content
    ):
        return _joined_text(content)
    return json.dumps(content, separators=(",", ":"))


def usage(body: JsonObject) -> Usage | None:
    """`prompt_tokens` counts the cached ones too (`prompt_tokens_details.cached_tokens`)."""
    found = read_usage(body, "prompt_tokens", "completion_tokens")
    if found is None:
        return None
    raw, prompt_tokens, completion_tokens = found
    cached = optional_count(raw.get("prompt_tokens_details"), "cached_tokens")
    return Usage(prompt_tokens, completion_tokens, min(cached, max(prompt_tokens, 0)))


def _first_choice(body: JsonObject) -> JsonObject | None:
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def assistant_message(body: JsonObject) -> Message:
    """The canonical assistant message: text block, then one tool_use per tool call."""
    choice = _first_choice(body)
    message = choice.get("message") if choice else None
    if not isinstance(message, dict):
        raise WireFormatError("provider response has no choices[0].message")
    blocks: list[Block] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str) or not name:
            raise WireFormatError("provider tool call is missing function.name")
        blocks.append(
            {"type": "tool_use", "id": call.get("id"), "name": name, "input": _arguments(name, function)}
        )
    return {"role": "assistant", "content": blocks}


def _arguments(name: str, function: JsonObject) -> Any:
    arguments = function.get("arguments")
    if arguments is None or arguments == "":
        return {}
    if not isinstance(arguments, str):
        raise WireFormatError(f'provider tool call "{name}" has non-JSON arguments')
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise WireFormatError(f'provider tool call "{name}" has non-JSON arguments: {exc}') from None
    if not isinstance(parsed, dict):
        raise WireFormatError(f'provider tool call "{name}" arguments are not a JSON object')
    return parsed


def truncation(body: JsonObject) -> str:
    choice = _first_choice(body)
    return "finish_reason length" if choice and choice.get("finish_reason") == "length" else ""


# What a streamed request adds to the body: the chunks, and the usage in a last one.
STREAM_OPTIONS: JsonObject = {"stream": True, "stream_options": {"include_usage": True}}
# The first chunk's members the response keeps, as a non-streaming call answers them.
_HEAD = ("id", "created", "model", "system_fingerprint", "service_tier")


class StreamAssembly:
    """`chat.completion.chunk` objects put together into the `chat.completion` body the same call
    answers without streaming: the first chunk's id, created and model (and system_fingerprint,
    service_tier when sent); of the first choice, the role, the content pieces joined (null when
    they join to nothing), each tool call (by its `index`) with the id, type and function name its
    pieces gave and its `arguments` pieces joined, and the finish_reason; the usage of the chunk
    that carries it (`stream_options.include_usage`).

    Pieces are numbered as the canonical message's blocks would be if it had its text: the text
    is block 0 and tool call k is block k + 1."""

    def __init__(self) -> None:
        self._head: JsonObject | None = None
        self._role = "assistant"
        self._content: list[str] = []
        self._calls: dict[int, JsonObject] = {}
        self._arguments: dict[int, list[str]] = {}
        self._finish_reason: Any = None
        self._usage: Any = None

    def feed(self, chunk: Any) -> list[Piece]:
        """Add one chunk; the output pieces it carries (none for an empty text)."""
        if not isinstance(chunk, dict):
            raise WireFormatError("provider stream: a chunk is not an object")
        if self._head is None:
            self._head = {key: chunk[key] for key in _HEAD if key in chunk}
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        pieces: list[Piece] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                pieces += self._delta(delta)
            if choice.get("finish_reason") is not None:
                self._finish_reason = choice["finish_reason"]
        return pieces

    def body(self) -> JsonObject:
        """The whole response; raises WireFormatError when the stream ended before a finish_reason."""
        if self._head is None or self._finish_reason is None:
            raise WireFormatError("provider stream ended before a finish_reason")
        message: JsonObject = {"role": self._role, "content": "".join(self._content) or None}
        if self._calls:
            message["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": "".join(self._arguments[index])}}
                for index, call in sorted(self._calls.items())
            ]
        head = self._head
        body: JsonObject = {
            "id": head.get("id"),
            "object": "chat.completion",
            "created": head.get("created"),
            "model": head.get("model"),
            **{key: head[key] for key in _HEAD[3:] if key in head},
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish_reason}],
        }
        if self._usage is not None:
            body["usage"] = self._usage
        return body

    def _delta(self, delta: JsonObject) -> list[Piece]:
        pieces: list[Piece] = []
        if isinstance(delta.get("role"), str):
            self._role = delta["role"]
        text = delta.get("content")
        if isinstance(text, str):
            self._content.append(text)
            if text:
                pieces.append(Piece(0, DeltaKind.TEXT, text))
        for call in delta.get("tool_calls") or []:
            index = call.get("index") if isinstance(call, dict) else None
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise WireFormatError("provider stream: a tool call piece has no index")
            held = self._calls.setdefault(index, {"id": None, "type": "function", "function": {"name": ""}})
            self._arguments.setdefault(index, [])
            if call.get("id"):
                held["id"] = call["id"]
            if call.get("type"):
                held["type"] = call["type"]
            function = call.get("function")
            if not isinstance(function, dict):
                continue
            if isinstance(function.get("name"), str):
                held["function"]["name"] += function["name"]
            part = function.get("arguments")
            if isinstance(part, str) and part:
                self._arguments[index].append(part)
                pieces.append(Piece(index + 1, DeltaKind.TOOL_INPUT, part))
        return pieces
