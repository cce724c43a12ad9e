"""The demo provider's script (bae/services/runner/demo.py): what it answers to a request's last message."""

from __future__ import annotations

import pytest

from bae.services.runner.demo import reply_blocks, stream_events

pytestmark = pytest.mark.unit


def tools(*names: str) -> list[dict]:
    return [{"name": name, "input_schema": {"type": "object"}} for name in names]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def calls(blocks: list[dict]) -> list[tuple[str, dict]]:
    assert all(block["id"].startswith("toolu_demo_") for block in blocks if block["type"] == "tool_use")
    return [(block["name"], block["input"]) for block in blocks if block["type"] == "tool_use"]


def test_text_naming_no_tool_is_echoed() -> None:
    assert reply_blocks(user("Hello, BAE!"), tools("get_current_time")) == [
        {"type": "text", "text": "[demo] you said: Hello, BAE!"}]
    assert reply_blocks([], []) == [{"type": "text", "text": "[demo] you said: "}]


def test_a_named_tool_without_json_is_called_with_an_empty_input() -> None:
    blocks = reply_blocks(user("What time is it? Please call GET_CURRENT_TIME."), tools("echo", "get_current_time"))
    assert blocks[0] == {"type": "text", "text": "[demo] calling get_current_time"}
    assert calls(blocks) == [("get_current_time", {})]
    # Braces elsewhere than right after the name change nothing.
    assert calls(reply_blocks(user("call get_current_time, then {x}"), tools("get_current_time"))) == [
        ("get_current_time", {})]
    # Several named: the first in the request's order.
    assert calls(reply_blocks(user("echo or get_current_time"), tools("get_current_time", "echo"))) == [
        ("get_current_time", {})]


def test_a_name_followed_by_a_json_object_is_called_with_it() -> None:
    blocks = reply_blocks(user('Please add {"a": 2, "b": 3} for me'), tools("add"))
    assert blocks[0] == {"type": "text", "text": "[demo] calling add"}
    assert calls(blocks) == [("add", {"a": 2, "b": 3})]
    assert calls(reply_blocks(user('ADD\n  {"nested": {"x": [1, "}"]}}'), tools("add"))) == [
        ("add", {"nested": {"x": [1, "}"]}})]


def test_several_calls_in_the_order_of_the_text() -> None:
    blocks = reply_blocks(user('sh {"command": "ls"} then add {"a": 1} and sh {"command": "add {\\"a\\": 9}"}'),
                          tools("add", "sh"))
    assert blocks[0] == {"type": "text", "text": "[demo] calling sh, add, sh"}
    # The name inside the last command's text is part of that input, not a call.
    assert calls(blocks) == [("sh", {"command": "ls"}), ("add", {"a": 1}), ("sh", {"command": 'add {"a": 9}'})]


def test_overlapping_names_the_earliest_then_the_longest_wins() -> None:
    assert calls(reply_blocks(user('bash {"command": "true"}'), tools("sh", "bash"))) == [("bash", {"command": "true"})]
    assert calls(reply_blocks(user('read_file {"path": "a"}'), tools("read", "read_file"))) == [
        ("read_file", {"path": "a"})]


def test_an_object_that_does_not_parse_is_reported_with_no_call() -> None:
    blocks = reply_blocks(user('add {"a": 2,}'), tools("add"))
    assert len(blocks) == 1 and blocks[0]["type"] == "text"
    assert blocks[0]["text"].startswith("[demo] cannot read the input of add: Expecting property name")


def test_tool_results_are_reported_by_tool_name() -> None:
    messages = [
        {"role": "user", "content": 'add {"a": 2, "b": 3}'},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "add", "input": {"a": 2}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1",
                                      "content": [{"type": "text", "text": "5"}]},
                                     {"type": "tool_result", "tool_use_id": "tu_x", "content": "?"}]},
    ]
    assert reply_blocks(messages, tools("add")) == [
        {"type": "text", "text": "[demo] add returned: 5\n[demo] the tool returned: ?"}]


def test_the_stream_is_the_same_message_in_anthropic_events() -> None:
    from bae.services.runner.anthropic_wire import StreamAssembly

    blocks = reply_blocks(user('Hello sh {"command": "ls -l"}'), tools("sh"))
    message = {"id": "msg_demo_1", "type": "message", "role": "assistant", "model": "bae-demo-echo",
               "content": blocks, "stop_reason": "tool_use", "stop_sequence": None,
               "usage": {"input_tokens": 12, "output_tokens": 7}}
    events = stream_events(message)
    assert [event["type"] for event in events] == [
        "message_start", "content_block_start", *["content_block_delta"] * 3, "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert [e["delta"]["text"] for e in events if e["type"] == "content_block_delta" and e["index"] == 0] == [
        "[demo] ", "calling ", "sh"]
    # Put together as the runner does, the stream is the message the same request answers unstreamed.
    assembly = StreamAssembly()
    for event in events:
        assembly.feed(event)
    assert assembly.body() == message
