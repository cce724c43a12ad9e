"""The Anthropic Messages wire format: request normalization and response reading.

The canonical shape already is Anthropic's, so a request only needs the
normalization the API insists on: the first message must be `user`, and roles
must alternate (SERVER-SPEC §8.5).
"""

from __future__ import annotations

from typing import Any

from bae.common.jsontext import RawJson, load
from bae.services.runner.canonical import (
    DeltaKind,
    History,
    JsonObject,
    Message,
    Piece,
    Usage,
    WireFormatError,
    content_blocks,
    optional_count,
    read_usage,
)

COMPACTED_PREAMBLE = "The earlier part of this conversation was compacted. A summary follows."


def normalize_history(history: History) -> tuple[History, JsonObject | None]:
    """`normalize` over a History. Its roles alone show the usual case, a history that starts
    with `user` and alternates: then no message is read and the history goes out as it came."""
    if history.alternates_from_user:
        return history, None
    folded, normalized = normalize(history.messages)
    return History.of(folded), normalized


def normalize(messages: list[Message]) -> tuple[list[Message], JsonObject | None]:
    """(messages to send, the `normalized` event field or None when nothing changed).

    1. A non-empty list that starts with a non-user message gets a synthetic
       user preamble (legacy compaction markers leave history assistant-first).
    2. Each run of consecutive same-role messages folds into one message,
       never reordering; `merged` lists the folded indices (after step 1).
    """
    prepended_user = bool(messages) and messages[0].get("role") != "user"
    if prepended_user:
        preamble = {"role": "user", "content": [{"type": "text", "text": COMPACTED_PREAMBLE}]}
        messages = [preamble, *messages]

    runs: list[list[int]] = []
    for index, message in enumerate(messages):
        if runs and messages[runs[-1][0]].get("role") == message.get("role"):
            runs[-1].append(index)
        else:
            runs.append([index])

    merged = [run for run in runs if len(run) > 1]
    if not prepended_user and not merged:
        return messages, None
    folded = [
        messages[run[0]]
        if len(run) == 1
        else {
            "role": messages[run[0]].get("role"),
            "content": [block for i in run for block in content_blocks(messages[i].get("content"))],
        }
        for run in runs
    ]
    return folded, {"prepended_user": prepended_user, "merged": merged}


def request_body(model: str, max_tokens: int, messages: RawJson, tools: RawJson) -> JsonObject:
    """The exact body sent: the canonical messages and tools as JSON text, spliced in
    unchanged; `tools` is always present (possibly empty)."""
    return {"model": model, "max_tokens": max_tokens, "messages": messages, "tools": tools}


# What a streamed request adds to the body (the Messages API's server-sent events).
STREAM_OPTIONS: JsonObject = {"stream": True}
# The text-like deltas: the delta's type, the member holding its text, the block member it adds to.
_TEXT_DELTAS = {
    "text_delta": ("text", DeltaKind.TEXT),
    "thinking_delta": ("thinking", DeltaKind.THINKING),
}


