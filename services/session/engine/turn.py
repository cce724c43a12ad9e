"""One call's work on a session while it holds the gate (SERVER-SPEC §7.6).

A `Turn` records every event before it is broadcast, asks the runner for one
provider step at a time, and dispatches server-side tools itself. It knows
no wire format: the caller's stream is only a `Watcher` whose own input echo
the turn marks, and the turn ends with a `TurnEnd`, not a frame.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

from bae.common.jsontext import RawJson, dump, load
from services.session.engine import tools as toolset
from services.session.engine.domain import Dispatch, SessionState, TurnEnd, Usage
from services.session.engine.feed import Watcher
from services.session.engine.gate import ParkedTurn
from services.session.engine.history import MESSAGE_EVENTS
from services.session.engine.runtime import LiveSession, SessionRuntime
from services.session.engine.spans import open_dispatch
from services.session.engine.ports import ProviderSteps, StepFailed, StepMessages, StepOutcome, StepRequest, StepResult
from services.session.store.events import EventView
from services.session.store.records import ProfileRecord, SessionRecord

log = logging.getLogger("bae.session.turn")

MAX_ITERATIONS = 8
# A step may walk several providers, each bounded by the runner's own per-attempt timeout.
STEP_DEADLINE = 900.0
UNAVAILABLE_MESSAGE = {
    "role": "assistant",
    "content": [{"type": "text", "text": "The provider is currently unavailable."}],
}

EventItem = tuple[str, dict | RawJson]


@dataclass
class LoopResult:
    end: TurnEnd
    message: dict
    parked: ParkedTurn | None = None


@dataclass
class Turn:
    runtime: SessionRuntime
    live: LiveSession
    actor: str
    steps: ProviderSteps
    # The caller's own stream, if any: the input it recorded is not echoed back to it (§6.4).
    echo: Watcher | None = None
    events: list[EventView] = field(default_factory=list)
    # Usage of the last successful provider call of this turn (§12.2); None when unreported.
    last_usage: Usage | None = None
    # The events that came with a step's result (its provider.response, and its provider.request
    # when the provider answered at once), held back to be written in one store call with the
    # events that follow them.
    carried: list[tuple[str | None, str, dict | RawJson]] = field(default_factory=list)
    # A write emit_soon started and nothing has waited for yet.
    _pending: asyncio.Future[list[EventView]] | None = field(default=None, init=False, repr=False)
    # Its messages, which the history gets only when the write is broadcast: a step that starts
    # before then sends them after the history.
    _unwritten: list[dict] = field(default_factory=list, init=False, repr=False)

    @property
    def session_id(self) -> str:
        return self.live.session_id

    async def emit(
        self,
        items: Sequence[EventItem],
        *,
        echo: bool = False,
        new_state: SessionState | None = None,
        attribute_to: str | None = None,
        in_result: bool = True,
    ) -> list[EventView]:
        """Persist (after any carried event), then broadcast. `echo` marks the caller's own input."""
        await self.settle()
        carried, self.carried = self.carried, []
        views = await self.runtime.store.append_events(
            self.session_id,
            carried + [(attribute_to or self.actor, kind, payload) for kind, payload in items],
            new_state=new_state,
        )
        own = views[len(carried):]
        if echo and self.echo is not None:  # before publishing, so the caller's stream never sees them
            self.echo.echo_ids.update(view["id"] for view in own)
        self.events.extend(views if in_result else views[: len(carried)])
        await self.runtime.publish(self.session_id, views)
        self._unwritten = []  # the history has them now
        return own

    def emit_soon(self, items: list[tuple[str, dict]], *, echo: bool = False) -> None:
        """Start persisting and broadcasting `items` while the turn goes on to its provider call.

        The next emit (or `settle`) waits for this write first, so the log keeps its order and
        nothing that follows is written or broadcast when it fails: the turn then fails with the
        write's error, as it would have before calling the provider.
        """
        self._unwritten = [payload for kind, payload in items if kind in MESSAGE_EVENTS]
        self._pending = asyncio.ensure_future(self.emit(list(items), echo=echo))

    async def settle(self) -> None:
        """Wait for a write `emit_soon` started (unless called from that write); raises what it raised."""
        pending = self._pending
        if pending is None or pending is asyncio.current_task():
            return
        self._pending = None
        try:
            await pending
        except BaseException:
            self.carried = []  # they follow a write that did not succeed: nothing after it is recorded
            raise

    async def emit_compaction(self, *, preamble: dict, summary: dict, completed: dict) -> list[EventView]:
        """A compaction's preamble, summary and `completed` marker, written together, then broadcast."""
        await self.settle()
        carried, self.carried = self.carried, []
        views = await self.runtime.store.append_compaction(
            self.session_id, self.actor, carried, preamble, summary, completed
        )
        self.events.extend(views)
        await self.runtime.publish(self.session_id, views)
        return views

    async def flush(self) -> None:
        """Finish a write still under way, and write the events still carried when the
        turn ends without a following event."""
        await self.settle()
        if self.carried:
            await self.emit([])

    async def run_loop(self, session: SessionRecord, profile: ProfileRecord) -> LoopResult:
        extensions: list[dict] = []
        for iteration in range(MAX_ITERATIONS):
            if iteration:  # re-read: updateClientTools applies from the next provider call
                session = await self.runtime.store.get_session(self.session_id) or session
            mcp = await self.runtime.ensure_mcp(self.live, profile)
            declared = toolset.ActingTools.of(session, self.actor, mcp, status_tool=bool(self.live.subagents.entries))
            messages = self.live.loaded_history.step_messages([*self._unwritten, *extensions])
            result = await self.step(profile, messages, declared.advertised())
            if result.outcome != StepOutcome.OK:
                payload: dict[str, Any]
                if result.outcome == StepOutcome.PROVIDER_CONFIG:
                    payload = {"reason": "provider_config", "detail": result.detail}
                else:
                    payload = {"reason": "all_providers_failed", "attempts": result.attempts}
                await self.emit([("session.error", payload)], new_state=SessionState.ERROR)
                return LoopResult(TurnEnd.UNAVAILABLE, UNAVAILABLE_MESSAGE)
            assistant = load(result.message_json)
            content = assistant.get("content") or []
            tool_uses = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
            if not tool_uses:
                message = {"role": "assistant", "content": content}
                await self.emit([("server.message.send", message)])
                return LoopResult(TurnEnd.COMPLETED, message)

            # One kind per block, by position: a model may reuse an id, and each block is
            # classified by its own name (the duplicate is refused when the turn resumes).
            kinds = [declared.classify(block["name"]) for block in tool_uses]
            await self.emit(
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
            server_calls: list[tuple[dict, Dispatch]] = [(block, kind) for block, kind in zip(tool_uses, kinds) if kind != Dispatch.CLIENT]
            results = await toolset.dispatch_server_tools(self, server_calls, declared)

            if Dispatch.CLIENT in kinds:
                kind_of = iter(kinds)
                tagged = [
                    {**block, "dispatch": str(next(kind_of))}
                    if isinstance(block, dict) and block.get("type") == "tool_use"
                    else block
                    for block in content
                ]
                message = {"role": "assistant", "content": tagged}
                await self.emit([("server.message.send", message)])
                parked = ParkedTurn(
                    owner=self.actor,
                    deadline=time.monotonic() + self.runtime.settings.turn_timeout,
                    tool_uses=[b for b in tagged if b.get("type") == "tool_use"],
                    server_results={r["tool_use_id"]: r for r in results},
                )
                return LoopResult(TurnEnd.PAUSED, message, parked)
            extensions += [{"role": "assistant", "content": content}, {"role": "user", "content": results}]

        await self.emit(
            [("session.error", {"reason": "loop_limit", "max_iterations": MAX_ITERATIONS})],
            new_state=SessionState.ERROR,
        )
        return LoopResult(TurnEnd.UNAVAILABLE, UNAVAILABLE_MESSAGE)

    async def step(
        self,
        profile: ProfileRecord,
        messages: StepMessages,
        tools: list[dict],
        *,
        purpose: str = "",
        min_max_tokens: int = 0,
    ) -> StepResult:
        """One provider step; records its events as they stream and returns the step's result."""
        request = StepRequest(
            session_id=self.session_id,
            primary_provider=profile.primary_provider,
            fallback_providers=profile.fallback_providers,
            tools_json=dump(tools),
            purpose=purpose,
            min_max_tokens=min_max_tokens,
        )
        result = None
        updates = self.steps.run_step(request, messages, timeout=STEP_DEADLINE)
        try:
            async for update in updates:
                if update.result is not None:
                    result = update.result
                    self.carried += [(self.actor, kind, payload) for kind, payload in update.events]
                elif update.events:
                    await self.emit(update.events)
        except StepFailed as exc:
            await self.settle()  # a failed write of what came before is the turn's error, not this
            log.error("runner step for session %s failed: %s", self.session_id, exc)
            raise
        finally:
            await updates.aclose()  # stops the step when an emit failed; nothing to do once it ended
        if result is None:
            raise StepFailed("the step ended without a result")
        if result.outcome == StepOutcome.OK:
            self.last_usage = result.usage
        return result
