"""Remote sandboxes of a session (SERVER-SPEC §10.4–10.6).

One sandbox per session, shared by all its drivers, placed by the
`SandboxPool` on a sandbox host. These functions drive the pool and write
the lifecycle events; the JSON-RPC parameter checks live in `sandbox_methods`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.session.engine.ports import ExecResult, SandboxHandle
from services.session.remote.sandbox_pool import SandboxError, SandboxPool
from services.session.store.records import ProfileRecord

if TYPE_CHECKING:  # runtime and turn import this module; the annotations alone need them
    from services.session.engine.runtime import LiveSession, SessionRuntime
    from services.session.engine.turn import Turn

NO_HOSTS = "no sandbox hosts are configured (BAE_SANDBOX_GRPC_ADDRS is empty)"


def _pool(runtime: SessionRuntime) -> SandboxPool:
    if runtime.sandboxes is None:
        raise SandboxError(NO_HOSTS)
    return runtime.sandboxes


def available_images(pool: SandboxPool | None, profile: ProfileRecord) -> list[dict]:
    """The `session.sandbox.available` image list, built from this profile only."""
    known = {entry["name"]: entry for entry in pool.status_for(profile.id)} if pool is not None else {}
    images = []
    for name in profile.available_sandboxes:
        entry = known.get(name, {"name": name, "status": "pending"})
        images.append({k: entry[k] for k in ("name", "status", "detail") if k in entry})
    return images


def _remote(payload: dict) -> dict:
    return {**payload, "dispatch": "remote", "unsandboxed": False}


def _error(image: str, sandbox_id: str | None, phase: str, detail: str) -> tuple[str, dict]:
    payload = {"image": image, "sandbox_id": sandbox_id} if sandbox_id is not None else {"image": image}
    return "session.sandbox.error", _remote({**payload, "phase": phase, "detail": detail})


async def start_sandbox(runtime: SessionRuntime, live: LiveSession, actor: str, image: str) -> tuple[SandboxHandle, dict]:
    """Start the session's sandbox; returns its handle and `running` event. Raises SandboxError."""
    await runtime.append(live.session_id, actor, [("session.sandbox.start", {"image": image, "dispatch": "remote"})])
    try:
        if runtime.sandboxes is None:
            raise SandboxError(NO_HOSTS)
        handle = await runtime.sandboxes.start(live.session_id, image)
    except SandboxError as exc:
        await runtime.append(live.session_id, actor, [_error(image, None, "start", exc.detail)])
        raise
    live.sandbox = handle
    running = _remote({"image": image, "sandbox_id": handle.sandbox_id})
    views = await runtime.append(live.session_id, actor, [("session.sandbox.running", running)])
    return handle, views[0]


async def exec_in_sandbox(runtime: SessionRuntime, live: LiveSession, actor: str, handle: SandboxHandle, command: str) -> ExecResult:
    """Run one command; a driver failure is logged as `session.sandbox.error` and re-raised."""
    try:
        return await _pool(runtime).exec(handle, command)
    except SandboxError as exc:
        await runtime.append(live.session_id, actor, [_error(handle.image, handle.sandbox_id, "exec", exc.detail)])
        raise


async def stop_sandbox(runtime: SessionRuntime, live: LiveSession, actor: str | None, *, reason: str) -> str | None:
    """Stop the session's sandbox; the handle goes first, so no phantom remains. Returns the error detail."""
    handle, live.sandbox = live.sandbox, None
    if handle is None:
        return None
    stop = {"image": handle.image, "sandbox_id": handle.sandbox_id, "reason": reason}
    await runtime.append(live.session_id, actor, [("session.sandbox.stop", {**stop, "dispatch": "remote"})])
    try:
        await _pool(runtime).stop(handle)
    except SandboxError as exc:
        await runtime.append(live.session_id, actor, [_error(handle.image, handle.sandbox_id, "stop", exc.detail)])
        return exc.detail
    await runtime.append(live.session_id, actor, [("session.sandbox.stopped", _remote(stop))])
    return None


def render_exec(stdout: str, stderr: str, exit_code: int) -> str:
    """stdout, then `[stderr]` and `[exit_code: N]` sections, each on its own line (§10.6)."""
    text = stdout
    if stderr.strip():
        if text and not text.endswith("\n"):
            text += "\n"
        text += "[stderr]\n" + stderr
    if exit_code != 0:
        if text and not text.endswith("\n"):
            text += "\n"
        text += f"[exit_code: {exit_code}]"
    return text


async def dispatch_sandbox_tool(turn: Turn, block: dict) -> dict:
    """Auto mode: run `input.command` in the session's sandbox, inside the turn."""
    name = block["name"]
    tool_input = block.get("input") or {}
    command = tool_input.get("command") if isinstance(tool_input, dict) else None
    if not isinstance(command, str):
        command = None
    await turn.emit([("sandbox.request", {"tool": name, "input": tool_input, "command": command})])
    handle = turn.live.sandbox
    response: dict[str, Any]
    if handle is None:
        response = {
            "sandbox_id": None,
            "ok": False,
            "error": f"no remote sandbox is running for tool '{name}'; call session.startRemoteSandbox first",
        }
    elif command is None:
        response = {
            "sandbox_id": None,
            "ok": False,
            "error": f'sandbox tool \'{name}\' input is missing the required string "command"',
        }
    else:
        try:
            result = await _pool(turn.runtime).exec(handle, command)
        except SandboxError as exc:
            await turn.emit([_error(handle.image, handle.sandbox_id, "exec", exc.detail)])
            response = {"sandbox_id": handle.sandbox_id, "ok": False, "error": exc.detail}
        else:
            response = {
                "sandbox_id": handle.sandbox_id,
                "ok": result.exit_code == 0,
                "result": {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code},
            }
    if "result" in response:
        text = render_exec(**response["result"])
    else:
        text = f"sandbox error: {response['error']}"
    content = [{"type": "text", "text": text}]
    is_error = not response["ok"]
    await turn.emit(
        [
            ("sandbox.response", response),
            ("tool.result", {"tool_use_id": block["id"], "dispatch": "sandbox", "server_name": None,
                             "is_error": is_error, "content": content}),
        ]
    )
    return {"type": "tool_result", "tool_use_id": block["id"], "content": content, "is_error": is_error}
