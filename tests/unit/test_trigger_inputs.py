"""A trigger's definition and a call's input (api/triggers.py, engine/trigger_template.py): the strict
`{field}` template, the schema checks when it is written, the input's validation and the canonical
body digest of Idempotency-Key."""

from __future__ import annotations

import pytest

from bae.common.errors import InvalidInput
from bae.common.protos import admin_api_pb2, edge_pb2
from bae.services.session.api.triggers import input_digest, rendered_message, trigger_fields
from bae.services.session.engine import trigger_template
from bae.services.session.store.records import TriggerRecord

pytestmark = pytest.mark.unit

SCHEMA = '{"type":"object","properties":{"repo":{"type":"string"},"n":{"type":"integer"}},"required":["repo"]}'


def body(template: str = "Look at {repo}.", schema: str = SCHEMA) -> admin_api_pb2.TriggerBody:
    return admin_api_pb2.TriggerBody(name="t", profile_id="pro_1", input_schema=edge_pb2.JsonValue(json=schema),
                                     message_template=template)


def trigger(template: str = "Look at {repo} ({n}).") -> TriggerRecord:
    return TriggerRecord(id="trg_1", name="t", profile_id="pro_1", input_schema=SCHEMA, message_template=template,
                         close_after=True, created_at="", updated_at="")


def test_the_template_fills_fields_and_keeps_escaped_braces() -> None:
    parts = trigger_template.parse("{{literal}} {repo}: {n} }}")
    assert trigger_template.fields(parts) == ["repo", "n"]
    assert trigger_template.render(parts, {"repo": "acme", "n": 3}) == "{literal} acme: 3 }"
    assert trigger_template.render(trigger_template.parse("{v}"), {"v": {"a": [1, None]}}) == '{"a":[1,null]}'


@pytest.mark.parametrize("template, says", [
    ("{repo.__class__}", "placeholder {repo.__class__} at character 0 is not a field name"),
    ("{0}", "placeholder {0} at character 0 is not a field name"),
    ("x {repo[0]}", "placeholder {repo[0]} at character 2 is not a field name"),
    ("{ repo }", "placeholder { repo } at character 0 is not a field name"),
    ("a { b", "a lone '{' at character 2"), ("a } b", "a lone '}' at character 2"), ("{}", "a lone '{' at character 0"),
])
def test_anything_but_a_plain_placeholder_or_an_escape_is_refused(template: str, says: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        trigger_template.parse(template)
    assert says in str(refused.value)


def test_a_placeholder_the_schema_does_not_declare_is_refused() -> None:
    assert trigger_fields(body())["close_after"] is True
    with pytest.raises(InvalidInput, match=r"placeholder \{branch\} is not a property of input_schema"):
        trigger_fields(body("On {branch}."))


def test_a_schema_that_is_not_draft_2020_12_is_refused() -> None:
    with pytest.raises(InvalidInput, match="not a valid JSON Schema"):
        trigger_fields(body(schema='{"type":"object","minProperties":-1}'))
    with pytest.raises(InvalidInput, match="at most 65536 characters"):
        trigger_fields(body(schema='{"description":"' + "x" * 70000 + '"}'))


def test_invalid_input_is_400_invalid_trigger_input_cut_to_200_characters() -> None:
    with pytest.raises(InvalidInput) as raised:
        rendered_message(trigger(), {"repo": "x", "n": "y" * 5000})
    assert raised.value.reason == "invalid_trigger_input"
    assert raised.value.detail.startswith("input/n: ") and len(raised.value.detail) == 200
    with pytest.raises(InvalidInput, match=r"no value for the message's placeholder \{n\}"):
        rendered_message(trigger(), {"repo": "x"})
    assert rendered_message(trigger(), {"repo": "x", "n": 2}) == "Look at x (2)."


def test_the_digest_ignores_key_order_and_spacing_only() -> None:
    assert input_digest({"a": 1, "b": [1, 2]}) == input_digest({"b": [1, 2], "a": 1})
    assert input_digest({"a": 1}) != input_digest({"a": 1.5})
    assert input_digest({"a": "é"}) != input_digest({"a": "e"})
