"""An MCP server's answers read within `BAE_MCP_OUTPUT_LIMIT`, however long they are.

A stdio server sends one JSON-RPC message per line. `LineReader` splits what the
server writes into lines; a short line is handed on whole, and a longer one (over
`SPILL` bytes, or the limit if less) goes through a `Shortener` as it arrives and is never held whole: the
memory an answer costs stays within about the limit whatever its length.

The `Shortener` copies the message's JSON as it streams, except its long strings
(over `SHORT_STRING` bytes): of those it keeps at most `limit` bytes of text in all,
in the order they come, and counts the rest. Outside strings nothing is parsed, and a
string's body is scanned by one regular expression per chunk, so a long text costs
little CPU. What comes out is rebuilt into an answer (`rebuild`):

- a `tools/call` result keeps its content blocks as far as the kept text goes, the
  text block that was cut ends with the sandbox's marker,
  `[output truncated: N bytes omitted]`, N counting the bytes of the content's text
  (and of the other content blocks) that were left out; a field other than
  `content` that was cut (`structuredContent`, which repeats the text) is left out;
- any other answer over the limit, or one whose JSON outside its long strings is
  itself over the limit, becomes a JSON-RPC error naming the limit, so the request
  it answers fails at once instead of waiting for its timeout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
import pydantic_core
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from bae.common.truncation import marker, utf8_prefix

log = logging.getLogger("bae.session.mcp")

# Strings up to this long (keys, ids, types, MIME types) are copied as they are.
SHORT_STRING = 256
# A line longer than this is read through a Shortener (which leaves one within the limit as it is).
SPILL = 64 * 1024
# The end of an over-long line kept to find its id when nothing before it could.
TAIL = 4096
# The longest escape (`\uXXXX`) less one: a longer remainder that no escape starts is not JSON.
MAX_CARRY = 5
TOOLS_CALL = "tools/call"

# A string's body: characters and whole escapes. It stops at the closing quote, and before
# an escape cut off by the end of the chunk, which is carried to the next one.
_BODY = re.compile(rb'(?:[^"\\]++|\\u[0-9a-fA-F]{4}|\\[^u])*+', re.S)
# The top-level object's last member, when it is the id (TypeScript servers write it last).
_TRAILING_ID = re.compile(rb'[,{]\s*"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")\s*\}\s*$', re.S)
_HIGH_SURROGATES = range(0xD800, 0xDC00)


def over_limit_text(total: int, limit: int) -> str:
    return f"the MCP server's answer of {total} bytes is over BAE_MCP_OUTPUT_LIMIT ({limit} bytes)"


@dataclass
class Cut:
    """One long string: the text kept of it (whole UTF-8 characters) and how many bytes were left out."""

    kept: bytes
    omitted: int

    @property
    def size(self) -> int:
        return len(self.kept) + self.omitted


class _LongString:
    """Decodes a long string's body piece by piece, keeping what the shared budget allows."""

    def __init__(self, shortener: Shortener) -> None:
        self._owner = shortener
        self._kept = bytearray()
        self._omitted = 0
        self._carry = b""  # the start of a UTF-8 character cut off by the piece's end
        self._held = ""  # a high surrogate waiting for the low one in the next piece

    def feed(self, raw: bytes) -> None:
        raw = self._carry + raw
        whole = utf8_prefix(raw)
        self._carry = raw[len(whole):]
        if not whole:
            return
        owner = self._owner
        if owner.budget <= 0 and b"\\" not in whole:
            self._omitted += len(whole)  # UTF-8 as it came: its length is its size
            return
        text = json.loads(b'"' + whole + b'"')
        if self._held:
            joined = (self._held + text[:1]).encode("utf-16-le", "surrogatepass")
            text = joined.decode("utf-16-le", "surrogatepass") + text[1:]
            self._held = ""
        if text and ord(text[-1]) in _HIGH_SURROGATES:
            text, self._held = text[:-1], text[-1]
        data = text.encode("utf-8", "surrogatepass")
        room = max(0, min(owner.budget, len(data)))
        if room:
            self._kept += data[:room]
            owner.budget -= room
        self._omitted += len(data) - room

    def finish(self) -> Cut:
        if self._held:  # not followed by its pair: counted as it is
            self._omitted += len(self._held.encode("utf-8", "surrogatepass"))
        if self._carry:
            raise ValueError("a string ends inside a UTF-8 character")
        kept = utf8_prefix(bytes(self._kept))  # the budget may have ended inside a character
        return Cut(kept, self._omitted + len(self._kept) - len(kept))


