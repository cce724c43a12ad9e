"""Translation between the canonical shape and the provider wire formats (SERVER-SPEC §8.4–8.5)."""

from __future__ import annotations

import json

import pytest

from bae.services.runner import anthropic_wire, openai_wire
from bae.common.jsontext import RawJson
from bae.services.runner.canonical import History, Usage, WireFormatError, strip_routing_fields

pytestmark = pytest.mark.unit

PREAMBLE = "The earlier part of this conversation was compacted. A summary follows."


# --- stripping -----------------------------------------------------------------


def test_strip_removes_dispatch_and_caller_from_tool_use_only():
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "tu_1", "name": "t", "input": {}, "dispatch": "client", "caller": {"x": 1}},
            ],
        },
        # dispatch on a non-tool_use block is not ours to touch
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "r", "dispatch": "x"}]},
    ]
    stripped = strip_routing_fields(messages)
    assert stripped[1]["content"][1] == {"type": "tool_use", "id": "tu_1", "name": "t", "input": {}}
    assert stripped[2] is messages[2]
    assert "dispatch" in messages[1]["content"][1], "the caller's list must not be mutated"


def test_a_history_without_routing_fields_is_left_as_it_came():
    texts = ['{"role": "user", "content": "hi"}', '{"role":"assistant","content":[{"type":"text","text":"yo"}]}']
    history = History(texts, ["user", "assistant"])
    assert history.without_routing_fields() is history
    assert history.json == RawJson("[" + ",".join(texts) + "]")
    assert "messages" not in vars(history), "no message was read"


def test_only_the_messages_that_name_a_routing_field_are_read_and_rewritten():
    call = {"type": "tool_use", "id": "tu_1", "name": "t", "input": {}, "dispatch": "client"}
    texts = [
        '{"role": "user", "content": "hi"}',
        json.dumps({"role": "assistant", "content": [call]}),
        # Names one, but not on a tool_use block: read, and left as it was.
        json.dumps({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "dispatch": "x"}]}),
    ]
    stripped = History(texts, ["user", "assistant", "user"]).without_routing_fields()
    assert stripped.texts[0] is texts[0]
    assert json.loads(stripped.texts[1]) == {"role": "assistant", "content": [{k: v for k, v in call.items() if k != "dispatch"}]}
    assert json.loads(stripped.texts[2]) == json.loads(texts[2])
    assert stripped.roles == ["user", "assistant", "user"]


# --- anthropic normalization ---------------------------------------------------


ROUTED = json.dumps({"role": "assistant", "content": [
    {"type": "tool_use", "id": "tu_1", "name": "t", "input": {}, "dispatch": "client"}]})


def message(role: str) -> str:
    return json.dumps({"role": role, "content": f"a {role} message"})


@pytest.mark.parametrize(
    ("held", "added"),
    [
        (["user", "assistant"], ["user"]),
        (["user", "assistant"], ["assistant"]),  # the roles repeat where the two meet
        (["user", "assistant"], ["user", "user"]),  # they repeat among the new messages
        (["assistant", "user"], ["assistant"]),  # it starts with the wrong role
        (["user"], []),
        (["user", "routed"], ["user"]),
        (["user", "assistant"], ["user", "routed"]),
    ],
)
def test_an_extended_history_knows_what_a_fresh_one_finds_out(held, added):
    def texts(roles: list[str]) -> tuple[list[str], list[str]]:
        return [ROUTED if role == "routed" else message(role) for role in roles], [
            "assistant" if role == "routed" else role for role in roles]

    shorter = History(*texts(held))
    shorter.without_routing_fields()
    anthropic_wire.normalize_history(shorter)
    longer = shorter.extended(*texts(added))
    fresh = History(*texts(held + added))
    assert vars(longer)["names_routing_fields"] == fresh.names_routing_fields
    assert vars(longer)["alternates_from_user"] == fresh.alternates_from_user
    assert (longer.texts, longer.roles) == (fresh.texts, fresh.roles)
    # Nothing found out yet: the longer history finds out for itself.
    unexamined = History(*texts(held)).extended(*texts(added))
    assert "names_routing_fields" not in vars(unexamined)
    assert unexamined.alternates_from_user == fresh.alternates_from_user


def test_normalize_leaves_well_formed_history_alone():
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert anthropic_wire.normalize(messages) == (messages, None)
    assert anthropic_wire.normalize([]) == ([], None)


