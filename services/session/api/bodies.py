"""Request bodies: JSON decoding and field validation with the reference error texts.

The reference server deserializes with serde; SERVER-SPEC §17 O-2 asks us to
keep its message forms (``missing field `size` ``, `invalid type: string "x",
expected u64`, …), so the small validators here produce the same wording.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bae.common import serde
from bae.common.errors import Problem, bad_request
from bae.common.jsontext import JsonSyntaxError, strict_load

CONTENT_TYPE_REJECTION = "Expected request with `Content-Type: application/json`"
RESERVED_TOOL = "remote_subagent_status"
COMPACTION_MIN_SIZE = 1000
_U64_MAX = 2**64 - 1


class ShapeError(ValueError):
    """A body field has the wrong shape; the message is the serde-style text."""


def invalid_type(value: Any, expected: str) -> ShapeError:
    return ShapeError(serde.invalid_type(value, expected))


def is_json_content_type(content_type: str) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = mime.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def decode_json(body: bytes, content_type: str) -> Any:
    """The body's JSON value; 400 with the raw rejection text otherwise."""
    if not is_json_content_type(content_type):
        raise bad_request(CONTENT_TYPE_REJECTION)
    try:
        return strict_load(body)
    except JsonSyntaxError as exc:
        raise bad_request(f"Failed to parse the request body as JSON: {exc}") from None


def decode_object(body: bytes, content_type: str, struct: str) -> dict:
    value = decode_json(body, content_type)
    if not isinstance(value, dict):
        raise bad_request(f"invalid request body: {invalid_type(value, f'struct {struct}')}")
    return value


def optional_string(obj: dict, field: str) -> str | None:
    value = obj.get(field)
    if value is not None and not isinstance(value, str):
        raise invalid_type(value, "a string")
    return value


def required_string(obj: dict, field: str) -> str:
    if field not in obj:
        raise ShapeError(f"missing field `{field}`")
    value = obj[field]
    if not isinstance(value, str):
        raise invalid_type(value, "a string")
    return value


def _sequence(obj: dict, field: str) -> list:
    value = obj.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid_type(value, "a sequence")
    return value


# Session open/join bodies (SERVER-SPEC §5.1, §5.2, §11.1, §12.1).


@dataclass(frozen=True)
class SessionBody:
    client_version: str | None
    tools: list[dict]  # normalized {name, description, input_schema}
    sandbox_tools: list[dict]
    subagent_tools: list[dict]  # as declared (validated by validate_subagent_tools)
    compaction: dict  # normalized, see parse_compaction

    def names(self) -> dict:
        """The session.open / session.join payload."""
        return {
            "client_version": self.client_version,
            "tools": [tool["name"] for tool in self.tools],
            "sandbox_tools": [tool["name"] for tool in self.sandbox_tools],
            "subagent_tools": [tool["name"] for tool in self.subagent_tools],
        }


def _tool_def(value: Any, struct: str) -> dict:
    if not isinstance(value, dict):
        raise invalid_type(value, f"struct {struct}")
    name = required_string(value, "name")
    description = optional_string(value, "description")
    schema = value.get("input_schema")
    return {"name": name, "description": description, "input_schema": {} if schema is None else schema}


def _subagent_tool(value: Any) -> dict:
    tool = _tool_def(value, "SubagentToolDef")
    image = optional_string(value, "image")
    subagents = []
    for entry in _sequence(value, "subagents"):
        if not isinstance(entry, dict):
            raise invalid_type(entry, "struct SubagentConfig")
        timeout = entry.get("timeout_secs")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int)):
            raise invalid_type(timeout, "i64")
        subagents.append(
            {
                "harness": optional_string(entry, "harness") or "",
                "command_template": optional_string(entry, "command_template") or "",
                "prompt_via": optional_string(entry, "prompt_via"),
                "timeout_secs": timeout,
            }
        )
    return {**tool, "image": image or "", "subagents": subagents}


def parse_compaction(value: Any) -> dict:
    """Normalized compaction config; ShapeError with the serde text when malformed."""
    if value is None:
        return {"mode": "client", "prompt": None}
    if not isinstance(value, dict):
        raise invalid_type(value, "internally tagged enum CompactionConfig")
    if "mode" not in value:
        raise ShapeError("missing field `mode`")
    mode = value["mode"]
    if not isinstance(mode, str):
        raise invalid_type(mode, "variant identifier")
    if mode == "auto":
        if "size" not in value:
            raise ShapeError("missing field `size`")
        size = value["size"]
        if isinstance(size, bool) or not isinstance(size, int):
            raise invalid_type(size, "u64")
        if not 0 <= size <= _U64_MAX:
            raise ShapeError(f"invalid value: integer `{size}`, expected u64")
        return {"mode": "auto", "size": size}
    if mode == "client":
        return {"mode": "client", "prompt": optional_string(value, "prompt")}
    raise ShapeError(f"unknown variant `{mode}`, expected `auto` or `client`")