class Shortener:
    """Reads one over-long JSON-RPC message as it comes (see the module's docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.budget = limit  # bytes of long strings' text still to keep
        self.total = 0
        self.overflowed = False
        self._out = bytearray()  # the message, each long string replaced by a placeholder
        self._cuts: list[Cut] = []
        self._nonce = uuid.uuid4().hex
        self._in_string = False
        self._short = bytearray()  # the current string's body while it is short
        self._long: _LongString | None = None
        self._carry = b""  # an escape cut off by the chunk's end
        self._tail = b""
        self._early: dict[str, Any] = {}  # what could be read of the message when it overflowed

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self._tail = (self._tail + data)[-TAIL:]
        if self.overflowed:
            return
        data = self._carry + data if self._carry else data
        self._carry = b""
        pos, end = 0, len(data)
        while pos < end:
            if not self._in_string:
                quote = data.find(b'"', pos)
                stop = end if quote < 0 else quote
                self._out += data[pos:stop]
                if quote < 0:
                    break
                self._in_string = True
                pos = quote + 1
                continue
            body_end = _BODY.match(data, pos).end()  # type: ignore[union-attr]  # matches the empty string at least
            closed = body_end < end and data[body_end] == 0x22  # the closing quote
            try:
                self._string_piece(data[pos:body_end])
                if closed:
                    self._string_end()
            except ValueError:  # an escape or a character that is not JSON
                self._overflow()
                return
            if closed:
                self._in_string = False
                pos = body_end + 1
            else:
                self._carry = data[body_end:]  # nothing, or an escape the next chunk completes
                if len(self._carry) > MAX_CARRY:
                    self._overflow()  # not JSON: only its id may still be found
                    return
                break
            if len(self._out) > self.limit:
                self._overflow()
                return
        if len(self._out) > self.limit:
            self._overflow()

    def _string_piece(self, raw: bytes) -> None:
        if self._long is not None:
            self._long.feed(raw)
            return
        self._short += raw
        if len(self._short) > SHORT_STRING:
            self._long = _LongString(self)
            self._long.feed(bytes(self._short))
            self._short.clear()

    def _string_end(self) -> None:
        if self._long is None:
            self._out += b'"' + self._short + b'"'
            self._short.clear()
            return
        self._out += json.dumps(self._placeholder(len(self._cuts))).encode()
        self._cuts.append(self._long.finish())
        self._long = None

    def _placeholder(self, index: int) -> str:
        return f"\x00{self._nonce}:{index}"

    def _overflow(self) -> None:
        """Give the content up (its structure alone is over the limit, or it is not JSON): only its id is still of use."""
        self.overflowed = True
        try:
            early = pydantic_core.from_json(bytes(self._out), allow_partial=True)
        except ValueError:
            early = None
        self._early = early if isinstance(early, dict) else {}
        self._out = bytearray()
        self._cuts = []
        self._long = None

    def message_id(self) -> int | str | None:
        """The message's id as far as it can be found without the whole message, else None."""
        found = self._early.get("id")
        if found is None and (match := _TRAILING_ID.search(self._tail)):
            with contextlib.suppress(ValueError):
                found = json.loads(match.group(1))
        return _request_id(found)

    def finish(self) -> tuple[dict[str, Any], dict[str, Cut]] | None:
        """The message with its long strings as placeholders, and each placeholder's cut;
        None when it overflowed or is not JSON."""
        if self.overflowed or self._in_string or self._carry:
            return None
        try:
            message = json.loads(self._out)
        except ValueError:
            return None
        if not isinstance(message, dict):
            return None
        return message, {self._placeholder(index): cut for index, cut in enumerate(self._cuts)}


