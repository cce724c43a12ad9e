"""A stdio MCP server's output read within BAE_MCP_OUTPUT_LIMIT: lines split, an over-long one
read as it streams and shortened exactly, whatever the chunks; the setting."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import pytest

from bae.common.errors import UsageError
from bae.common.settings import load_settings
from bae.common.truncation import marker
from bae.services.session.remote.mcp_output import LineReader, Shortener, rebuild

pytestmark = pytest.mark.unit

LIMIT = 1000


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def read(lines: bytes, size: int, limit: int = LIMIT) -> list[bytes | Shortener]:
    reader = LineReader(limit)
    return [line for chunk in chunks(lines, size) for line in reader.feed(chunk)]


def answer(line: bytes, size: int, waiting: dict[int | str, str] | None = None) -> list[Any]:
    """What the transport delivers for one line fed in chunks of `size`."""
    (read_line,) = read(line + b"\n", size)
    assert isinstance(read_line, Shortener)
    return [m.message for m in rebuild(read_line, {7: "tools/call"} if waiting is None else waiting)]


def python_server_line(text: str, request_id: int = 7, is_error: bool = False) -> bytes:
    """A tools/call answer as the Python SDK's server writes it (jsonrpc, id, result; text twice)."""
    result = {"content": [{"text": text, "type": "text"}], "isError": is_error, "structuredContent": {"result": text}}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}, ensure_ascii=False, separators=(",", ":")).encode()


def test_lines_within_the_limit_come_whole_whatever_the_chunks() -> None:
    lines = b'{"a":1}\n\n' + b'{"b":"' + b"x" * 900 + b'"}\n' + b"partial"
    for size in (1, 7, 64, len(lines)):
        assert read(lines, size) == [b'{"a":1}', b"", b'{"b":"' + b"x" * 900 + b'"}']


@pytest.mark.parametrize("size", [1, 3, 100, 4096, 1 << 20])
@pytest.mark.parametrize(
    "text",
    [
        "x" * 5000,  # plain
        "line\n\t\"quoted\" \\ " * 400,  # escapes: 2 bytes on the wire, 1 in the text
        "é€😀" * 700,  # multi-byte characters written raw
    ],
)
def test_a_long_result_keeps_the_first_limit_bytes_and_counts_the_rest_exactly(text: str, size: int) -> None:
    (message,) = answer(python_server_line(text), size)
    assert isinstance(message, types.JSONRPCResponse) and message.id == 7
    data = text.encode()
    kept = data[:LIMIT].decode("utf-8", "ignore")  # cut back to a whole character
    assert message.result == {
        "content": [{"text": kept + marker(len(data) - len(kept.encode())), "type": "text"}],
        "isError": False,  # structuredContent, cut too, is left out
    }


@pytest.mark.parametrize("size", [1, 5, 4096])
def test_escaped_characters_and_surrogate_pairs_count_as_their_utf8_bytes(size: int) -> None:
    text = "😀\u00e9\u0001" * 600
    line = json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": text}]}}).encode()
    assert b"\\ud83d\\ude00" in line  # ensure_ascii: every character an escape
    (message,) = answer(line, size)
    data = text.encode()
    kept = data[:LIMIT].decode("utf-8", "ignore")
    assert message.result["content"] == [{"type": "text", "text": kept + marker(len(data) - len(kept.encode()))}]


def test_the_id_written_last_is_found_and_blocks_after_the_cut_are_counted() -> None:
    # A TypeScript server writes result first and the id last.
    result = {
        "content": [
            {"type": "text", "text": "a" * 600},
            {"type": "text", "text": "b" * 700},
            {"type": "image", "data": "c" * 800, "mimeType": "image/png"},
            {"type": "text", "text": "short"},
        ],
        "isError": True,
    }
    line = json.dumps({"result": result, "jsonrpc": "2.0", "id": "req-1"}).encode()
    (message,) = answer(line, 64, {"req-1": "tools/call"})
    assert message.id == "req-1"
    # 600 + 400 bytes of text kept; 300 of b, all 800 of the image that no longer fits are left out.
    assert message.result == {
        "content": [
            {"type": "text", "text": "a" * 600},
            {"type": "text", "text": "b" * 400},
            {"type": "text", "text": "short" + marker(300 + 800)},
        ],
        "isError": True,
    }


