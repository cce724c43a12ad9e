"""Remote CLI subagents (SERVER-SPEC §11): launch in the session's sandbox, track,
report once through the synthesized status tool, cancel.

The sandbox host owns each subagent's process (a background command named by
the subagent id), so a subagent keeps running when this service restarts; the
tracker here is the session's view of them, rebuilt from the log and the hosts'
command lists at start-up. Output lives only in the status tool's result.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from bae.common.errors import BaeError, echo
from bae.common.jsontext import JsonObject
from bae.services.session.engine.ports import CommandState, CommandStatus, SandboxHandle

log = logging.getLogger("bae.session.subagents")

STATUS_TOOL = "remote_subagent_status"
STATUS_TOOL_DEFINITION = {
    "name": STATUS_TOOL,
    "description": (
        "Reports the remote subagents launched in this session: running ones, and finished ones "
        "with their output. A finished subagent is reported once, then forgotten."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "subagent_id": {"type": "string", "description": "One subagent to report; omit for all of them."}
        },
        "required": [],
        "additionalProperties": False,
    },
}
# Each stream of a subagent's output is kept up to this many bytes (§11.2).
OUTPUT_LIMIT = 65_536
# How long one wait on the sandbox host lasts before it is renewed.
WAIT_SLICE = 30.0
_PLACEHOLDER = re.compile(r"\{(model|prompt)\}")


class SubagentStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


@dataclass
class Subagent:
    subagent_id: str
    harness: str
    model: str
    launched_by: str  # the client key whose turn launched it; its events are attributed to it
    host: str
    status: SubagentStatus = SubagentStatus.RUNNING
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    reason: str | None = None
    detail: str | None = None

    def event(self, **extra: Any) -> JsonObject:
        """A `session.subagent.*` payload (§11.3)."""
        return {
            "dispatch": "remote",
            "subagent_id": self.subagent_id,
            "harness": self.harness,
            "model": self.model,
            "detail": self.detail,
            **extra,
        }

    def report(self) -> JsonObject:
        return {
            "subagent_id": self.subagent_id,
            "harness": self.harness,
            "model": self.model,
            "status": str(self.status),
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "truncated": self.truncated,
            "reason": self.reason,
            "detail": self.detail,
        }


@dataclass
class SubagentTracker:
    """A session's remote subagents in launch order: running ones, and finished ones not yet reported."""

    entries: dict[str, Subagent] = field(default_factory=dict)

    def running(self) -> list[Subagent]:
        return [entry for entry in self.entries.values() if entry.status == SubagentStatus.RUNNING]

    def status_result(self, subagent_id: object) -> tuple[JsonObject, bool]:
        """The status tool's answer (and whether it is an error); reported terminal entries are evicted."""
        if subagent_id is not None:
            entry = self.entries.get(subagent_id) if isinstance(subagent_id, str) else None
            if entry is None:
                return {"error": "unknown subagent_id"}, True
            reported = [entry]
        else:
            reported = list(self.entries.values())
        for entry in reported:
            if entry.status != SubagentStatus.RUNNING:
                del self.entries[entry.subagent_id]
        return {"subagents": [entry.report() for entry in reported]}, False


def new_subagent_id() -> str:
    return f"sba_{secrets.token_hex(16)}"


def shell_quote(text: str) -> str:
    """`'…'` with each `'` as `'\\''` (§11.2)."""
    return "'" + text.replace("'", "'\\''") + "'"


def render_command(template: str, model: str, prompt: str | None) -> str:
    """Substitute `{model}` (and `{prompt}` in arg mode) in one pass: substituted text is never re-scanned."""
    values = {"model": shell_quote(model), "prompt": shell_quote(prompt) if prompt is not None else "{prompt}"}
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def error_payload(message: str) -> str:
    return json.dumps({"error": message}, separators=(",", ":"))


def launch_refusal(
    declaration: JsonObject, tool_input: object, tracker: SubagentTracker, limit: int, sandbox: SandboxHandle | None
) -> tuple[str | None, JsonObject | None]:
    """§11.2 checks 1–5, in order: (refusal text, or None and the chosen harness config)."""
    name = declaration["name"]
    fields = tool_input if isinstance(tool_input, dict) else {}
    harness, model, prompt = fields.get("harness"), fields.get("model"), fields.get("prompt")
    if not all(isinstance(value, str) and value.strip() for value in (harness, model, prompt)):
        return f'{name} requires string "harness", "model", and "prompt"', None
    config = next((entry for entry in declaration.get("subagents", []) if entry.get("harness") == harness), None)
    if config is None:
        return f'unknown harness "{harness}"', None
    if len(tracker.running()) >= limit:
        return f"subagent limit reached (max {limit} per session)", None
    if sandbox is None:
        return f"no remote sandbox is running for tool '{echo(name)}'; call session.startRemoteSandbox first", None
    if declaration.get("image") != sandbox.image:
        return (
            f'remote sandbox image mismatch: subagent declared "{declaration.get("image")}" '
            f'but the running sandbox uses "{sandbox.image}"'
        ), None
    return None, config


def cut_utf8(data: bytes, limit: int = OUTPUT_LIMIT) -> tuple[str, bool]:
    """At most `limit` bytes, cut back to a UTF-8 boundary; and whether anything was cut."""
    if len(data) <= limit:
        return data.decode("utf-8", errors="replace"), False
    for end in range(limit, max(limit - 4, 0), -1):  # a UTF-8 sequence is at most 4 bytes
        try:
            return data[:end].decode("utf-8"), True
        except UnicodeDecodeError:
            continue
    return data[:limit].decode("utf-8", errors="replace"), True


def apply_outcome(entry: Subagent, status: CommandStatus) -> tuple[str, JsonObject] | None:
    """Record a finished command on its entry; the event to append, or None while it runs (§11.2 table)."""
    state = status.state
    if state == CommandState.RUNNING:
        return None
    stdout, cut_out = cut_utf8(status.stdout)
    stderr, cut_err = cut_utf8(status.stderr)
    entry.stdout, entry.stderr = stdout, stderr
    entry.truncated = cut_out or cut_err or status.stdout_truncated or status.stderr_truncated
    if state == CommandState.EXITED and status.exit_code == 0:
        entry.status, entry.exit_code = SubagentStatus.COMPLETED, 0
        return "session.subagent.completed", entry.event(exit_code=0)
    if state == CommandState.EXITED:
        entry.status, entry.exit_code, entry.reason = SubagentStatus.FAILED, status.exit_code, "nonzero_exit"
        return "session.subagent.failed", entry.event(reason="nonzero_exit", exit_code=status.exit_code)
    if state == CommandState.TIMED_OUT:
        entry.status, entry.reason = SubagentStatus.TIMED_OUT, "timeout"
        return "session.subagent.failed", entry.event(reason="timeout", exit_code=None)
    if state == CommandState.KILLED:
        entry.status, entry.reason = SubagentStatus.CANCELLED, "explicit"
        return "session.subagent.cancelled", entry.event(reason="explicit", exit_code=None)
    entry.status, entry.reason, entry.detail = SubagentStatus.FAILED, "spawn_failed", status.detail or "spawn failed"
    return "session.subagent.failed", entry.event(reason="spawn_failed", exit_code=None)


def spawn_failed(entry: Subagent, error: BaeError) -> tuple[str, JsonObject]:
    entry.status, entry.reason, entry.detail = SubagentStatus.FAILED, "spawn_failed", error.detail
    return "session.subagent.failed", entry.event(reason="spawn_failed", exit_code=None)