def rebuild(shortener: Shortener, method_of: dict[int | str, str]) -> Iterator[SessionMessage | Exception]:
    """What a long line delivers: its message as it came when nothing was left out; else the
    shortened answer, or an error for the request(s) it answers, or nothing for a request or
    notification of the server's own (dropped, logged).
    `method_of` maps the ids of the requests awaiting an answer to their methods."""
    try:
        read = shortener.finish()
    except ValueError:
        read = None
    if read is not None:
        message, cuts = read
        if all(cut.omitted == 0 for cut in cuts.values()):
            try:
                yield SessionMessage(types.jsonrpc_message_adapter.validate_python(_restored(message, cuts), by_name=False))
            except ValidationError as exc:
                yield exc
            return
        if "method" in message:
            log.warning("MCP server message over BAE_MCP_OUTPUT_LIMIT dropped method=%.100s", message["method"])
            return
        message_id = _request_id(message.get("id"))
        if message_id is not None and method_of.get(message_id) == TOOLS_CALL and isinstance(message.get("result"), dict):
            message["result"] = shortened_result(message["result"], cuts)
            try:
                yield SessionMessage(types.JSONRPCResponse.model_validate(message))
                return
            except ValidationError:
                pass
    else:
        message_id = shortener.message_id()
    error = types.ErrorData(code=types.INTERNAL_ERROR, message=over_limit_text(shortener.total, shortener.limit))
    if message_id is None:
        # An answer whose request cannot be told fails every request still waiting: none may hang.
        answered: Iterable[int | str] = list(method_of)
    elif message_id in method_of:
        answered = [message_id]
    else:
        answered = []  # the answer of a request no longer waiting (timed out)
    for request_id in answered:
        yield SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))


def _request_id(value: Any) -> int | str | None:
    """A JSON-RPC id as the SDK's requests carry them (a bool is no id, though Python counts it an int)."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


def shortened_result(result: dict[str, Any], cuts: dict[str, Cut]) -> dict[str, Any]:
    """A tools/call result with its placeholders replaced by the kept text, and the marker."""
    omitted = 0
    content: list[Any] = []
    raw_content = result.get("content")
    for block in raw_content if isinstance(raw_content, list) else []:
        inside = list(_placeholders(block, cuts))
        if all(cuts[p].omitted == 0 for p in inside):
            content.append(_restored(block, cuts))
        elif isinstance(block, dict) and block.get("type") == "text" and inside == [block.get("text")]:
            cut = cuts[block["text"]]
            omitted += cut.omitted
            if cut.kept:
                content.append({**_restored(block, cuts), "text": _text(cut)})
        else:
            omitted += sum(cuts[p].size for p in inside)  # a block cut short is no block: all of it goes
    shortened = {"content": content}
    for key, value in result.items():
        if key != "content" and all(cuts[p].omitted == 0 for p in _placeholders(value, cuts)):
            shortened[key] = _restored(value, cuts)
    if omitted:
        if content and isinstance(content[-1], dict) and isinstance(content[-1].get("text"), str):
            content[-1] = {**content[-1], "text": content[-1]["text"] + marker(omitted)}
        else:
            content.append({"type": "text", "text": marker(omitted)})
    return shortened


def _text(cut: Cut) -> str:
    # A lone surrogate escape was counted as its three bytes; as text it is a replacement character.
    return cut.kept.decode("utf-8", "replace")


def _placeholders(value: Any, cuts: dict[str, Cut]) -> Iterator[str]:
    if isinstance(value, str):
        if value in cuts:
            yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _placeholders(key, cuts)
            yield from _placeholders(item, cuts)
    elif isinstance(value, list):
        for item in value:
            yield from _placeholders(item, cuts)


def _restored(value: Any, cuts: dict[str, Cut]) -> Any:
    if isinstance(value, str):
        return _text(cuts[value]) if value in cuts else value
    if isinstance(value, dict):
        return {_restored(key, cuts): _restored(item, cuts) for key, item in value.items()}
    if isinstance(value, list):
        return [_restored(item, cuts) for item in value]
    return value


@dataclass
class LineReader:
    """Splits a stdio server's output into messages, reading a long line through a Shortener."""

    limit: int
    _parts: list[bytes] = field(default_factory=list)
    _length: int = 0
    _shortener: Shortener | None = None

    def feed(self, data: bytes) -> Iterator[bytes | Shortener]:
        """Each line `data` completes: its bytes, or the Shortener that read it (pieces of at most
        SPILL bytes keep what is decoded at once small)."""
        start = 0
        while (newline := data.find(b"\n", start)) >= 0:
            self._take(data[start:newline])
            start = newline + 1
            yield self._line()
        if start < len(data):
            self._take(data[start:])

    def _take(self, piece: bytes) -> None:
        if self._shortener is not None:
            self._shortener.feed(piece)
            return
        self._parts.append(piece)
        self._length += len(piece)
        if self._length > min(self.limit, SPILL):
            self._shortener = Shortener(self.limit)
            parts, self._parts = self._parts, []
            for part in parts:
                self._shortener.feed(part)

    def _line(self) -> bytes | Shortener:
        shortener, self._shortener = self._shortener, None
        line = b"".join(self._parts)
        self._parts, self._length = [], 0
        return shortener if shortener is not None else line
