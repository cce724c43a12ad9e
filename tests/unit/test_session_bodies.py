"""Pagination and the parsing of session bodies: what the REST handlers accept and refuse."""

from __future__ import annotations

import json

import pytest

from bae.common.errors import Problem
from services.session.api import bodies
from services.session.api.pagination import PageRequest, page_json, page_request

pytestmark = pytest.mark.unit


def test_page_request_parsing():
    assert page_request({}) == PageRequest(0, 50)
    assert page_request({"limit": "500", "cursor": "12"}) == PageRequest(12, 200)
    assert page_request({"limit": "", "cursor": ""}) == PageRequest(0, 50)
    for query, detail in [({"limit": "0"}, "limit must be a positive integer"),
                          ({"limit": "1.5"}, "limit must be a positive integer"),
                          ({"cursor": "-1"}, 'invalid cursor: "-1"')]:
        with pytest.raises(Problem) as caught:
            page_request(query)
        assert (caught.value.status, caught.value.detail) == (400, detail)


def test_page_json_next_cursor():
    request = PageRequest(0, 2)
    assert page_json([(1, "1"), (5, "2"), (9, "3")], request) == '{"items":[1,2],"next_cursor":"5"}'
    assert page_json([(1, "1"), (5, "2")], request) == '{"items":[1,2],"next_cursor":null}'
    assert page_json([], request) == '{"items":[],"next_cursor":null}'


def parse(body: dict, joining: bool = False) -> bodies.SessionBody:
    return bodies.parse_session_body(json.dumps(body).encode(), "application/json", joining=joining)


def test_session_body_normalization():
    body = parse({"tools": [{"name": "t"}], "compaction": {"mode": "client", "prompt": "p"}, "extra": 1})
    assert body.tools == [{"name": "t", "description": None, "input_schema": {}}]
    assert body.compaction == {"mode": "client", "prompt": "p"}
    assert parse({}).compaction == {"mode": "client", "prompt": None}
    assert parse({"compaction": {"mode": "auto", "size": 1000}}).compaction == {"mode": "auto", "size": 1000}


@pytest.mark.parametrize(
    "body, detail",
    [
        ({"compaction": {"mode": "auto", "size": -1}}, "invalid compaction config: invalid value: integer `-1`, expected u64"),
        ({"compaction": {"mode": "auto", "size": True}}, "invalid compaction config: invalid type: boolean `true`, expected u64"),
        ({"compaction": "auto"}, 'invalid compaction config: invalid type: string "auto", expected internally tagged enum CompactionConfig'),
        ({"compaction": {"mode": "client", "prompt": 1}}, "invalid compaction config: invalid type: integer `1`, expected a string"),
        ({"tools": [1]}, "invalid request body: invalid type: integer `1`, expected struct ClientToolDef"),
        ({"subagent_tools": [{"name": "s", "subagents": [{"timeout_secs": "x"}]}]},
         'invalid request body: invalid type: string "x", expected i64'),
    ],
)
def test_session_body_errors(body, detail):
    with pytest.raises(Problem) as caught:
        parse(body)
    assert (caught.value.status, caught.value.type, caught.value.detail) == (400, "bad_request", detail)


def test_join_rejects_any_compaction_key():
    with pytest.raises(Problem) as caught:
        parse({"compaction": None}, joining=True)
    assert caught.value.detail.startswith("compaction is a session-level setting")


@pytest.mark.parametrize(
    "subagent, detail",
    [
        ({"name": " ", "image": "i", "subagents": [{"harness": "h", "command_template": "c"}]},
         "tool name must be a non-empty string"),
        ({"name": "s", "image": "", "subagents": [{"harness": "h", "command_template": "c"}]},
         "image and non-empty subagents are required"),
        ({"name": "s", "image": "i", "subagents": [{"harness": "h", "command_template": "c"},
                                                    {"harness": "h", "command_template": "c"}]},
         "harness must be non-empty and unique"),
        ({"name": "s", "image": "i", "subagents": [{"harness": "h", "command_template": "c", "prompt_via": "x"}]},
         'prompt_via must be "stdin" or "arg"'),
        ({"name": "s", "image": "i", "subagents": [{"harness": "h", "command_template": "c {prompt}"}]},
         "invalid command_template placeholders"),
        ({"name": "s", "image": "i", "subagents": [{"harness": "h", "command_template": "c", "prompt_via": "arg"}]},
         "invalid command_template placeholders"),
        ({"name": "s", "image": "i", "subagents": [{"harness": "h", "command_template": "c }"}]},
         "invalid command_template placeholders"),
        ({"name": "s", "image": "i", "subagents": [{"harness": "h", "command_template": "c", "timeout_secs": 0}]},
         "timeout_secs must be a positive integer"),
    ],
)
def test_subagent_validation(subagent, detail):
    with pytest.raises(Problem) as caught:
        bodies.validate_subagent_tools(parse({"subagent_tools": [subagent]}).subagent_tools)
    assert (caught.value.status, caught.value.type, caught.value.detail) == (422, "invalid_subagent_tools", detail)