def test_an_answer_to_another_method_over_the_limit_is_an_error_for_its_request() -> None:
    line = python_server_line("x" * 5000, request_id=3)
    (message,) = answer(line, 512, {3: "tools/list", 4: "tools/call"})
    assert isinstance(message, types.JSONRPCError) and message.id == 3
    assert message.error.code == types.INTERNAL_ERROR
    assert message.error.message == f"the MCP server's answer of {len(line)} bytes is over BAE_MCP_OUTPUT_LIMIT ({LIMIT} bytes)"


def test_an_answer_whose_structure_is_over_the_limit_fails_its_request_by_the_id_it_starts_with() -> None:
    line = json.dumps({"jsonrpc": "2.0", "id": 9, "result": {"content": [{"type": "text", "text": "y"}] * 500}}).encode()
    (message,) = answer(line, 100, {9: "tools/call", 10: "tools/call"})
    assert isinstance(message, types.JSONRPCError) and message.id == 9


@pytest.mark.parametrize("bad", [b"\\x41", b"\\u12G4"])
def test_an_answer_that_is_not_json_fails_its_request(bad: bytes) -> None:
    line = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"' + b"x" * 3000 + bad + b"x" * 3000 + b'"}]}}'
    (message,) = answer(line, 512)
    assert isinstance(message, types.JSONRPCError) and message.id == 7


def test_an_answer_without_an_id_that_can_be_found_fails_every_waiting_request() -> None:
    line = b'{"jsonrpc":"2.0","result":{"content":[{"type":"text","text":"' + b"z" * 5000 + b'"}]},"id":5'  # cut off
    messages = answer(line, 256, {1: "tools/call", 2: "tools/list"})
    assert [(m.id, type(m)) for m in messages] == [(1, types.JSONRPCError), (2, types.JSONRPCError)]


def test_an_answer_to_a_request_no_longer_waiting_is_dropped() -> None:
    assert answer(python_server_line("x" * 5000, request_id=3), 512, {4: "tools/call"}) == []


def test_a_long_message_of_the_server_itself_is_dropped() -> None:
    line = json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "n" * 5000}}).encode()
    assert answer(line, 512) == []


def test_a_long_line_within_the_limit_comes_through_as_it_was() -> None:
    listing = {"jsonrpc": "2.0", "id": 2, "result": {"tools": [{"name": f"t{i}", "description": "d" * 300} for i in range(400)]}}
    line = json.dumps(listing).encode()
    assert 64 * 1024 < len(line) < 1 << 20
    (read_line,) = read(line + b"\n", 4096, limit=1 << 20)
    assert isinstance(read_line, Shortener)
    (message,) = [m.message for m in rebuild(read_line, {2: "tools/list"})]
    assert message == types.JSONRPCResponse.model_validate(listing)


def test_memory_stays_within_the_limit_while_a_long_line_streams() -> None:
    reader = LineReader(LIMIT)
    head = python_server_line("x" * 10)[:-40]  # up to the text's opening quote, roughly
    assert list(reader.feed(head)) == []
    for _ in range(2000):
        assert list(reader.feed(b"x" * 4096)) == []
    shortener = reader._shortener
    assert shortener is not None and len(shortener._out) < 200
    assert shortener._long is not None and len(shortener._long._kept) <= LIMIT


def test_the_limit_setting() -> None:
    assert load_settings({}).mcp_output_limit == 1048576
    assert load_settings({"BAE_MCP_OUTPUT_LIMIT": "2048"}).mcp_output_limit == 2048
    for value in ("1023", "16777217", "-1", "1k"):
        with pytest.raises(UsageError, match="BAE_MCP_OUTPUT_LIMIT"):
            load_settings({"BAE_MCP_OUTPUT_LIMIT": value})
