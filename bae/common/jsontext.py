"""The one JSON text form of the project: compact, UTF-8, with pre-serialized parts spliced in.

Stored payloads are written in exactly this form, so an event's stored
payload text can be spliced into a response unchanged. `RawJson` carries
text that is already JSON (a runner event's payload, a history message) so
that large documents are serialized once on their way from the runner to
the store and the wire, not once per hop.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson

# orjson writes the same compact UTF-8 form as this encoder, 10-30x faster (a provider request
# carries the whole history); the standard library takes what orjson refuses: integers beyond
# 64 bits (valid client input) and lone surrogates. A non-finite float becomes null.
# A JSON object as Python reads it: an event payload, a message, a content block, a tool declaration.
JsonObject = dict[str, Any]

_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS


def _encode(value: Any) -> str:
    try:
        return orjson.dumps(value, option=_ORJSON_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _encoder.encode(value)


@dataclass(frozen=True)
class RawJson:
    """Text that is already one JSON value, in this module's form."""

    text: str


def dump(value: Any) -> str:
    """Compact JSON; a `RawJson` value, or one directly inside a dict or list, goes in verbatim."""
    if isinstance(value, RawJson):
        return value.text
    if isinstance(value, dict) and any(isinstance(item, RawJson) for item in value.values()):
        return "{" + ",".join(f"{_encode(key)}:{dump(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list) and any(isinstance(item, RawJson) for item in value):
        return "[" + ",".join(dump(item) for item in value) + "]"
    return _encode(value)


def load(text: str | None) -> Any:
    """Trusted JSON text (stored payloads, the runner's messages and provider bodies).

    orjson reads it about twice as fast as the standard library, which matters for a history of
    a thousand messages read on every provider step. But orjson reads an integer beyond 64 bits
    as a float, silently losing digits: a text with a run of 19 digits anywhere (one byte scan,
    a fifth of the parse) goes to the standard library, as does whatever orjson refuses (NaN,
    a lone surrogate), so the result is always the standard library's.
    """
    if text is None:
        return None
    if _LONG_DIGIT_RUN not in text.encode("utf-8", "surrogatepass").translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


# Every digit becomes "0", so a run of digits is a run of zeros: the shortest integer orjson
# may misread has 19 (below -2**63).
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGIT_RUN = b"0" * 19


class JsonSyntaxError(ValueError):
    """Input that is not standard JSON; the message says why (and where, when known)."""


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JsonSyntaxError("number out of range")
    return value


def _integer(text: str) -> int:
    # Exact, like every integer in range; but one beyond a double's range is refused
    # like such a float (and Python would otherwise build a 5,000-digit int).
    if len(text.lstrip("-")) > _MAX_INTEGER_DIGITS:
        raise JsonSyntaxError("number out of range")
    return int(text)


def _no_constant(name: str) -> None:
    raise JsonSyntaxError(f"{name} is not a JSON value")


# The largest double is about 1.8e308: 309 digits.
_MAX_INTEGER_DIGITS = 309
_strict = json.JSONDecoder(parse_float=_finite_float, parse_int=_integer, parse_constant=_no_constant)


def strict_load(text: str | bytes) -> Any:
    """Client input as standard JSON only: no NaN/Infinity, no number that overflows a float,
    no nesting deeper than the interpreter's recursion limit, no `\\u` escape of half a surrogate
    pair (a string that is not Unicode: protobuf, the store and UTF-8 itself refuse it later).
    Raises JsonSyntaxError."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        document = _strict.decode(text)
    except UnicodeDecodeError:
        raise JsonSyntaxError("invalid UTF-8") from None
    except json.JSONDecodeError as exc:
        message = exc.msg[0].lower() + exc.msg[1:]
        raise JsonSyntaxError(f"{message} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise JsonSyntaxError("nesting too deep") from None
    if _SURROGATE_ESCAPE.search(text):  # rare: a pair, as `ensure_ascii` writers send emoji, or half of one
        _refuse_lone_surrogates(text)
    return document


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# In valid JSON every backslash starts an escape inside a string, so this walks them all in order.
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def _refuse_lone_surrogates(text: str) -> None:
    """Raise JsonSyntaxError, in serde's words and at its position, at the first `\\u` escape of a
    surrogate that is not a high one directly followed by an escaped low one."""
    escapes = _ESCAPE.finditer(text)
    for escape in escapes:
        unit = int(escape.group(1) or "0", 16)
        if 0xDC00 <= unit <= 0xDFFF:
            _refuse("lone leading surrogate in hex escape", text, escape.end())
        if 0xD800 <= unit <= 0xDBFF:
            low = next(escapes, None)
            if low is None or low.start() != escape.end():
                _refuse("unexpected end of hex escape", text, escape.end())
            if low.group(1) is None:
                _refuse("unexpected end of hex escape", text, escape.end() + 1)
            if not 0xDC00 <= int(low.group(1), 16) <= 0xDFFF:
                _refuse("lone leading surrogate in hex escape", text, low.end())


def _refuse(reason: str, text: str, end: int) -> NoReturn:
    """`end` is the index after the last character read: its column is that character's."""
    line_start = text.rfind("\n", 0, end) + 1
    line = text.count("\n", 0, line_start) + 1
    raise JsonSyntaxError(f"{reason} at line {line} column {end - line_start}")
