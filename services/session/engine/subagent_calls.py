"""Subagent work on a live session: launch from a turn, watch in the background,
cancel, cancel on close, and re-attach after a restart (SERVER-SPEC §11).

Every event is written through the runtime and attributed as §11 says: the
launching key for lifecycle events, the caller for an explicit cancel.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING

from opentelemetry.trace import Span

from services.session.engine.domain import Dispatch
from services.session.engine.spans import end_subagent, start_subagent
from services.session.engine.subagents import (
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
from services.session.remote.sandbox_pool import SandboxError

if TYPE_CHECKING:  # these modules import this one; the annotations alone need them
    from services.session.engine.runtime import LiveSession, SessionRuntime
    from services.session.engine.tools import ActingTools
    from services.session.engine.turn import Turn

log = logging.getLogger("bae.session.subagents")


def _result(tool_use_id: str, text: str, is_error: bool) -> dict:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": [{"type": "text", "text": text}],
            "is_error": is_error}


async def _answer(turn: Turn, block: dict, text: str, is_error: bool) -> dict:
    result = _result(block["id"], text, is_error)
    await turn.emit(
        [("tool.result", {"tool_use_id": block["id"], "dispatch": str(Dispatch.SUBAGENT), "server_name": None,
                          "is_error": is_error, "content": result["content"]})]
    )
    return result


async def dispatch_subagent_tool(turn: Turn, block: dict, declared: ActingTools) -> dict:
    """Answer a `subagent` tool_use inside the turn: the status tool, or a launch that never waits."""
    live = turn.live
    if block["name"] == STATUS_TOOL:
        tool_input = block.get("input")
        subagent_id = tool_input.get("subagent_id") if isinstance(tool_input, dict) else None
        report, is_error = live.subagents.status_result(subagent_id)
        return await _answer(turn, block, json.dumps(report, separators=(",", ":")), is_error)

    declaration = next(tool for tool in declared.subagent if tool["name"] == block["name"])
    settings = turn.runtime.settings
    refusal, config = launch_refusal(
        declaration, block.get("input"), live.subagents, settings.max_subagents_per_session, live.sandbox
    )
    if refusal is not None or config is None or live.sandbox is None:
        return await _answer(turn, block, error_payload(refusal or "subagent launch refused"), True)

    tool_input = block["input"]
    harness, model, prompt = tool_input["harness"], tool_input["model"], tool_input["prompt"]
    by_arg = config.get("prompt_via") == "arg"
    entry = Subagent(new_subagent_id(), harness, model, launched_by=turn.actor, host=live.sandbox.host)
    live.subagents.entries[entry.subagent_id] = entry
    await turn.emit([("session.subagent.start", entry.event())])
    await turn.emit([("session.subagent.running", entry.event())])
    command = render_command(config["command_template"], model, prompt if by_arg else None)
    timeout = config.get("timeout_secs") or settings.subagent_timeout
    stdin = b"" if by_arg else prompt.encode()
    span = start_subagent(live.session_id, entry.subagent_id)
    live.tasks.spawn(
        run(turn.runtime, live, entry, command, stdin=stdin, timeout=float(timeout), span=span),
        name=f"subagent:{entry.subagent_id}",
    )
    started = {"subagent_id": entry.subagent_id, "harness": harness, "model": model, "status": "started"}
    return await _answer(turn, block, json.dumps(started, separators=(",", ":")), False)


async def run(
    runtime: SessionRuntime,
    live: LiveSession,
    entry: Subagent,
    command: str,
    *,
    stdin: bytes,
    timeout: float,
    span: Span | None = None,
) -> None:
    """Start the subagent's command on the sandbox host, then watch it to its end.

    `span` (its `bae.subagent`) ends with the outcome however this task ends.
    """
    pool = runtime.sandboxes
    handle = live.sandbox
    try:
        try:
            if pool is None or handle is None:
                raise SandboxError("the session's sandbox is gone")
            await pool.start_command(
                handle, entry.subagent_id, command, stdin=stdin, timeout=timeout, output_limit=OUTPUT_LIMIT
            )
        except SandboxError as exc:
            if entry.status == SubagentStatus.RUNNING:
                await _record(runtime, live, entry, spawn_failed(entry, exc))
            return
        await watch(runtime, live, entry)
    finally:
        end_subagent(span, entry.status)


async def watch(runtime: SessionRuntime, live: LiveSession, entry: Subagent) -> None:
    """Wait on the host until the command ends; record its outcome unless a cancel won."""
    pool = runtime.sandboxes
    assert pool is not None
    while entry.status == SubagentStatus.RUNNING:
        try:
            status = await pool.wait_command(entry.host, entry.subagent_id, WAIT_SLICE)
        except SandboxError as exc:
            # The host is unreachable or forgot the command: keep trying while it may come back.
            log.warning("subagent %s: waiting failed: %s", entry.subagent_id, exc.detail)
            await asyncio.sleep(WAIT_SLICE / 10)
            continue
        if entry.status != SubagentStatus.RUNNING:
            return  # cancelled meanwhile: cancellation wins
        outcome = apply_outcome(entry, status)
        if outcome is not None:
            await _record(runtime, live, entry, outcome)


async def _record(runtime: SessionRuntime, live: LiveSession, entry: Subagent, event: tuple[str, dict]) -> None:
    await runtime.append(live.session_id, entry.launched_by, [event])


async def cancel(runtime: SessionRuntime, live: LiveSession, entry: Subagent, *, reason: str, actor: str | None) -> bool:
    """Kill a running subagent and log `session.subagent.cancelled`; False when it had already ended."""
    if entry.status != SubagentStatus.RUNNING:
        return False
    entry.status, entry.reason = SubagentStatus.CANCELLED, reason
    if runtime.sandboxes is not None:
        try:
            await runtime.sandboxes.kill_command(entry.host, entry.subagent_id)
        except SandboxError as exc:
            log.warning("subagent %s: kill failed: %s", entry.subagent_id, exc.detail)
    await runtime.append(live.session_id, actor, [("session.subagent.cancelled", entry.event(reason=reason, exit_code=None))])
    return True


async def cancel_at_close(runtime: SessionRuntime, live: LiveSession, *, actor: str | None) -> None:
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
        await runtime.append(
            live.session_id, actor,
            [("session.subagent.cancelled", entry.event(reason="session_close", exit_code=None)) for entry in running],
        )