def test_a_history_whose_roles_alternate_from_user_is_not_read():
    history = History(['{"role":"user","content":"a"}', '{"role":"assistant","content":"b"}'], ["user", "assistant"])
    assert anthropic_wire.normalize_history(history) == (history, None)
    assert "messages" not in vars(history)


def test_a_history_whose_roles_repeat_is_folded_as_normalize_folds_it():
    messages = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"}]
    history = History([json.dumps(message) for message in messages], [message["role"] for message in messages])
    folded, normalized = anthropic_wire.normalize_history(history)
    assert (folded.messages, normalized) == anthropic_wire.normalize(messages)
    assert folded.roles == ["user", "assistant", "user"]


def test_normalize_prepends_user_before_assistant_first_history():
    messages = [{"role": "assistant", "content": "summary"}, {"role": "user", "content": "next"}]
    sent, normalized = anthropic_wire.normalize(messages)
    assert sent == [
        {"role": "user", "content": [{"type": "text", "text": PREAMBLE}]},
        {"role": "assistant", "content": "summary"},
        {"role": "user", "content": "next"},
    ]
    assert normalized == {"prepended_user": True, "merged": []}


def test_normalize_merges_runs_with_indices_after_prepend():
    messages = [
        {"role": "assistant", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]},
        {"role": "user", "content": "u3"},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
    ]
    sent, normalized = anthropic_wire.normalize(messages)
    # preamble (0) is user, then assistant (1), then the user run 2..4, then assistant (5)
    assert normalized == {"prepended_user": True, "merged": [[2, 3, 4]]}
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant"]
    assert sent[2]["content"] == [
        {"type": "text", "text": "u1"},
        {"type": "tool_result", "tool_use_id": "t", "content": "r"},
        {"type": "text", "text": "u3"},
    ]


def test_normalize_merge_without_prepend():
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "assistant", "content": "c"},
    ]
    sent, normalized = anthropic_wire.normalize(messages)
    assert normalized == {"prepended_user": False, "merged": [[1, 2]]}
    assert sent[1] == {"role": "assistant", "content": [{"type": "text", "text": "b"}, {"type": "text", "text": "c"}]}


# --- usage ---------------------------------------------------------------------


def test_anthropic_usage_adds_cache_fields():
    body = {
        "usage": {
            "input_tokens": 10,
            "output_tokens": 7,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 5,
        }
    }
    # The cache counts are kept apart too, for usage accounting.
    assert anthropic_wire.usage(body) == Usage(115, 7, cache_read_input_tokens=100, cache_creation_input_tokens=5)
    assert anthropic_wire.usage({"usage": {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": None}}) == Usage(3, 4)


@pytest.mark.parametrize(
    "body",
    [{}, {"usage": None}, {"usage": {"input_tokens": 3}}, {"usage": {"output_tokens": 3}}, {"usage": {"input_tokens": "3", "output_tokens": 1}}],
)
def test_anthropic_missing_or_partial_usage_is_none(body):
    assert anthropic_wire.usage(body) is None


def test_openai_usage():
    assert openai_wire.usage({"usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}) == Usage(12, 3)
    # prompt_tokens counts the cached ones too; a cached count over it is cut to it.
    cached = {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}
    assert openai_wire.usage({"usage": cached}) == Usage(12, 3, cache_read_input_tokens=8)
    overcount = {**cached, "prompt_tokens_details": {"cached_tokens": 50}}
    assert openai_wire.usage({"usage": overcount}) == Usage(12, 3, cache_read_input_tokens=12)
    assert openai_wire.usage({"usage": {"prompt_tokens": 12}}) is None
    assert openai_wire.usage({}) is None


# --- anthropic response --------------------------------------------------------


def test_anthropic_response_to_canonical_and_truncation():
    body = {
        "content": [
            {"type": "text", "text": "let me check", "citations": None},
            {"type": "tool_use", "id": "tu_1", "name": "lookup", "input": {"q": 1}},
        ],
        "stop_reason": "tool_use",
    }
    assert anthropic_wire.assistant_message(body) == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "let me check"},
            {"type": "tool_use", "id": "tu_1", "name": "lookup", "input": {"q": 1}},
        ],
    }
    assert anthropic_wire.truncation(body) == ""
    assert anthropic_wire.truncation({"stop_reason": "max_tokens"}) == "stop_reason max_tokens"
    with pytest.raises(WireFormatError):
        anthropic_wire.assistant_message({"error": "nope"})


# --- openai request --------------------------------------------------------------


def test_openai_request_translation():
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "checking"},
                {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "c2", "name": "noop", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "20C"}]},
                {"type": "tool_result", "tool_use_id": "c2", "content": [{"type": "image", "source": {}}]},
                {"type": "text", "text": "thanks"},
                {"type": "text", "text": "go on"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "It is sunny."}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c3", "content": "plain"}]},
    ]
    tools = [
        {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}},
        {"name": "noop", "description": None},
    ]
    body = openai_wire.request_body("gpt", 99, messages, tools)
    assert body == {
        "model": "gpt",
        "max_tokens": 99,
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": "checking",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                    {"id": "c2", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny\n20C"},
            {"role": "tool", "tool_call_id": "c2", "content": json.dumps([{"type": "image", "source": {}}], separators=(",", ":"))},
            {"role": "user", "content": "thanks\ngo on"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "tool", "tool_call_id": "c3", "content": "plain"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "noop", "description": None, "parameters": {}}},
        ],
    }


