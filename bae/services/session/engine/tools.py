"""Per-turn tool scoping and server-side dispatch (SERVER-SPEC §7.5, §9.3, §10.6).

The provider sees only the acting driver's own declarations plus the
session-wide MCP tools; each `tool_use` is classified by name into
client / sandbox / subagent / mcp, and every non-client block is answered
here, inside the turn, without pausing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Iterator

from bae.common.errors import echo
from bae.common.jsontext import JsonObject
from bae.services.session.engine.domain import Dispatch
from bae.services.session.engine.errors import TurnCancelled
from bae.services.session.engine.ports import McpSession
from bae.services.session.engine.sandboxes import SessionSandboxes
from bae.services.session.engine.spans import DispatchTrace, mcp_call_failed, mcp_call_span, open_dispatch
from bae.services.session.engine.subagent_calls import SessionSubagents
from bae.services.session.engine.subagents import STATUS_TOOL_DEFINITION
from bae.services.session.engine.turn import Turn
from bae.services.session.store.records import SessionRecord


def _provider_tool(tool: JsonObject) -> JsonObject:
    return {
        "name": tool["name"],
        "description": tool.get("description") or "",
        "input_schema": tool.get("input_schema") or {"type": "object"},
    }


@dataclass
class ActingTools:
    client: list[JsonObject]
    sandbox: list[JsonObject]
    subagent: list[JsonObject]
    mcp: McpSession | None
    # Whether the session tracks remote subagents: the status tool is offered then (§11.4).
    status_tool: bool = False

    @classmethod
    def of(
        cls, session: SessionRecord, actor: str, mcp: McpSession | None, *, status_tool: bool = False
    ) -> "ActingTools":
        return cls(
            client=session.client_tools.get(actor, []),
            sandbox=session.sandbox_tools.get(actor, []),
            subagent=session.subagent_tools.get(actor, []),
            mcp=mcp,
            status_tool=status_tool,
        )

    def advertised(self) -> list[JsonObject]:
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
        if self.status_tool:
            tools.append(STATUS_TOOL_DEFINITION)
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


class ToolDispatch:
    """Answers a step's server-side `tool_use` blocks inside the turn."""

    def __init__(self, *, sandboxes: SessionSandboxes, subagents: SessionSubagents) -> None:
        self._sandboxes = sandboxes
        self._subagents = subagents

    async def answer(self, turn: Turn, calls: list[tuple[JsonObject, Dispatch]], declared: ActingTools) -> list[JsonObject]:
        """Answer every server-side (block, kind); results come back in the model's order.

        MCP calls run concurrently (their requests are logged first, their
        responses in the model's order); sandbox and subagent calls run in order.
        """
        traces = [open_dispatch(block, kind) for block, kind in calls]
        mcp_blocks = [block for block, kind in calls if kind == Dispatch.MCP]
        mcp_calls: list[asyncio.Task[tuple[JsonObject, JsonObject]]] = []
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
            mcp_calls = [
                asyncio.create_task(_call_mcp(declared, block, traced))
                for (block, kind), traced in zip(calls, traces)
                if kind == Dispatch.MCP
            ]
        pending_mcp = iter(mcp_calls)
        results: list[JsonObject] = []
        try:
            for (block, kind), traced in zip(calls, traces):
                with traced.active():
                    results.append(await self._answer(turn, block, kind, pending_mcp, declared))
                traced.answered(results[-1])
            return results
        except TurnCancelled as cancelled:
            cancelled.answered = {result["tool_use_id"]: result for result in results}
            raise
        finally:
            # A turn that failed or was cancelled part-way leaves no MCP call running behind it.
            for call in mcp_calls:
                call.cancel()
            for traced in traces:
                traced.abandoned()

    async def _answer(
        self,
        turn: Turn,
        block: JsonObject,
        kind: Dispatch,
        pending_mcp: Iterator[asyncio.Task[tuple[JsonObject, JsonObject]]],
        declared: ActingTools,
    ) -> JsonObject:
        """Record one server-side block's outcome; its tool_result block. MCP calls are taken in order."""
        if kind == Dispatch.MCP:
            response, result = await turn.interruptible(next(pending_mcp))
            await turn.emit([("mcp.response", response), ("tool.result", result)])
            return _as_result_block(result)
        if kind == Dispatch.SANDBOX:
            return await self._sandboxes.answer_tool(turn, block)
        return await self._subagents.answer_tool(turn, block, declared.subagent)


def _as_result_block(event_payload: JsonObject) -> JsonObject:
    return {
        "type": "tool_result",
        "tool_use_id": event_payload["tool_use_id"],
        "content": event_payload["content"],
        "is_error": event_payload["is_error"],
    }


async def _call_mcp(declared: ActingTools, block: JsonObject, traced: DispatchTrace) -> tuple[JsonObject, JsonObject]:
    """One MCP tools/call: the mcp.response and tool.result payloads."""
    name = block["name"]
    server = declared.mcp_server_for(name)
    if server is None or declared.mcp is None:
        error = f"no MCP server is configured for tool '{echo(name)}'"
    else:
        with mcp_call_span(traced, name, server) as span:
            outcome = await declared.mcp.call(name, block.get("input") or {})
            tool_error = outcome.ok and outcome.result is not None and bool(outcome.result.get("isError", False))
            if tool_error or not outcome.ok or outcome.result is None:
                mcp_call_failed(span, tool_error)
        if outcome.ok and outcome.result is not None:
            is_error = bool(outcome.result.get("isError", False))
            response = {"server_name": server, "ok": not is_error, "result": outcome.result}
            return response, _mcp_result(block, server, is_error, outcome.result.get("content", []))
        error = outcome.error or "MCP call failed"
    response = {"server_name": server, "ok": False, "error": error}
    return response, _mcp_result(block, server, True, [{"type": "text", "text": f"MCP error: {error}"}])


def _mcp_result(block: JsonObject, server: str | None, is_error: bool, content: list[Any]) -> JsonObject:
    return {"tool_use_id": block["id"], "dispatch": "mcp", "server_name": server, "is_error": is_error, "content": content}
