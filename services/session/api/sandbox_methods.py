"""The sandbox JSON-RPC methods (SERVER-SPEC §10): start, stop and exec a remote
sandbox, and record what a client reports of its local one.

One remote sandbox per session, shared by its drivers; the work itself is in
`sandbox_calls`, which the turn loop's Auto dispatch uses too.
"""

from __future__ import annotations

import logging

from bae.protos import session_pb2
from services.session.api.jsonrpc import PROFILE_GONE, InvalidParams, error_reply, gate, parse_params, result_reply
from services.session.engine.sandbox_calls import exec_in_sandbox, start_sandbox, stop_sandbox
from services.session.remote.sandbox_pool import SandboxError

log = logging.getLogger("bae.session.sandbox_methods")

SANDBOX_NOT_RUNNING = "sandbox_not_running: no remote sandbox is running for this session"


class SandboxMethods:
    def __init__(self, *, auth, runtime) -> None:
        self.auth = auth
        self.runtime = runtime

    async def start_remote_sandbox(self, request, context) -> session_pb2.RpcReply:
        actor, _, profile, refusal = await gate(self.auth, self.runtime, request, "session.startRemoteSandbox", needs_open=True)
        if refusal:
            return error_reply(*refusal)
        try:
            image = parse_params(request).get("image")
        except InvalidParams as exc:
            return error_reply(-32602, str(exc))
        if not isinstance(image, str) or not image.strip():
            return error_reply(-32602, 'Invalid params: missing "image"')
        if profile is None:
            return error_reply(-32000, PROFILE_GONE)
        if image not in profile.available_sandboxes:
            return error_reply(
                -32011,
                f'sandbox_image_not_allowed: image "{image}" is not in this session profile\'s available_sandboxes',
            )
        live = self.runtime.get(request.session_id)
        async with live.lock:
            if live.sandbox is not None:
                return error_reply(
                    -32000,
                    "a remote sandbox is already running for this session; call session.stopRemoteSandbox first",
                )
            try:
                handle, running = await start_sandbox(self.runtime, live, actor, image)
            except SandboxError as exc:
                return error_reply(-32012, f"sandbox_start_failed: {exc.detail}")
        return result_reply({"sandbox_id": handle.sandbox_id, "image": image, "started_at": running["created_at"]})

    async def stop_remote_sandbox(self, request, context) -> session_pb2.RpcReply:
        actor, _, _, refusal = await gate(self.auth, self.runtime, request, "session.stopRemoteSandbox")
        if refusal:
            return error_reply(*refusal)
        live = self.runtime.sessions.get(request.session_id)
        handle = live.sandbox if live else None
        if handle is None:
            return error_reply(-32013, SANDBOX_NOT_RUNNING)
        detail = await stop_sandbox(self.runtime, live, actor, reason="explicit")
        if detail is not None:
            return error_reply(-32000, f"sandbox stop failed: {detail}")
        return result_reply({"stopped": True, "image": handle.image, "sandbox_id": handle.sandbox_id})

    async def exec_remote_sandbox(self, request, context) -> session_pb2.RpcReply:
        actor, _, _, refusal = await gate(self.auth, self.runtime, request, "session.execRemoteSandbox")
        if refusal:
            return error_reply(*refusal)
        try:
            command = parse_params(request).get("command")
        except InvalidParams as exc:
            return error_reply(-32602, str(exc))
        if not isinstance(command, str):
            return error_reply(-32602, 'Invalid params: missing "command"')
        live = self.runtime.sessions.get(request.session_id)
        handle = live.sandbox if live else None
        if handle is None:
            return error_reply(-32013, SANDBOX_NOT_RUNNING)
        try:
            result = await exec_in_sandbox(self.runtime, live, actor, handle, command)
        except SandboxError as exc:
            return error_reply(-32000, f"sandbox exec failed: {exc.detail}")
        return result_reply({"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code})

    async def report_local_sandbox(self, request, context) -> session_pb2.RpcReply:
        actor, _, _, refusal = await gate(self.auth, self.runtime, request, "session.reportLocalSandbox")
        if refusal:
            return error_reply(*refusal)
        try:
            params = parse_params(request)
        except InvalidParams as exc:
            return error_reply(-32602, str(exc))
        state = params.get("state")
        if state not in ("running", "stopped", "error"):
            return error_reply(-32602, 'Invalid params: "state" must be "running", "stopped", or "error"')
        unsandboxed = params.get("unsandboxed", False)
        if not isinstance(unsandboxed, bool):
            return error_reply(-32602, 'Invalid params: "unsandboxed" must be a boolean')
        image = params.get("image")
        if image is not None and not isinstance(image, str):
            return error_reply(-32602, 'Invalid params: "image" must be a string or null')
        if unsandboxed and image is not None:
            return error_reply(-32602, 'Invalid params: "image" must be null when "unsandboxed" is true')
        if image is None and not unsandboxed:
            return error_reply(-32602, 'Invalid params: missing "image"')
        payload = {
            "dispatch": "local",
            "image": image,
            "unsandboxed": unsandboxed,
            "container_id": params.get("container_id"),
            "detail": params.get("detail"),
        }
        try:
            await self.runtime.append(request.session_id, actor, [(f"session.sandbox.{state}", payload)])
        except Exception:
            log.exception("recording a local sandbox report on %s failed", request.session_id)
            return error_reply(-32603, "Internal error")
        return result_reply({"reported": True})
