"""What the open, join, profile and key bodies mean once the gateway read them (their shapes and
texts are the contract's: protos/bae/proto/v1/*_api.proto), and the semantic rules the spec adds:
the reserved tool name and the subagent tools' rules (§11.1)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bae.common.errors import InvalidInput, Unprocessable
from bae.common.jsontext import JsonObject
from bae.common.jsontext import load
from bae.common.limits import LimitsError, read_limits
from bae.common.retention import RetentionError, read_days
from bae.common.protos import admin_api_pb2, client_api_pb2, edge_pb2

RESERVED_TOOL = "remote_subagent_status"

# Profile list fields, in the order a profile is written.
PROFILE_LISTS = ("fallback_providers", "mcp_servers", "available_sandboxes", "allowed_tools")


# Session open/join bodies (SERVER-SPEC §5.1, §5.2, §11.1, §12.1).


@dataclass(frozen=True)
class SessionBody:
    client_version: str | None
    tools: list[JsonObject]  # normalized {name, description, input_schema}
    sandbox_tools: list[JsonObject]
    subagent_tools: list[JsonObject]  # as declared (validated by validate_subagent_tools)
    compaction: JsonObject  # {"mode": "auto", "size": n} or {"mode": "client", "prompt": text or None}

    def names(self) -> JsonObject:
        """The session.open / session.join payload."""
        return {
            "client_version": self.client_version,
            "tools": [tool["name"] for tool in self.tools],
            "sandbox_tools": [tool["name"] for tool in self.sandbox_tools],
            "subagent_tools": [tool["name"] for tool in self.subagent_tools],
        }


def _optional(message: object, field: str) -> str | None:
    return getattr(message, field) if message.HasField(field) else None  # type: ignore[attr-defined]


def _schema(value: edge_pb2.JsonValue) -> object:
    """A tool's input schema; absent or null is {}."""
    return load(value.json) if value.json else {}


def _tool(tool: client_api_pb2.ClientToolDef | client_api_pb2.SubagentToolDef) -> JsonObject:
    return {"name": tool.name, "description": _optional(tool, "description"), "input_schema": _schema(tool.input_schema)}


def _subagent_tool(tool: client_api_pb2.SubagentToolDef) -> JsonObject:
    subagents = [
        {
            "harness": entry.harness,
            "command_template": entry.command_template,
            "prompt_via": _optional(entry, "prompt_via"),
            "timeout_secs": _optional(entry, "timeout_secs"),
        }
        for entry in tool.subagents
    ]
    return {**_tool(tool), "image": tool.image, "subagents": subagents}


CLIENT_COMPACTION = {"mode": "client", "prompt": None}


def compaction_of(body: client_api_pb2.OpenSessionBody) -> JsonObject:
    config = body.compaction
    if config.WhichOneof("mode") == "auto":
        return {"mode": "auto", "size": config.auto.size}
    return {"mode": "client", "prompt": _optional(config.client, "prompt")}


def session_body(body: client_api_pb2.OpenSessionBody | client_api_pb2.JoinSessionBody) -> SessionBody:
    # A join keeps the session's compaction, fixed at creation: its body has none.
    compaction = compaction_of(body) if isinstance(body, client_api_pb2.OpenSessionBody) else CLIENT_COMPACTION
    return SessionBody(
        client_version=_optional(body, "client_version"),
        tools=[_tool(tool) for tool in body.tools],
        sandbox_tools=[_tool(tool) for tool in body.sandbox_tools],
        subagent_tools=[_subagent_tool(tool) for tool in body.subagent_tools],
        compaction=compaction,
    )


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


def reserved_tool_name() -> Unprocessable:
    return Unprocessable(f"{RESERVED_TOOL} is reserved", reason="reserved_tool_name")


def validate_subagent_tools(tools: list[JsonObject]) -> None:
    """§11.1 rules; Unprocessable `invalid_subagent_tools` (or `reserved_tool_name`)."""

    def invalid(detail: str) -> Unprocessable:
        return Unprocessable(detail, reason="invalid_subagent_tools")

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


# Admin bodies (SERVER-SPEC §4.2, §4.3).


def profile_fields(body: admin_api_pb2.ProfileBody) -> JsonObject:
    fields: JsonObject = {"name": body.name, "primary_provider": body.primary_provider}
    for field in PROFILE_LISTS:
        fields[field] = list(getattr(body, field))
    fields["limits"] = profile_limits(body.limits) if body.HasField("limits") else None
    fields["retention"] = profile_retention(body.retention) if body.HasField("retention") else None
    return fields


def profile_retention(retention: admin_api_pb2.Retention) -> dict[str, float] | None:
    """A profile's `retention`, checked as [retention] is; None when it sets nothing."""
    if not retention.HasField("closed_session_days"):
        return None
    try:
        return {"closed_session_days": read_days(retention.closed_session_days, "retention.closed_session_days")}
    except RetentionError as exc:
        raise InvalidInput(f"invalid request body: {exc}") from None


def profile_limits(limits: admin_api_pb2.Limits) -> dict[str, int | float] | None:
    """The keys a profile's `limits` sets, checked as [limits] is; None when it sets none."""
    given = {field.name: value for field, value in limits.ListFields()}
    try:
        return read_limits(given, "limits") or None
    except LimitsError as exc:
        raise InvalidInput(f"invalid request body: {exc}") from None
