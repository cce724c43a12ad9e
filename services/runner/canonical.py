"""The canonical (Anthropic-style) message shape the engine works in.

Messages are `{"role", "content": string | block[]}`; blocks are `text`,
`tool_use` and `tool_result`. Each wire module translates from and to this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

# Engine-only routing fields on tool_use blocks; no provider ever sees them.
ROUTING_FIELDS = ("dispatch", "caller")

Message = dict[str, Any]
Block = dict[str, Any]


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int

    def to_json(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


class WireFormatError(ValueError):
    """A 2xx provider response that cannot be read as an assistant message."""


def strip_routing_fields(messages: list[Message]) -> list[Message]:
    """Drop `dispatch` / `caller` from tool_use blocks; untouched messages are shared, not copied,
    and when none carries a routing field the list itself is returned."""
    # Runs on every provider step over the whole history: plain loops, no call per block.
    stripped: list[Message] | None = None
    for index, message in enumerate(messages):
        content = message.get("content")
        if type(content) is not list:
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use" and _has_routing(block):
                if stripped is None:
                    stripped = list(messages)
                stripped[index] = {**message, "content": [_without_routing(block) for block in content]}
                break
    return messages if stripped is None else stripped


def _has_routing(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "tool_use"
        and any(name in block for name in ROUTING_FIELDS)
    )


def _without_routing(block: Any) -> Any:
    if not _has_routing(block):
        return block
    return {key: value for key, value in block.items() if key not in ROUTING_FIELDS}


def content_blocks(content: Any) -> list[Block]:
    """Content as a block list: a string becomes one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def read_usage(
    body: dict, input_key: str, output_key: str, extra_input_keys: tuple[str, ...] = ()
) -> Usage | None:
    """`body["usage"]` under the kind's field names; partial usage counts as none.

    `extra_input_keys` name optional counts added to the input (missing ones count 0).
    """
    raw = body.get("usage")
    if not isinstance(raw, dict):
        return None
    input_tokens, output_tokens = raw.get(input_key), raw.get(output_key)
    if not _is_int(input_tokens) or not _is_int(output_tokens):
        return None
    extra = sum(value for key in extra_input_keys if _is_int(value := raw.get(key)))
    return Usage(input_tokens + extra, output_tokens)


def _is_int(value: Any) -> TypeGuard[int]:
    """A JSON integer (bool is an int subclass in Python, but not in JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)
