"""Per-turn tool scoping and server-side dispatch (SERVER-SPEC §7.5, §9.3, §10.6).

The provider sees only the acting driver's own declarations plus the
session-wide MCP tools; each `tool_use` is classified by name into
client / sandbox / subagent / mcp, and every non-client block is answered
here, inside the turn, without pausing.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Iterator

from services.session.engine.domain import Dispatch
from services.session.engine.sandbox_calls import dispatch_sandbox_tool


def _provider_tool(tool: dict) -> dict:
    return {
        "name": tool["name"],
        "description": tool.get("description") or "",
        "input_schema": tool.get("input_schema") or {"type": "object"},
    }


@dataclass
class ActingTools:
    client: list[dict]
    sandbox: list[dict]
    subagent: list[dict]
    mcp: object | None  # McpSessionConnections

    @classmethod
    def of(cls, session, actor: str, mcp) -> "ActingTools":
        return cls(
            client=session.client_tools.get(actor, []),
            sandbox=session.sandbox_tools.get(actor, []),
            subagent=session.subagent_tools.get(actor, []),
            mcp=mcp,
        )

    def advertised(self) -> list[dict]:
        """Recomputed before every provider call, in the spec's order."""
        tools = [_provider_tool(t) for t in (*self.client, *self.sandbox, *self.subagent)]
        if self.mcp is not None:
            # A declared tool of the same name wins the dispatch, so the MCP copy is never
            # reachable; listing it too would give the provider duplicate names, which it refuses.
            declared = {t["name"] for t in tools}
            tools += [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in self.mcp.tools
                if t.name not in declared
            ]
        return tools

    def classify(self, name: str) -> Dispatch:
        if any(t["name"] == name for t in self.client):
            return Dispatch.CLIENT
        if any(t["name"] == name for t in self.sandbox):
            return Dispatch.SANDBOX
        if name == "remote_subagent_status" or any(t["name"] == name for t in self.subagent):
            return Dispatch.SUBAGENT
        return Dispatch.MCP

    def mcp_server_for(self, name: str) -> str | None:
        return self.mcp.route(name) if self.mcp is not None else None


def error_result(tool_use_id: str, text: str) -> dict:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": [{"type": "text", "text": text}], "is_error": True}


async def dispatch_server_tools(turn, calls: list[tuple[dict, str]], declared: ActingTools) -> list[dict]:
    """Answer every server-side (block, kind); results come back in the model's order.

    MCP calls run concurrently (their requests are logged first, their
    responses in the model's order); sandbox and subagent calls run in order.
    """
    mcp_blocks = [block for block, kind in calls if kind == Dispatch.MCP]
    mcp_calls: list[asyncio.Task] = []
    if mcp_blocks:
        await turn.emit(
            [
                (
                    "mcp.request",
                    {
                        "method": "tools/call",
                        "server_name": declared.mcp_server_for(b["name"]),
                        "tool": b["name"],
                        "input": b.get("input", {}),
                    },
                )
                for b in mcp_blocks
            ]
        )
        mcp_calls = [asyncio.create_task(_call_mcp(declared, b)) for b in mcp_blocks]
    pending_mcp = iter(mcp_calls)
    try:
        return [await _answer(turn, block, kind, pending_mcp) for block, kind in calls]
    finally:
        # A turn that failed or was cancelled part-way leaves no MCP call running behind it.
        for call in mcp_calls:
            call.cancel()


async def _answer(turn, block: dict, kind: str, pending_mcp: Iterator[asyncio.Task]) -> dict:
    """Record one server-side block's outcome; its tool_result block. MCP calls are taken in order."""
    if kind == Dispatch.MCP:
        response, result = await next(pending_mcp)
        await turn.emit([("mcp.response", response), ("tool.result", result)])
        return _as_result_block(result)
    if kind == Dispatch.SANDBOX:
        return await dispatch_sandbox_tool(turn, block)
    result = error_result(block["id"], json.dumps({"error": "remote subagents are not available on this server"}))
    await turn.emit(
        [("tool.result", {"tool_use_id": block["id"], "dispatch": "subagent", "is_error": True,
                          "content": result["content"]})]
    )
    return result


def _as_result_block(event_payload: dict) -> dict:
    return {
        "type": "tool_result",
        "tool_use_id": event_payload["tool_use_id"],
        "content": event_payload["content"],
        "is_error": event_payload["is_error"],
    }


async def _call_mcp(declared: ActingTools, block: dict) -> tuple[dict, dict]:
    """One MCP tools/call: the mcp.response and tool.result payloads."""
    name = block["name"]
    server = declared.mcp_server_for(name)
    if server is None:
        error = f"no MCP server is configured for tool '{name}'"
    else:
        outcome = await declared.mcp.call(name, block.get("input") or {})
        if outcome.ok and outcome.result is not None:
            is_error = bool(outcome.result.get("isError", False))
            response = {"server_name": server, "ok": not is_error, "result": outcome.result}
            return response, _mcp_result(block, server, is_error, outcome.result.get("content", []))
        error = outcome.error or "MCP call failed"
    response = {"server_name": server, "ok": False, "error": error}
    return response, _mcp_result(block, server, True, [{"type": "text", "text": f"MCP error: {error}"}])


def _mcp_result(block: dict, server: str | None, is_error: bool, content: list) -> dict:
    return {"tool_use_id": block["id"], "dispatch": "mcp", "server_name": server, "is_error": is_error, "content": content}
