"""Subagent work on live sessions: launch from a turn, watch in the background, cancel,
cancel on close, and re-attach after a restart (SERVER-SPEC §11).

Every event is written through the registry and attributed as §11 says: the launching
key for lifecycle events, the caller for an explicit cancel.
"""

from __future__ import annotations

import asyncio
import json
import logging

from opentelemetry.trace import Span

from bae.common.errors import BaeError, QuotaExceeded, Unavailable
from bae.common.jsontext import JsonObject
from bae.services.session.engine.domain import Dispatch
from bae.services.session.engine.live import LiveSession
from bae.services.session.engine.ports import Sandboxes
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.engine.spans import end_subagent, start_subagent
from bae.services.session.engine.subagents import (
    OUTPUT_LIMIT,
    STATUS_TOOL,
    WAIT_SLICE,
    Subagent,
    SubagentStatus,
    apply_outcome,
    error_payload,
    launch_refusal,
    new_subagent_id,
    render_command,
    spawn_failed,
)
from bae.services.session.engine.turn import Turn
from bae.services.session.store.events import EventView

log = logging.getLogger("bae.session.subagents")

SANDBOX_GONE = "the session's sandbox is gone"


def _result(tool_use_id: str, text: str, is_error: bool) -> JsonObject:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": [{"type": "text", "text": text}],
            "is_error": is_error}


async def _answer(turn: Turn, block: JsonObject, text: str, is_error: bool) -> JsonObject:
    result = _result(block["id"], text, is_error)
    await turn.emit(
        [("tool.result", {"tool_use_id": block["id"], "dispatch": str(Dispatch.SUBAGENT), "server_name": None,
                          "is_error": is_error, "content": result["content"]})]
    )
    return result


