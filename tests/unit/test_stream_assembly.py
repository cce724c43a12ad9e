"""A streamed response put together into the body the same call answers without streaming."""

from __future__ import annotations

import pytest

from bae.services.runner import anthropic_wire, openai_wire
from bae.services.runner.canonical import DeltaKind, Piece, WireFormatError

pytestmark = pytest.mark.unit

ANTHROPIC_EVENTS = [
    {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}},
    {"type": "ping"},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hm."}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Let "}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": ""}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "me."}},
    {"type": "content_block_stop", "index": 1},
    {"type": "content_block_start", "index": 2, "content_block": {
        "type": "tool_use", "id": "tu_1", "name": "get_time", "input": {}}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"zone": '}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '"UTC"}'}},
    {"type": "content_block_stop", "index": 2},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
     "usage": {"output_tokens": 7, "input_tokens": None}},
    {"type": "message_stop"},
]


def test_anthropic_events_become_the_message_and_its_pieces() -> None:
    assembly = anthropic_wire.StreamAssembly()
    pieces = [piece for event in ANTHROPIC_EVENTS for piece in assembly.feed(event)]
    assert pieces == [
        Piece(0, DeltaKind.THINKING, "Hm."), Piece(1, DeltaKind.TEXT, "Let "), Piece(1, DeltaKind.TEXT, "me."),
        Piece(2, DeltaKind.TOOL_INPUT, '{"zone": '), Piece(2, DeltaKind.TOOL_INPUT, '"UTC"}'),
    ]
    assert assembly.body() == {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [
            {"type": "thinking", "thinking": "Hm.", "signature": "sig"},
            {"type": "text", "text": "Let me."},
            {"type": "tool_use", "id": "tu_1", "name": "get_time", "input": {"zone": "UTC"}},
        ],
        "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 7},
    }


@pytest.mark.parametrize("cut", [0, 1, 5, len(ANTHROPIC_EVENTS) - 1])
def test_an_anthropic_stream_that_ends_early_is_no_response(cut: int) -> None:
    assembly = anthropic_wire.StreamAssembly()
    for event in ANTHROPIC_EVENTS[:cut]:
        assembly.feed(event)
    with pytest.raises(WireFormatError):
        assembly.body()


def test_anthropic_events_out_of_order_are_refused() -> None:
    assembly = anthropic_wire.StreamAssembly()
    with pytest.raises(WireFormatError):
        assembly.feed({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    assembly.feed(ANTHROPIC_EVENTS[0])
    with pytest.raises(WireFormatError):
        assembly.feed({"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": "x"}})


def chunk(delta: dict | None = None, finish: str | None = None, **extra: object) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c1", "object": "chat.completion.chunk", "created": 5, "model": "g", "choices": choices, **extra}


def test_openai_chunks_become_the_completion_and_its_pieces() -> None:
    assembly = openai_wire.StreamAssembly()
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Looking"}),
        chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "get_time", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"zone":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"UTC"}'}}]}),
        chunk({}, finish="tool_calls"),
        chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}),
    ]
    pieces = [piece for item in chunks for piece in assembly.feed(item)]
    assert pieces == [Piece(0, DeltaKind.TEXT, "Looking"), Piece(1, DeltaKind.TOOL_INPUT, '{"zone":'),
                      Piece(1, DeltaKind.TOOL_INPUT, '"UTC"}')]
    assert assembly.body() == {
        "id": "c1", "object": "chat.completion", "created": 5, "model": "g",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Looking",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "get_time", "arguments": '{"zone":"UTC"}'}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    assert openai_wire.assistant_message(assembly.body())["content"][1]["input"] == {"zone": "UTC"}


def test_an_openai_stream_without_a_finish_reason_is_no_response() -> None:
    assembly = openai_wire.StreamAssembly()
    assembly.feed(chunk({"role": "assistant", "content": "Hal"}))
    with pytest.raises(WireFormatError):
        assembly.body()


def test_an_openai_stream_of_only_tool_calls_has_null_content() -> None:
    assembly = openai_wire.StreamAssembly()
    assembly.feed(chunk({"role": "assistant", "content": None}))
    assembly.feed(chunk({"tool_calls": [{"index": 0, "id": "c", "type": "function",
                                         "function": {"name": "f", "arguments": "{}"}}]}, finish="tool_calls"))
    assert assembly.body()["choices"][0]["message"]["content"] is None
