"""The gateway's translation between JSON and the contract's messages (edge.proto's rules), both
ways, with the spec's texts: no process, the messages of the contract itself."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bae.common.protos import admin_api_pb2, client_api_pb2, edge_pb2
from bae.services.gateway.json_to_proto import CONTENT_TYPE_REJECTION, Unreadable, read_body, read_params
from bae.services.gateway.proto_to_json import to_json

pytestmark = pytest.mark.unit


def body_failure(message_type: Any, body: Any, content_type: str = "application/json") -> str:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(Unreadable) as caught:
        read_body(message_type(), raw, content_type)
    return caught.value.text


def read(message_type: Any, body: Any) -> Any:
    message = message_type()
    read_body(message, json.dumps(body).encode(), "application/json")
    return message


# -- JSON in: the body itself ---------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["", "text/plain", "application/x-www-form-urlencoded", "json"])
def test_a_body_that_is_not_json_by_its_content_type(content_type):
    assert body_failure(admin_api_pb2.CreateKeyBody, {}, content_type) == CONTENT_TYPE_REJECTION


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8", "application/vnd.x+json"])
def test_json_content_types(content_type):
    message = admin_api_pb2.CreateKeyBody()
    read_body(message, b'{"name":"k","profile_id":"p"}', content_type)
    assert (message.name, message.profile_id) == ("k", "p")


@pytest.mark.parametrize("raw, detail", [
    (b"{", "expecting property name enclosed in double quotes at line 1 column 2"),
    (b"", "expecting value at line 1 column 1"),
    (b'{"a": NaN}', "NaN is not a JSON value"),
    (b'{"a": 1e999}', "number out of range"),
    (b'"\xff"', "invalid UTF-8"),
])
def test_json_syntax_failures(raw, detail):
    assert body_failure(admin_api_pb2.CreateKeyBody, raw) == f"Failed to parse the request body as JSON: {detail}"


@pytest.mark.parametrize("body, found", [
    ([], "sequence"), (None, "null"), (5, "integer `5`"), ("x", 'string "x"'), (True, "boolean `true`"), (1.5, "floating point `1.5`"),
])
def test_a_body_that_is_not_an_object_reads_as_its_struct(body, found):
    assert body_failure(admin_api_pb2.CreateKeyBody, body) == (
        f"invalid request body: invalid type: {found}, expected struct CreateKeyRequest")


# -- JSON in: fields ------------------------------------------------------------------------


def test_serde_texts_with_the_context_of_the_nearest_message():
    cases = [
        ({}, "invalid request body: missing field `name`"),
        ({"name": None, "primary_provider": "m"}, "invalid request body: invalid type: null, expected a string"),
        ({"name": 5}, "invalid request body: invalid type: integer `5`, expected a string"),
        ({"name": "n"}, "invalid request body: missing field `primary_provider`"),
        ({"name": "n", "primary_provider": {}}, "invalid request body: invalid type: map, expected a string"),
    ]
    for body, text in cases:
        assert body_failure(admin_api_pb2.ProfileBody, body) == text


def test_texts_of_their_own_are_whole_and_come_after_serdes():
    profile = admin_api_pb2.ProfileBody
    assert body_failure(profile, {"name": " ", "primary_provider": "m"}) == "name must not be empty"
    assert body_failure(profile, {"name": "n", "primary_provider": ""}) == "primary_provider must not be empty"
    # serde deserializes first, whatever the order: a later type failure beats an earlier empty name.
    assert body_failure(profile, {"name": "", "primary_provider": 5}) == (
        "invalid request body: invalid type: integer `5`, expected a string")
    # Of the texts of their own, the first in declaration order.
    assert body_failure(profile, {"name": "", "primary_provider": "m", "fallback_providers": 5}) == "name must not be empty"
    assert body_failure(profile, {"name": "n", "primary_provider": "m", "available_sandboxes": 5, "allowed_tools": 5}) == (
        "available_sandboxes must be an array")
    assert body_failure(profile, {"name": "n", "primary_provider": "m", "mcp_servers": ["a", None]}) == (
        "mcp_servers[1] must be a string (a bae-config.toml registry name)")
    assert body_failure(profile, {"name": "n", "primary_provider": "m", "allowed_tools": [[]]}) == (
        "allowed_tools[0] must be a string")


def test_null_reads_as_absent_only_where_serde_takes_none():
    profile = read(admin_api_pb2.ProfileBody, {"name": "n", "primary_provider": "m", "fallback_providers": None,
                                               "unknown": [1]})
    assert list(profile.fallback_providers) == []
    opened = read(client_api_pb2.OpenSessionBody, {"client_version": None, "tools": None, "compaction": None})
    assert not opened.HasField("client_version") and not opened.HasField("compaction")
    # A plain boolean takes no null.
    params = client_api_pb2.ReportLocalSandboxParams()
    assert read_params(params, {"state": "running", "unsandboxed": None}) == '"unsandboxed" must be a boolean'


def test_a_tagged_union():
    assert read(client_api_pb2.OpenSessionBody, {"compaction": {"mode": "auto", "size": 5000, "prompt": 1}}).compaction.auto.size == 5000
    client = read(client_api_pb2.OpenSessionBody, {"compaction": {"mode": "client", "size": "x"}}).compaction
    assert client.WhichOneof("mode") == "client" and not client.client.HasField("prompt")
    cases = [
        ({"compaction": 5}, "invalid compaction config: invalid type: integer `5`, expected internally tagged enum CompactionConfig"),
        ({"compaction": {}}, "invalid compaction config: missing field `mode`"),
        ({"compaction": {"mode": None}}, "invalid compaction config: invalid type: null, expected variant identifier"),
        ({"compaction": {"mode": "x"}}, "invalid compaction config: unknown variant `x`, expected `auto` or `client`"),
        ({"compaction": {"mode": "auto"}}, "invalid compaction config: missing field `size`"),
        ({"compaction": {"mode": "auto", "size": 5000.0}}, "invalid compaction config: invalid type: floating point `5000.0`, expected u64"),
        ({"compaction": {"mode": "auto", "size": True}}, "invalid compaction config: invalid type: boolean `true`, expected u64"),
        ({"compaction": {"mode": "auto", "size": -1}}, "invalid compaction config: invalid value: integer `-1`, expected u64"),
        ({"compaction": {"mode": "auto", "size": 2**64}},
         "invalid compaction config: invalid value: integer `18446744073709551616`, expected u64"),
        ({"compaction": {"mode": "auto", "size": 999}}, "invalid compaction config: size must be at least 1000 tokens (got 999)"),
        ({"compaction": {"mode": "client", "prompt": 1}}, "invalid compaction config: invalid type: integer `1`, expected a string"),
        ({"tools": [{"name": 1}], "compaction": {"mode": "auto", "size": 1}},
         "invalid request body: invalid type: integer `1`, expected a string"),
    ]
    for body, text in cases:
        assert body_failure(client_api_pb2.OpenSessionBody, body) == text


def test_nested_structs_and_sequences():
    cases = [
        ({"tools": 5}, "invalid request body: invalid type: integer `5`, expected a sequence"),
        ({"tools": [1]}, "invalid request body: invalid type: integer `1`, expected struct ClientToolDef"),
        ({"tools": [{"description": "d"}]}, "invalid request body: missing field `name`"),
        ({"tools": [{"name": "t", "description": 5}]}, "invalid request body: invalid type: integer `5`, expected a string"),
        ({"subagent_tools": ["x"]}, 'invalid request body: invalid type: string "x", expected struct SubagentToolDef'),
        ({"subagent_tools": [{"name": "s", "subagents": [5]}]},
         "invalid request body: invalid type: integer `5`, expected struct SubagentConfig"),
        ({"subagent_tools": [{"name": "s", "subagents": [{"harness": 1, "timeout_secs": "x"}]}]},
         'invalid request body: invalid type: string "x", expected i64'),
        ({"subagent_tools": [{"name": "s", "subagents": [{"timeout_secs": 2**63}]}]},
         "invalid request body: invalid value: integer `9223372036854775808`, expected i64"),
        ({"tools": "t" * 300}, 'invalid request body: invalid type: string "' + "t" * 200 + '…", expected a sequence'),
    ]
    for body, text in cases:
        assert body_failure(client_api_pb2.OpenSessionBody, body) == text


def test_a_forbidden_key_ends_the_reading_first():
    for compaction in (None, {"mode": "client"}):
        assert body_failure(client_api_pb2.JoinSessionBody, {"tools": 5, "compaction": compaction}) == (
            "compaction is a session-level setting fixed at creation and cannot be set on join")


def test_opaque_json_travels_as_its_text():
    schema = {"b": 1, "a": [1.5, "é", None], "c": {"z": True}}
    tool = read(client_api_pb2.OpenSessionBody, {"tools": [{"name": "t", "input_schema": schema}]}).tools[0]
    assert tool.input_schema.json == '{"b":1,"a":[1.5,"é",null],"c":{"z":true}}'
    assert not read(client_api_pb2.OpenSessionBody, {"tools": [{"name": "t", "input_schema": None}]}).tools[0].HasField(
        "input_schema")


# -- JSON in: JSON-RPC params ----------------------------------------------------------------


@pytest.mark.parametrize("params_type, params, text", [
    (client_api_pb2.SendMessageParams, [1], "invalid type: sequence, expected a map"),
    (client_api_pb2.SendMessageParams, "x", 'invalid type: string "x", expected a map'),
    (client_api_pb2.SendMessageParams, None, 'missing "message"'),
    (client_api_pb2.SendMessageParams, {}, 'missing "message"'),
    (client_api_pb2.SendMessageParams, {"message": None}, "invalid type: null, expected struct Message"),
    (client_api_pb2.SendMessageParams, {"message": {}}, "missing field `content`"),
    (client_api_pb2.SendMessageParams, {"message": {"content": {}}},
     "invalid type: map, expected a string or an array of content blocks"),
    (client_api_pb2.SendMessageParams, {"message": {"content": "x", "role": 5}}, "invalid type: integer `5`, expected a string"),
    (client_api_pb2.CompactParams, {"prompt": 5}, "invalid type: integer `5`, expected a string or null"),
    (client_api_pb2.UpdateClientToolsParams, {}, 'missing "tools"'),
    (client_api_pb2.UpdateClientToolsParams, {"tools": None}, "invalid type: null, expected a sequence"),
    (client_api_pb2.UpdateClientToolsParams, {"tools": [5]}, 'every tool requires a non-empty "name"'),
    (client_api_pb2.UpdateClientToolsParams, {"tools": [{"name": " "}]}, 'every tool requires a non-empty "name"'),
    (client_api_pb2.UpdateClientToolsParams, {"tools": [{"name": 5}]}, 'every tool requires a non-empty "name"'),
    (client_api_pb2.StartRemoteSandboxParams, {"image": " "}, 'missing "image"'),
    (client_api_pb2.StartRemoteSandboxParams, {"image": 5}, 'missing "image"'),
    (client_api_pb2.ExecRemoteSandboxParams, {"command": None}, 'missing "command"'),
    (client_api_pb2.ReportLocalSandboxParams, {"state": "x", "unsandboxed": "x"},
     '"state" must be "running", "stopped", or "error"'),
    (client_api_pb2.ReportLocalSandboxParams, {"state": "running", "image": 5}, '"image" must be a string or null'),
    (client_api_pb2.ReportLocalSandboxParams, {"state": "running", "container_id": 5}, '"container_id" must be a string or null'),
    (client_api_pb2.ReportLocalSubagentParams, {"state": "start", "subagent_id": "a", "harness": " ", "model": "m"},
     '"subagent_id", "harness", and "model" must be non-empty strings'),
    (client_api_pb2.ReportLocalSubagentParams,
     {"state": "completed", "subagent_id": "a", "harness": "h", "model": "m", "exit_code": True}, '"exit_code" must be an integer'),
    (client_api_pb2.ReportLocalSubagentParams, {"state": "x", "detail": 5},
     '"state" must be "start", "running", "completed", "failed", or "cancelled"'),
    (client_api_pb2.CancelSubagentParams, {"subagent_id": ""}, 'missing "subagent_id"'),
])
def test_params_texts(params_type, params, text):
    message = params_type()
    assert read_params(message, params) == text
    assert message == params_type()  # nothing half-read


def test_params_that_fit():
    message = client_api_pb2.SendMessageParams()
    assert read_params(message, {"message": {"role": None, "content": [{"type": "text", "text": "hi"}]}}) == ""
    assert not message.message.HasField("role")
    assert message.message.content.json == '[{"type":"text","text":"hi"}]'
    lenient = client_api_pb2.SubscribeParams()
    assert read_params(lenient, {"since_event_id": 5}) == "" and not lenient.HasField("since_event_id")
    report = client_api_pb2.ReportLocalSubagentParams()
    assert read_params(report, {"state": "failed", "subagent_id": "a", "harness": "h", "model": "m", "exit_code": -2}) == ""
    assert report.exit_code == -2


# -- JSON out ---------------------------------------------------------------------------------


def test_keys_in_field_order_unset_optionals_null_and_values_spliced():
    event = client_api_pb2.Event(id="evt_1", session_id="ses_1", event_type="tool.call",
                                 payload=edge_pb2.JsonValue(json='{"b":1,"a":1.50}'), created_at="t")
    assert to_json(event) == (
        '{"id":"evt_1","session_id":"ses_1","client_key_id":null,"event_type":"tool.call","payload":{"b":1,"a":1.50},'
        '"created_at":"t"}')
    assert to_json(client_api_pb2.EventPage()) == '{"items":[],"next_cursor":null}'
    result = client_api_pb2.StartRemoteSandboxResult(sandbox_id="s", image="i")
    assert to_json(result) == '{"sandbox_id":"s","image":"i","started_at":null}'


def test_maps_sorted_numbers_and_omitted_fields():
    server = admin_api_pb2.McpServerConfig(name="n", transport="stdio", headers={"b": "1", "a": "2", "é": "3"})
    assert to_json(server) == ('{"name":"n","transport":"stdio","command":null,"args":[],"url":null,'
                               '"headers":{"a":"2","b":"1","é":"3"},"env":{}}')
    telemetry = admin_api_pb2.TelemetryConfig(sample_ratio=1.0, metrics=admin_api_pb2.MetricsConfig(enabled=True))
    assert '"sample_ratio":1.0,' in to_json(telemetry) and '"traces":null' in to_json(telemetry)
    assert to_json(client_api_pb2.ExecRemoteSandboxResult(stdout='\u2028"\n', exit_code=-1)) == (
        '{"stdout":"\u2028\\"\\n","stderr":"","exit_code":-1}')
    assert to_json(admin_api_pb2.ImageStatus(name="i", status="available")) == '{"name":"i","status":"available"}'
    assert to_json(admin_api_pb2.ImageStatus(name="i", status="error", detail="d")) == (
        '{"name":"i","status":"error","detail":"d"}')