class SessionSubagents:
    def __init__(
        self, *, registry: SessionRegistry, sandboxes: Sandboxes, limit: int, default_timeout: float
    ) -> None:
        self._registry = registry
        self._sandboxes = sandboxes
        # Running subagents per session at most (BAE_MAX_SUBAGENTS_PER_SESSION).
        self._limit = limit
        # A harness's run time when its declaration sets none (BAE_SUBAGENT_TIMEOUT).
        self._default_timeout = default_timeout

    async def answer_tool(self, turn: Turn, block: JsonObject, declarations: list[JsonObject]) -> JsonObject:
        """Answer a `subagent` tool_use inside the turn: the status tool, or a launch that never waits."""
        live = turn.live
        if block["name"] == STATUS_TOOL:
            tool_input = block.get("input")
            subagent_id = tool_input.get("subagent_id") if isinstance(tool_input, dict) else None
            report, is_error = live.subagents.status_result(subagent_id)
            return await _answer(turn, block, json.dumps(report, separators=(",", ":")), is_error)

        declaration = next(tool for tool in declarations if tool["name"] == block["name"])
        refusal, config = launch_refusal(declaration, block.get("input"), live.subagents, self._limit, live.sandbox)
        if refusal is not None or config is None or live.sandbox is None:
            return await _answer(turn, block, error_payload(refusal or "subagent launch refused"), True)
        # Each subagent is one background command in the session's sandbox.
        most = turn.limits.max_background_commands_per_sandbox
        if len(live.subagents.running()) >= most:
            return await _answer(turn, block, error_payload(QuotaExceeded("max_background_commands_per_sandbox", most).detail), True)

        tool_input = block["input"]
        harness, model, prompt = tool_input["harness"], tool_input["model"], tool_input["prompt"]
        by_arg = config.get("prompt_via") == "arg"
        entry = Subagent(new_subagent_id(), harness, model, launched_by=turn.actor, host=live.sandbox.host)
        live.subagents.entries[entry.subagent_id] = entry
        await turn.emit([("session.subagent.start", entry.event())])
        await turn.emit([("session.subagent.running", entry.event())])
        command = render_command(config["command_template"], model, prompt if by_arg else None)
        timeout = config.get("timeout_secs") or self._default_timeout
        stdin = b"" if by_arg else prompt.encode()
        span = start_subagent(live.session_id, entry.subagent_id)
        live.tasks.spawn(
            self._run(live, entry, command, stdin=stdin, timeout=float(timeout), span=span),
            name=f"subagent:{entry.subagent_id}",
        )
        started = {"subagent_id": entry.subagent_id, "harness": harness, "model": model, "status": "started"}
        return await _answer(turn, block, json.dumps(started, separators=(",", ":")), False)

    async def _run(
        self, live: LiveSession, entry: Subagent, command: str, *, stdin: bytes, timeout: float, span: Span | None
    ) -> None:
        """Start the subagent's command on the sandbox host, then watch it to its end.

        `span` (its `bae.subagent`) ends with the outcome however this task ends.
        """
        handle = live.sandbox
        try:
            try:
                if handle is None:
                    raise Unavailable(SANDBOX_GONE)
                await self._sandboxes.start_command(
                    handle, entry.subagent_id, command, stdin=stdin, timeout=timeout, output_limit=OUTPUT_LIMIT
                )
            except BaeError as exc:
                if entry.status == SubagentStatus.RUNNING:
                    await self._record(live, entry, spawn_failed(entry, exc))
                return
            await self._watch(live, entry)
        finally:
            end_subagent(span, entry.status)

    async def _watch(self, live: LiveSession, entry: Subagent) -> None:
        """Wait on the host until the command ends; record its outcome unless a cancel won."""
        while entry.status == SubagentStatus.RUNNING:
            try:
                status = await self._sandboxes.wait_command(entry.host, entry.subagent_id, WAIT_SLICE)
            except BaeError as exc:
                # The host is unreachable or forgot the command: keep trying while it may come back.
                log.warning("subagent %s: waiting failed: %s", entry.subagent_id, exc.detail)
                await asyncio.sleep(WAIT_SLICE / 10)
                continue
            if entry.status != SubagentStatus.RUNNING:
                return  # cancelled meanwhile: cancellation wins
            outcome = apply_outcome(entry, status)
            if outcome is not None:
                await self._record(live, entry, outcome)

    async def _record(self, live: LiveSession, entry: Subagent, event: tuple[str, JsonObject]) -> None:
        await self._registry.append(live.session_id, entry.launched_by, [event])

    async def cancel(self, live: LiveSession, entry: Subagent, *, reason: str, actor: str | None) -> bool:
        """Kill a running subagent and log `session.subagent.cancelled`; False when it had already ended."""
        if entry.status != SubagentStatus.RUNNING:
            return False
        entry.status, entry.reason = SubagentStatus.CANCELLED, reason
        try:
            await self._sandboxes.kill_command(entry.host, entry.subagent_id)
        except BaeError as exc:
            log.warning("subagent %s: kill failed: %s", entry.subagent_id, exc.detail)
        event = entry.event(reason=reason, exit_code=None)
        await self._registry.append(live.session_id, actor, [("session.subagent.cancelled", event)])
        return True

    async def cancel_at_close(self, live: LiveSession, *, actor: str | None) -> None:
        """A close cancels every running subagent (§5.5 step 2): one `session.subagent.cancelled`
        each, written together at once.

        No kill per subagent: each one's command runs in the session's sandbox, which the close
        stops next (or which was stopped before), and a sandbox host ends a sandbox's commands with
        it. A slow or frozen host then costs the close one call, the stop, not one more per subagent.
        """
        running = live.subagents.running()
        for entry in running:
            entry.status, entry.reason = SubagentStatus.CANCELLED, "session_close"
        if running:
            await self._registry.append(
                live.session_id, actor,
                [("session.subagent.cancelled", entry.event(reason="session_close", exit_code=None)) for entry in running],
            )

    def adopt(self, live: LiveSession, host: str, command_ids: list[str], logged: list[EventView]) -> None:
        """Track again the subagents the log (`logged`, the session's subagent events) shows
        running and the host still knows."""
        launched: dict[str, Subagent] = {}
        for event in logged:
            payload = event["payload"]
            subagent_id = payload.get("subagent_id")
            if payload.get("dispatch") != "remote" or not isinstance(subagent_id, str):
                continue
            if event["event_type"] == "session.subagent.start":
                launched[subagent_id] = Subagent(
                    subagent_id, str(payload.get("harness")), str(payload.get("model")),
                    launched_by=event["client_key_id"] or "", host=host,
                )
            elif event["event_type"] != "session.subagent.running":
                launched.pop(subagent_id, None)  # it ended
        for subagent_id, entry in launched.items():
            if subagent_id in command_ids and subagent_id not in live.subagents.entries:
                live.subagents.entries[subagent_id] = entry
                live.tasks.spawn(self._watch(live, entry), name=f"subagent:{subagent_id}")
                log.info("re-attached subagent %s of session %s", subagent_id, live.session_id)
