"""A trigger's message template: text with `{field}` placeholders filled from the call's input.

Parsed here with one strict pattern, never with str.format (which would read attributes and
indexes of the values, `{x.__class__}`): a placeholder is a plain property name, `{{` and `}}` are
literal braces, and any other brace is refused when the trigger is written.
"""

from __future__ import annotations

import re
from typing import Any

from bae.common.errors import InvalidInput
from bae.common.jsontext import dump

# A placeholder names a top-level property of the input, as an identifier would.
_TOKENS = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]{0,63})\}|\{[^{}]{1,64}\}|[{}]")

Part = tuple[str, str]  # ("text", literal) or ("field", name)


def parse(template: str) -> list[Part]:
    """The template's parts in order; InvalidInput (400) names the first brace that is neither a
    placeholder nor an escape."""
    parts: list[Part] = []
    at = 0
    for token in _TOKENS.finditer(template):
        if token.start() > at:
            parts.append(("text", template[at:token.start()]))
        text = token.group(0)
        if token.group(1) is not None:
            parts.append(("field", token.group(1)))
        elif text in ("{{", "}}"):
            parts.append(("text", text[0]))
        elif len(text) > 1:  # braces around something that is not a name: {x.y}, {x[0]}, {x!r}, { x }
            raise InvalidInput(
                f"message_template's placeholder {text} at character {token.start()} is not a field name: a "
                "placeholder is {name} (letters, digits and _), and a literal brace is written {{ or }}"
            )
        else:
            raise InvalidInput(
                f"message_template has a lone {text!r} at character {token.start()}: a placeholder is "
                "{name} (letters, digits and _), and a literal brace is written {{ or }}"
            )
        at = token.end()
    if at < len(template):
        parts.append(("text", template[at:]))
    return parts


def fields(parts: list[Part]) -> list[str]:
    return [value for kind, value in parts if kind == "field"]


def render(parts: list[Part], values: Any) -> str:
    """The message: a string value goes in as it is, any other JSON value as its compact JSON.
    A placeholder with no value in `values` raises MissingValue."""
    out: list[str] = []
    for kind, value in parts:
        if kind == "text":
            out.append(value)
            continue
        if not isinstance(values, dict) or value not in values:
            raise MissingValue(value)
        item = values[value]
        out.append(item if isinstance(item, str) else dump(item))
    return "".join(out)


class MissingValue(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name
