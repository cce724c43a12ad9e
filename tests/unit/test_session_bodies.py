"""Pagination, and what the session service makes of the open and join bodies the gateway read:
their normalized form and the semantic rules of subagent tools (§11.1)."""

from __future__ import annotations

import json

import pytest

from bae.common.errors import InvalidInput, Unprocessable
from bae.common.protos import client_api_pb2
from bae.services.gateway.json_to_proto import read_body
from bae.services.session.api import bodies
from bae.services.session.api.pagination import PageRequest, page_request

pytestmark = pytest.mark.unit


def test_page_request_parsing():
    assert page_request("", "") == PageRequest(0, 50)
    assert page_request("12", "500") == PageRequest(12, 200)
    assert page_request("", "+7") == PageRequest(0, 7)
    for cursor, limit, detail in [("", "0", "limit must be a positive integer"),
                                  ("", "1.5", "limit must be a positive integer"),
                                  ("-1", "", 'invalid cursor: "-1"')]:
        with pytest.raises(InvalidInput) as caught:
            page_request(cursor, limit)
        assert caught.value.detail == detail


def test_a_page_and_its_next_cursor():
    request = PageRequest(0, 2)
    assert request.page([(1, "a"), (5, "b"), (9, "c")]) == (["a", "b"], "5")
    assert request.page([(1, "a"), (5, "b")]) == (["a", "b"], None)
    assert request.page([]) == ([], None)


def parse(body: dict, joining: bool = False) -> bodies.SessionBody:
    message = client_api_pb2.JoinSessionBody() if joining else client_api_pb2.OpenSessionBody()
    read_body(message, json.dumps(body).encode(), "application/json")
    return bodies.session_body(message)


def test_session_body_normalization():
    body = parse({"tools": [{"name": "t"}], "compaction": {"mode": "client", "prompt": "p"}, "extra": 1})
    assert body.tools == [{"name": "t", "description": None, "input_schema": {}}]
    assert body.compaction == {"mode": "client", "prompt": "p"}
    assert parse({}).compaction == {"mode": "client", "prompt": None}
    assert parse({"compaction": {"mode": "auto", "size": 1000}}).compaction == {"mode": "auto", "size": 1000}
    assert parse({"tools": [{"name": "t"}]}, joining=True).compaction == {"mode": "client", "prompt": None}
    schema = {"type": "object", "properties": {"b": {}, "a": {"x": 1.5}}}
    assert parse({"tools": [{"name": "t", "description": "d", "input_schema": schema}]}).tools == [
        {"name": "t", "description": "d", "input_schema": schema}]
    subagent = parse({"subagent_tools": [{"name": "s", "subagents": [{"harness": "h"}]}]}).subagent_tools
    assert subagent == [{"name": "s", "description": None, "input_schema": {}, "image": "", "subagents": [
        {"harness": "h", "command_template": "", "prompt_via": None, "timeout_secs": None}]}]


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
    with pytest.raises(Unprocessable) as caught:
        bodies.validate_subagent_tools(parse({"subagent_tools": [subagent]}).subagent_tools)
    assert (caught.value.reason, caught.value.detail) == ("invalid_subagent_tools", detail)