def parse_session_body(body: bytes, content_type: str, *, joining: bool) -> SessionBody:
    """Parse an open/join body (check 2 of §5.1 / §5.2); raises 400 Problems."""
    obj = decode_object(body, content_type, "SessionRequest")
    if joining and "compaction" in obj:
        raise bad_request(
            "compaction is a session-level setting fixed at creation and cannot be set on join"
        )
    try:
        client_version = optional_string(obj, "client_version")
        tools = [_tool_def(item, "ClientToolDef") for item in _sequence(obj, "tools")]
        sandbox_tools = [_tool_def(item, "ClientToolDef") for item in _sequence(obj, "sandbox_tools")]
        subagent_tools = [_subagent_tool(item) for item in _sequence(obj, "subagent_tools")]
    except ShapeError as exc:
        raise bad_request(f"invalid request body: {exc}") from None
    try:
        compaction = parse_compaction(obj.get("compaction"))
    except ShapeError as exc:
        raise bad_request(f"invalid compaction config: {exc}") from None
    if compaction["mode"] == "auto" and compaction["size"] < COMPACTION_MIN_SIZE:
        raise bad_request(
            f"invalid compaction config: size must be at least {COMPACTION_MIN_SIZE} tokens "
            f"(got {compaction['size']})"
        )
    return SessionBody(client_version, tools, sandbox_tools, subagent_tools, compaction)


_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def _template_ok(template: str, prompt_via: str) -> bool:
    if not template.strip():
        return False
    names = _PLACEHOLDER.findall(template)
    if any(name not in ("model", "prompt") for name in names):
        return False
    literal = _PLACEHOLDER.sub("", template)
    if "{" in literal or "}" in literal:
        return False
    prompts = names.count("prompt")
    return prompts == 1 if prompt_via == "arg" else prompts == 0


def reserved_tool_name() -> Problem:
    return Problem(422, "reserved_tool_name", f"{RESERVED_TOOL} is reserved")


def validate_subagent_tools(tools: list[dict]) -> None:
    """§11.1 rules; 422 `invalid_subagent_tools` (or `reserved_tool_name`)."""

    def invalid(detail: str) -> Problem:
        return Problem(422, "invalid_subagent_tools", detail)

    for tool in tools:
        if not tool["name"].strip():
            raise invalid("tool name must be a non-empty string")
        if tool["name"] == RESERVED_TOOL:
            raise reserved_tool_name()
        if not tool["image"].strip() or not tool["subagents"]:
            raise invalid("image and non-empty subagents are required")
        harnesses = set()
        for entry in tool["subagents"]:
            harness = entry["harness"].strip()
            if not harness or harness in harnesses:
                raise invalid("harness must be non-empty and unique")
            harnesses.add(harness)
            prompt_via = entry["prompt_via"] or "stdin"
            if prompt_via not in ("stdin", "arg"):
                raise invalid('prompt_via must be "stdin" or "arg"')
            if not _template_ok(entry["command_template"], prompt_via):
                raise invalid("invalid command_template placeholders")
            if entry["timeout_secs"] is not None and entry["timeout_secs"] < 1:
                raise invalid("timeout_secs must be a positive integer")


# Admin bodies (SERVER-SPEC §4.2, §4.3): every malformed body is a 400 (O-6).

# Profile list fields and how an item that is not a string is explained.
PROFILE_LIST_FIELDS = {
    "fallback_providers": " (a bae-config.toml registry name)",
    "mcp_servers": " (a bae-config.toml registry name)",
    "available_sandboxes": " (a bae-config.toml registry name)",
    "allowed_tools": "",
}


def _string_list(obj: dict, field: str, item_hint: str) -> list[str]:
    value = obj.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request(f"{field} must be an array")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise bad_request(f"{field}[{index}] must be a string{item_hint}")
    return value


def _required_strings(obj: dict, *fields: str) -> list[str]:
    """The named string fields, in order; 400 at the first missing or mistyped one."""
    try:
        return [required_string(obj, field) for field in fields]
    except ShapeError as exc:
        raise bad_request(f"invalid request body: {exc}") from None


def parse_profile_body(body: bytes, content_type: str) -> dict:
    obj = decode_object(body, content_type, "ProfileRequest")
    name, primary = _required_strings(obj, "name", "primary_provider")
    if not name.strip():
        raise bad_request("name must not be empty")
    if not primary.strip():
        raise bad_request("primary_provider must not be empty")
    fields: dict[str, str | list[str]] = {"name": name, "primary_provider": primary}
    for field, item_hint in PROFILE_LIST_FIELDS.items():
        fields[field] = _string_list(obj, field, item_hint)
    return fields


def parse_key_body(body: bytes, content_type: str) -> tuple[str, str]:
    """(name, profile_id) of a client key create body."""
    obj = decode_object(body, content_type, "CreateKeyRequest")
    name, profile_id = _required_strings(obj, "name", "profile_id")
    if not name.strip():
        raise bad_request("name must not be empty")
    return name, profile_id
