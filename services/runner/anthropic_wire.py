"""The Anthropic Messages wire format: request normalization and response reading.

The canonical shape already is Anthropic's, so a request only needs the
normalization the API insists on: the first message must be `user`, and roles
must alternate (SERVER-SPEC §8.5).
"""

from __future__ import annotations

from bae.common.jsontext import RawJson
from services.runner.canonical import (
    History,
    JsonObject,
    Message,
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