class StreamAssembly:
    """A streamed response's events put together into the body the same call answers without
    streaming, as the provider sent its parts: `message_start`'s message; each content block as
    `content_block_start` gave it, its `text_delta`/`thinking_delta` texts appended, its
    `input_json_delta` pieces joined and read as its `input` at `content_block_stop`, a
    `signature_delta` set as its signature and a `citations_delta` appended to its citations;
    then the members of each `message_delta`'s `delta` set on the message and those of its
    `usage` (a null one left out) on the message's usage. Other events (`ping`) carry nothing."""

    def __init__(self) -> None:
        self._message: JsonObject | None = None
        self._content: list[JsonObject] = []
        self._inputs: dict[int, list[str]] = {}  # the partial JSON pieces of each tool call's input
        self._stopped = False

    def feed(self, event: Any) -> list[Piece]:
        """Add one event; the output pieces it carries (none for an empty text)."""
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "message_start":
            message = event.get("message")
            if not isinstance(message, dict):
                raise WireFormatError("provider stream: message_start has no message")
            self._content = []
            self._message = {**message, "content": self._content}
            return []
        if kind == "content_block_start":
            block = event.get("content_block")
            if self._index(event, len(self._content) + 1) != len(self._content) or not isinstance(block, dict):
                raise WireFormatError("provider stream: content blocks out of order")
            self._content.append(dict(block))
            return []
        if kind == "content_block_delta":
            return self._delta(self._index(event, len(self._content)), event.get("delta"))
        if kind == "content_block_stop":
            index = self._index(event, len(self._content))
            parts = self._inputs.pop(index, None)
            if parts:
                try:
                    self._content[index]["input"] = load("".join(parts))
                except ValueError as exc:
                    raise WireFormatError(f"provider stream: a tool call's input is not JSON: {exc}") from None
            return []
        if kind == "message_delta":
            message = self._started()
            delta, counts = event.get("delta"), event.get("usage")
            if isinstance(delta, dict):
                message.update(delta)
            if isinstance(counts, dict):
                usage = message.get("usage")
                message["usage"] = {
                    **(usage if isinstance(usage, dict) else {}),
                    **{key: value for key, value in counts.items() if value is not None},
                }
        elif kind == "message_stop":
            self._started()
            self._stopped = True
        return []

    def body(self) -> JsonObject:
        """The whole response; raises WireFormatError when the stream ended before `message_stop`."""
        if self._message is None or not self._stopped:
            raise WireFormatError("provider stream ended before message_stop")
        return self._message

    def _started(self) -> JsonObject:
        if self._message is None:
            raise WireFormatError("provider stream: an event came before message_start")
        return self._message

    def _index(self, event: JsonObject, bound: int) -> int:
        self._started()
        index = event.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < bound:
            raise WireFormatError("provider stream: an event names no content block")
        return index

    def _delta(self, index: int, delta: Any) -> list[Piece]:
        block = self._content[index]
        delta_type = delta.get("type") if isinstance(delta, dict) else None
        if delta_type in _TEXT_DELTAS:
            member, kind = _TEXT_DELTAS[delta_type]
            text = delta.get(member)
            if not isinstance(text, str):
                raise WireFormatError(f"provider stream: a {delta_type} has no {member}")
            block[member] = str(block.get(member) or "") + text
            return [Piece(index, kind, text)] if text else []
        if delta_type == "input_json_delta":
            part = delta.get("partial_json")
            if not isinstance(part, str):
                raise WireFormatError("provider stream: an input_json_delta has no partial_json")
            self._inputs.setdefault(index, []).append(part)
            return [Piece(index, DeltaKind.TOOL_INPUT, part)] if part else []
        if delta_type == "signature_delta":
            block["signature"] = delta.get("signature")
        elif delta_type == "citations_delta":
            citations = block.get("citations")
            block["citations"] = [*(citations if isinstance(citations, list) else []), delta.get("citation")]
        return []


def usage(body: JsonObject) -> Usage | None:
    """Input counts cached tokens too (cache read + creation); partial usage counts as none."""
    found = read_usage(body, "input_tokens", "output_tokens")
    if found is None:
        return None
    raw, input_tokens, output_tokens = found
    read = optional_count(raw, "cache_read_input_tokens")
    created = optional_count(raw, "cache_creation_input_tokens")
    return Usage(input_tokens + read + created, output_tokens, read, created)


def assistant_message(body: JsonObject) -> Message:
    """The canonical assistant message: the response's text and tool_use blocks."""
    content = body.get("content")
    if not isinstance(content, list):
        raise WireFormatError("provider response has no content array")
    blocks = []
    for block in content:
        if not isinstance(block, dict):
            raise WireFormatError("provider response content holds a non-object block")
        if block.get("type") == "text":
            blocks.append({"type": "text", "text": block.get("text", "")})
        elif block.get("type") == "tool_use":
            blocks.append(
                {
                    "type": "tool_use",
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "input": block.get("input", {}),
                }
            )
    return {"role": "assistant", "content": blocks}


def truncation(body: JsonObject) -> str:
    """Why the output was cut off by its budget, or "" when it was not."""
    return "stop_reason max_tokens" if body.get("stop_reason") == "max_tokens" else ""

