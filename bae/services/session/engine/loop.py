"""A turn's provider loop (SERVER-SPEC §7.5, §7.6): a provider step, then the tools it asked
for, until the model answers without tools, pauses for the client's tools, or fails.

Server-side tools are answered inside the loop (`ToolDispatch`); a client tool ends the
turn as paused, its gate held by a `ParkedTurn` until the client answers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from bae.common.jsontext import JsonObject, load
from bae.services.session.engine.domain import Dispatch, SessionState, TurnEnd
from bae.services.session.engine.errors import BudgetExhausted, TurnCancelled
from bae.services.session.engine.gate import ParkedTurn
from bae.services.session.engine.mcp_sessions import SessionMcp
from bae.services.session.engine.ports import EventStore, StepOutcome
from bae.services.session.engine.spans import open_dispatch
from bae.services.session.engine.tools import ActingTools, ToolDispatch
from bae.services.session.engine.turn import Turn
from bae.services.session.store.records import ProfileRecord, SessionRecord

MAX_ITERATIONS = 8
UNAVAILABLE_MESSAGE = {
    "role": "assistant",
    "content": [{"type": "text", "text": "The provider is currently unavailable."}],
}


@dataclass
class LoopResult:
    end: TurnEnd
    message: JsonObject
    parked: ParkedTurn | None = None


class TurnLoop:
    def __init__(self, *, store: EventStore, mcp: SessionMcp, tools: ToolDispatch, turn_timeout: float) -> None:
        self._store = store
        self._mcp = mcp
        self._tools = tools
        # How long a paused turn waits for its client's tool results (BAE_TURN_TIMEOUT).
        self._turn_timeout = turn_timeout

    async def run(self, turn: Turn, session: SessionRecord, profile: ProfileRecord) -> LoopResult:
        live = turn.live
        extensions: list[JsonObject] = []
        # The assistant message whose tool calls the previous iteration answered, and their results.
        answered_message: JsonObject | None = None
        answered: dict[str, JsonObject] = {}
        for iteration in range(MAX_ITERATIONS):
            spent = await turn.exhausted()
            if spent is not None:  # checked before every provider call
                stop = BudgetExhausted(spent.message, spent.payload())
                stop.message, stop.answered = answered_message, answered
                raise stop
            if iteration:  # re-read: updateClientTools applies from the next provider call
                session = await self._store.get_session(turn.session_id) or session
            mcp = await turn.interruptible(self._mcp.ensure(live, profile))
            declared = ActingTools.of(session, turn.actor, mcp, status_tool=bool(live.subagents.entries))
            result = await turn.step(profile, turn.step_messages(extensions), declared.advertised())
            if result.outcome != StepOutcome.OK:
                payload: dict[str, Any]
                if result.outcome == StepOutcome.PROVIDER_CONFIG:
                    payload = {"reason": "provider_config", "detail": result.detail}
                else:
                    payload = {"reason": "all_providers_failed", "attempts": result.attempts}
                await turn.emit([("session.error", payload)], new_state=SessionState.ERROR)
                return LoopResult(TurnEnd.UNAVAILABLE, UNAVAILABLE_MESSAGE)
            assistant = load(result.message_json)
            content = assistant.get("content") or []
            tool_uses = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
            if not tool_uses:
                message = {"role": "assistant", "content": content}
                await turn.emit([("server.message.send", message)])
                return LoopResult(TurnEnd.COMPLETED, message)

            # One kind per block, by position: a model may reuse an id, and each block is
            # classified by its own name (the duplicate is refused when the turn resumes).
            kinds = [declared.classify(block["name"]) for block in tool_uses]
            await turn.emit(
                [
                    (
                        "tool.call",
                        {
                            "id": block["id"],
                            "name": block["name"],
                            "input": block.get("input", {}),
                            "dispatch": kind,
                            "server_name": declared.mcp_server_for(block["name"]) if kind == Dispatch.MCP else None,
                        },
                    )
                    for block, kind in zip(tool_uses, kinds)
                ]
            )
            for block, kind in zip(tool_uses, kinds):
                if kind == Dispatch.CLIENT:
                    open_dispatch(block, kind)  # the server only records it: its span ends at once
            server_calls: list[tuple[JsonObject, Dispatch]] = [(block, kind) for block, kind in zip(tool_uses, kinds) if kind != Dispatch.CLIENT]
            kind_of = iter(kinds)
            tagged = [
                {**block, "dispatch": str(next(kind_of))}
                if isinstance(block, dict) and block.get("type") == "tool_use"
                else block
                for block in content
            ]
            message = {"role": "assistant", "content": tagged}
            try:
                results = await self._tools.answer(turn, server_calls, declared)
            except TurnCancelled as cancelled:
                cancelled.message = message  # its calls get results, so the history stays valid
                raise

            if Dispatch.CLIENT in kinds:
                await turn.emit([("server.message.send", message)])
                parked = ParkedTurn(
                    owner=turn.actor,
                    deadline=time.monotonic() + self._turn_timeout,
                    tool_uses=[b for b in tagged if b.get("type") == "tool_use"],
                    server_results={r["tool_use_id"]: r for r in results},
                )
                return LoopResult(TurnEnd.PAUSED, message, parked)
            extensions += [{"role": "assistant", "content": content}, {"role": "user", "content": results}]
            answered_message, answered = message, {result["tool_use_id"]: result for result in results}

        await turn.emit(
            [("session.error", {"reason": "loop_limit", "max_iterations": MAX_ITERATIONS})],
            new_state=SessionState.ERROR,
        )
        return LoopResult(TurnEnd.UNAVAILABLE, UNAVAILABLE_MESSAGE)