def test_openai_request_omits_empty_tools_and_nulls_text_of_pure_tool_calls():
    messages = [{"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "n", "input": {"a": 1}}]}]
    body = openai_wire.request_body("m", 1, messages, [])
    assert "tools" not in body
    assert body["messages"] == [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "n", "arguments": '{"a":1}'}}]}
    ]


# --- openai response -------------------------------------------------------------


def _choice(message, finish_reason="stop"):
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}


def test_openai_response_to_canonical():
    body = _choice(
        {
            "role": "assistant",
            "content": "sure",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "a", "arguments": '{"x": [1]}'}},
                {"id": "call_2", "type": "function", "function": {"name": "b", "arguments": ""}},
            ],
        },
        "tool_calls",
    )
    assert openai_wire.assistant_message(body) == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "sure"},
            {"type": "tool_use", "id": "call_1", "name": "a", "input": {"x": [1]}},
            {"type": "tool_use", "id": "call_2", "name": "b", "input": {}},
        ],
    }
    assert openai_wire.assistant_message(_choice({"role": "assistant", "content": ""})) == {"role": "assistant", "content": []}
    assert openai_wire.truncation(body) == ""
    assert openai_wire.truncation(_choice({"content": "x"}, "length")) == "finish_reason length"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"choices": []},
        {"choices": [{"finish_reason": "stop"}]},
        _choice({"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}),
        _choice({"tool_calls": [{"id": "c", "function": {"name": "n", "arguments": "{not json"}}]}),
    ],
)
def test_openai_unreadable_responses_fail(body):
    with pytest.raises(WireFormatError):
        openai_wire.assistant_message(body)


def test_json_text_round_trips_what_the_fast_encoder_refuses():
    from bae.common.jsontext import RawJson, dump, load

    value = {"big": 10**30, "negative": -(2**70), 1: "non-string key", "text": "é\u2028", "nested": [1.5, None]}
    text = dump(value)
    assert load(text) == {**{k: v for k, v in value.items() if k != 1}, "1": "non-string key"}
    assert dump({"raw": RawJson('{"x":1}'), "n": 2}) == '{"raw":{"x":1},"n":2}'
    assert dump({"x": float("nan")}) == '{"x":null}'  # never the invalid NaN token


@pytest.mark.parametrize(
    "text",
    [
        "[18446744073709551616]",  # beyond 64 bits: orjson would read a float
        '{"n":-9223372036854775809}',  # 19 digits, below -2**63
        '{"id":"12345678901234567890","n":1}',  # a long digit run inside a string
        "[9223372036854775807,-9223372036854775808,1.5,1e-7,0.1]",
        "[1e400]",
        "[NaN,Infinity]",
        '"\\ud800"',
        '{"a":1,"a":2}',
        '{"t":"\\u00e9\\u2028"}',
    ],
)
def test_json_load_reads_as_the_standard_library_does(text):
    from bae.common.jsontext import load

    expected = json.loads(text)
    loaded = load(text)
    assert json.dumps(loaded) == json.dumps(expected)
    assert [type(item) for item in (loaded if isinstance(loaded, list) else [loaded])] == [
        type(item) for item in (expected if isinstance(expected, list) else [expected])
    ]
