"""The canonical (Anthropic-style) message shape the engine works in.

Messages are `{"role", "content": string | block[]}`; blocks are `text`,
`tool_use` and `tool_result`. Each wire module translates from and to this.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeGuard

from bae.common.jsontext import RawJson, dump, load

# Engine-only routing fields on tool_use blocks; no provider ever sees them.
ROUTING_FIELDS = ("dispatch", "caller")
# How a routing field shows in a message's JSON text, as a key.
_ROUTING_KEYS = tuple(f'"{name}"' for name in ROUTING_FIELDS)

# A JSON object of a provider's wire: a request or response body, a message, a block, a tool.
JsonObject = dict[str, Any]
Message = JsonObject
Block = JsonObject


class History:
    """A conversation as the session sends it: each message's JSON text, and its role.

    A step used to read every message of the history and write it back, which made each
    step over a long history cost milliseconds. A message is now read only when it must
    change (it names a routing field, or Anthropic needs its role run folded) or when a
    wire translates messages (OpenAI); the rest goes out as the text that came in.
    """

    def __init__(self, texts: list[str], roles: list[str]) -> None:
        self.texts = texts
        self.roles = roles

    @classmethod
    def of(cls, messages: list[Message]) -> "History":
        return cls([dump(message) for message in messages], [message.get("role") or "" for message in messages])

    def extended(self, texts: list[str], roles: list[str]) -> "History":
        """This history, then more messages. What was found out about this one's messages holds
        for them in the longer one, so a step after a long held history looks only at the new ones."""
        longer = History(self.texts + texts, self.roles + roles)
        known = vars(self)  # where functools.cached_property keeps what it found out
        if "names_routing_fields" in known:
            longer.names_routing_fields = self.names_routing_fields or _names_routing_fields(texts)
        if "alternates_from_user" in known and self.roles:
            longer.alternates_from_user = self.alternates_from_user and _alternate(self.roles[-1:] + roles)
        return longer

    @functools.cached_property
    def names_routing_fields(self) -> bool:
        """Whether a message may name a routing field (a text may just mention one)."""
        return _names_routing_fields([self.json.text])

    @functools.cached_property
    def alternates_from_user(self) -> bool:
        """Whether the roles start with `user` and alternate (an empty history does too)."""
        return (not self.roles or self.roles[0] == "user") and _alternate(self.roles)

    @functools.cached_property
    def messages(self) -> list[Message]:
        """The messages as values, read on first use."""
        return [load(text) for text in self.texts]

    @functools.cached_property
    def json(self) -> RawJson:
        """The messages as one JSON array."""
        return RawJson("[" + ",".join(self.texts) + "]")

    def without_routing_fields(self) -> "History":
        """`dispatch` / `caller` dropped from tool_use blocks; itself when no message names one."""
        if not self.names_routing_fields:
            return self
        texts = list(self.texts)
        for index, text in enumerate(texts):
            if _names_routing_fields([text]):  # may be just text: reading it tells
                (message,) = strip_routing_fields([load(text)])
                texts[index] = dump(message)
        return History(texts, self.roles)


def _names_routing_fields(texts: list[str]) -> bool:
    return any(key in text for text in texts for key in _ROUTING_KEYS)


def _alternate(roles: list[str]) -> bool:
    return not any(map(operator.eq, roles, roles[1:]))


@dataclass(frozen=True)
class Usage:
    """A response's usage. `input_tokens` counts every input token, the cached ones too (what
    `provider.response` reports, SERVER-SPEC §8.4); the two cache counts say how many of them
    the provider read from its prompt cache or wrote to it, for usage accounting."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    def to_json(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


class DeltaKind(StrEnum):
    """What a piece of streamed output is (the `kind` of a `session.delta`)."""

    TEXT = "text"
    THINKING = "thinking"
    TOOL_INPUT = "tool_input"  # a piece of the partial JSON of a tool call's input
    RESET = "reset"  # the attempt failed: what it streamed is void


@dataclass(frozen=True)
class Piece:
    """A piece of a streamed response as the provider sent it: its content block, what it is, its text."""

    index: int
    kind: DeltaKind
    text: str


class WireFormatError(ValueError):
    """A 2xx provider response that cannot be read as an assistant message."""


def strip_routing_fields(messages: list[Message]) -> list[Message]:
    """Drop `dispatch` / `caller` from tool_use blocks; untouched messages are shared, not copied."""
    stripped = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(_has_routing(block) for block in content):
            content = [_without_routing(block) for block in content]
            message = {**message, "content": content}
        stripped.append(message)
    return stripped


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


def read_usage(body: JsonObject, input_key: str, output_key: str) -> tuple[JsonObject, int, int] | None:
    """`body["usage"]` and its input and output counts under the kind's field names; partial
    usage counts as none."""
    raw = body.get("usage")
    if not isinstance(raw, dict):
        return None
    input_tokens, output_tokens = raw.get(input_key), raw.get(output_key)
    if not _is_int(input_tokens) or not _is_int(output_tokens):
        return None
    return raw, input_tokens, output_tokens


def optional_count(table: Any, key: str) -> int:
    """An optional count of a usage object: 0 when it is missing, not an integer, or negative."""
    value = table.get(key) if isinstance(table, dict) else None
    return value if _is_int(value) and value > 0 else 0


def _is_int(value: Any) -> TypeGuard[int]:
    """A JSON integer (bool is an int subclass in Python, but not in JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)
