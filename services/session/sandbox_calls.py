"""Remote sandboxes of a session (SERVER-SPEC §10.4–10.6).

One sandbox per session, shared by all its drivers, placed by the
`SandboxPool` on a sandbox host. These functions write the lifecycle events;
the JSON-RPC checks live in `live.py`.
"""

from __future__ import annotations

from services.session.sandboxes import SandboxError


def available_images(pool, profile) -> list[dict]:
    """The `session.sandbox.available` image list, built from this profile only."""
    known = {entry["name"]: entry for entry in pool.status_for(profile.id)} if pool is not None else {}
    images = []
    for name in profile.available_sandboxes:
        entry = known.get(name, {"name": name, "status": "pending"})
        images.append({k: entry[k] for k in ("name", "status", "detail") if k in entry})
    return images


async def stop_sandbox(runtime, live, actor: str | None, *, reason: str) -> str | None:
    """Stop the session's sandbox; the handle goes first, so no phantom remains. Returns the error detail."""
    handle, live.sandbox = live.sandbox, None
    if handle is None:
        return None
    base = {"image": handle.image, "sandbox_id": handle.sandbox_id}
    await _append(runtime, live.session_id, actor, [("session.sandbox.stop", {**base, "reason": reason, "dispatch": "remote"})])
    try:
        await runtime.sandboxes.stop(handle)
    except SandboxError as exc:
        await _append(
            runtime,
            live.session_id,
            actor,
            [("session.sandbox.error", {**base, "phase": "stop", "detail": exc.detail, "dispatch": "remote", "unsandboxed": False})],
        )
        return exc.detail
    await _append(
        runtime,
        live.session_id,
        actor,
        [("session.sandbox.stopped", {**base, "reason": reason, "dispatch": "remote", "unsandboxed": False})],
    )
    return None


async def _append(runtime, session_id: str, actor: str | None, items) -> list[dict]:
    views = await runtime.store.append_events(session_id, [(actor, kind, payload) for kind, payload in items])
    await runtime.publish(session_id, views)
    return views


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


async def dispatch_sandbox_tool(turn, block: dict) -> dict:
    """Auto mode: run `input.command` in the session's sandbox, inside the turn."""
    name = block["name"]
    tool_input = block.get("input") or {}
    command = tool_input.get("command") if isinstance(tool_input, dict) else None
    await turn.emit(
        [("sandbox.request", {"tool": name, "input": tool_input, "command": command if isinstance(command, str) else None})]
    )
    handle = turn.live.sandbox
    pool = turn.runtime.sandboxes
    if handle is None or pool is None:
        response = {
            "sandbox_id": None,
            "ok": False,
            "error": f"no remote sandbox is running for tool '{name}'; call session.startRemoteSandbox first",
        }
    elif not isinstance(command, str):
        response = {
            "sandbox_id": None,
            "ok": False,
            "error": f'sandbox tool \'{name}\' input is missing the required string "command"',
        }
    else:
        try:
            result = await pool.exec(handle, command)
            response = {
                "sandbox_id": handle.sandbox_id,
                "ok": result.exit_code == 0,
                "result": {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code},
            }
        except SandboxError as exc:
            await turn.emit(
                [
                    (
                        "session.sandbox.error",
                        {"image": handle.image, "sandbox_id": handle.sandbox_id, "phase": "exec",
                         "detail": exc.detail, "dispatch": "remote", "unsandboxed": False},
                    )
                ]
            )
            response = {"sandbox_id": handle.sandbox_id, "ok": False, "error": exc.detail}
    if "result" in response:
        r = response["result"]
        text = render_exec(r["stdout"], r["stderr"], r["exit_code"])
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
