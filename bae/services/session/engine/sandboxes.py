"""Each live session's remote sandbox (SERVER-SPEC §10.2, §10.4–10.6): start, exec, stop, the
idle stop, the sandbox tool of a turn, and taking back a sandbox the reconciler (reconcile.py)
finds on a host after a restart or a takeover.

One sandbox per session, shared by all its drivers, placed by the `Sandboxes` port on a
sandbox host. This component writes the lifecycle events; the JSON-RPC parameter checks
live in `api/sandbox_methods.py`. A failed host call raises a kind of bae.common.errors,
whose detail is what the events and clients see.
"""

from __future__ import annotations

import logging
from typing import Any

from bae.common.errors import BaeError, echo
from bae.common.jsontext import JsonObject
from bae.services.session.engine.errors import SandboxFailed
from bae.services.session.engine.live import LiveSession
from bae.services.session.engine.ports import EventStore, ExecResult, ImageStatus, SandboxHandle, Sandboxes
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.engine.sandbox_idle import IdleWatch
from bae.services.session.engine.subagent_calls import SessionSubagents
from bae.services.session.engine.turn import Turn
from bae.services.session.store.events import EventView
from bae.services.session.store.records import ProfileRecord

log = logging.getLogger("bae.session.sandboxes")


def _remote(payload: JsonObject) -> JsonObject:
    return {**payload, "dispatch": "remote", "unsandboxed": False}


def _error(image: str, sandbox_id: str | None, phase: str, detail: str) -> tuple[str, JsonObject]:
    payload = {"image": image, "sandbox_id": sandbox_id} if sandbox_id is not None else {"image": image}
    return "session.sandbox.error", _remote({**payload, "phase": phase, "detail": detail})


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


class SessionSandboxes:
    def __init__(
        self,
        *,
        registry: SessionRegistry,
        store: EventStore,
        sandboxes: Sandboxes,
        subagents: SessionSubagents,
        idle_timeout: float,
    ) -> None:
        self._registry = registry
        self._store = store
        self._sandboxes = sandboxes
        self._subagents = subagents
        # BAE_SANDBOX_IDLE_TIMEOUT: a sandbox no command used for that long is stopped.
        self._idle = IdleWatch(idle_timeout, self._stop_idle)
        # Sessions whose sandbox is being started or stopped: the reconciler leaves what hosts list for them alone.
        self._busy: set[str] = set()

    # -- a session's sandbox ----------------------------------------------------------------

    async def start(
        self, live: LiveSession, actor: str, image: str, *, owner_key: str, max_per_key: int
    ) -> tuple[SandboxHandle, EventView]:
        """Start the session's sandbox; returns its handle and `running` event. Raises SandboxFailed,
        or QuotaExceeded (nothing recorded) when the session's creator `owner_key` already holds
        `max_per_key` sandboxes."""
        session_id = live.session_id
        # A slot a failure below leaves behind is this session's own: its next start takes it over,
        # and it stops counting once the session closes.
        await self._store.claim_sandbox(session_id, owner_key, max_per_key)
        await self._registry.append(session_id, actor, [("session.sandbox.start", {"image": image, "dispatch": "remote"})])
        self._busy.add(session_id)
        try:
            handle = await self._sandboxes.start(session_id, image)
        except BaeError as exc:
            await self._store.release_sandbox(session_id)
            await self._registry.append(session_id, actor, [_error(image, None, "start", exc.detail)])
            raise SandboxFailed(exc.detail) from exc
        finally:
            self._busy.discard(session_id)
            live.sandbox_changes += 1
        live.sandbox = handle
        self._idle.started(session_id, handle)
        running = _remote({"image": image, "sandbox_id": handle.sandbox_id})
        views = await self._registry.append(session_id, actor, [("session.sandbox.running", running)])
        return handle, views[0]

    async def exec(self, live: LiveSession, actor: str, handle: SandboxHandle, command: str) -> ExecResult:
        """Run one command; a host failure is logged as `session.sandbox.error` and raised as SandboxFailed."""
        try:
            return await self._exec(handle, command)
        except BaeError as exc:
            await self._registry.append(
                live.session_id, actor, [_error(handle.image, handle.sandbox_id, "exec", exc.detail)]
            )
            raise SandboxFailed(exc.detail) from exc

    async def _exec(self, handle: SandboxHandle, command: str) -> ExecResult:
        with self._idle.using(handle):
            return await self._sandboxes.exec(handle, command)

    async def stop(self, live: LiveSession, actor: str | None, *, reason: str) -> str | None:
        """Stop the session's sandbox; the handle goes first, so no phantom remains. Returns the error detail."""
        handle, live.sandbox = live.sandbox, None
        if handle is None:
            return None
        self._busy.add(live.session_id)
        try:
            return await self._stop(live, actor, handle, reason)
        finally:
            self._busy.discard(live.session_id)
            live.sandbox_changes += 1

    async def _stop(self, live: LiveSession, actor: str | None, handle: SandboxHandle, reason: str) -> str | None:
        stop = {"image": handle.image, "sandbox_id": handle.sandbox_id, "reason": reason}
        await self._registry.append(live.session_id, actor, [("session.sandbox.stop", {**stop, "dispatch": "remote"})])
        self._idle.forget(handle)
        try:
            await self._sandboxes.stop(handle)
        except BaeError as exc:
            await self._store.release_sandbox(live.session_id)
            await self._registry.append(
                live.session_id, actor, [_error(handle.image, handle.sandbox_id, "stop", exc.detail)]
            )
            return exc.detail
        await self._store.release_sandbox(live.session_id)
        await self._registry.append(live.session_id, actor, [("session.sandbox.stopped", _remote(stop))])
        return None

    async def _stop_idle(self, session_id: str, handle: SandboxHandle) -> None:
        """BAE_SANDBOX_IDLE_TIMEOUT passed without a command: stop it as an explicit stop would."""
        live = self._registry.get(session_id)
        if live is not None and live.sandbox is handle:
            await self.stop(live, None, reason="idle_timeout")

    async def answer_tool(self, turn: Turn, block: JsonObject) -> JsonObject:
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
                "error": f"no remote sandbox is running for tool '{echo(name)}'; call session.startRemoteSandbox first",
            }
        elif command is None:
            response = {
                "sandbox_id": None,
                "ok": False,
                "error": f'sandbox tool \'{name}\' input is missing the required string "command"',
            }
        else:
            try:
                # A cancelled turn ends the call, and the host then kills the command.
                result = await turn.interruptible(self._exec(handle, command))
            except BaeError as exc:
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

    # -- images (§10.2) ------------------------------------------------------------------------

    def available_images(self, profile: ProfileRecord) -> list[ImageStatus]:
        """The `session.sandbox.available` image list, built from this profile only."""
        known = {entry["name"]: entry for entry in self._sandboxes.status_for(profile.id)}
        images: list[ImageStatus] = []
        for name in profile.available_sandboxes:
            entry = known.get(name, {"name": name, "status": "pending"})
            image: ImageStatus = {"name": entry["name"], "status": entry["status"]}
            if "detail" in entry:
                image["detail"] = entry["detail"]
            images.append(image)
        return images

    def provision(self, profile: ProfileRecord) -> None:
        """Profile created or replaced: (re)provision its sandbox images in the background (§10.2)."""
        self._sandboxes.provision(profile.id, profile.available_sandboxes)  # [] forgets the profile

    def status_view(self) -> JsonObject:
        return self._sandboxes.status_view()

    # -- start-up, reconciliation, shutdown ---------------------------------------------------

    async def prepare(self) -> None:
        """At start-up: resolve the sandbox hosts and re-provision the images of every live profile
        that declares any (the reconciler then takes back what the hosts still run)."""
        await self._sandboxes.start_watching()
        await self.follow_profiles()

    def know(self, profile: ProfileRecord) -> None:
        """Provision `profile`'s images unless this replica has them as the profile declares them:
        a profile created or changed through another replica reaches this one at its first use here
        (or the next `follow_profiles`), not only at a restart."""
        declared = list(dict.fromkeys(profile.available_sandboxes))
        if [entry["name"] for entry in self._sandboxes.status_for(profile.id)] != declared:
            self.provision(profile)

    async def follow_profiles(self) -> None:
        """Every live profile's images as the store has them now, whichever replica changed them, so
        that the image set each replica tells the hosts is the same (the reconciler's every pass)."""
        profiles = await self._store.live_profiles()
        for profile in profiles:
            self.know(profile)
        live_ids = {profile.id for profile in profiles}
        for item in self._sandboxes.status_view()["items"]:
            if item["profile_id"] not in live_ids:
                self._sandboxes.provision(item["profile_id"], [])  # deleted through another replica

    def busy(self, session_id: str) -> bool:
        """Whether a start or stop of the session's sandbox is under way (a host's list may be ahead of it)."""
        return session_id in self._busy

    async def take_back(self, live: LiveSession, handle: SandboxHandle, command_ids: list[str]) -> None:
        """A sandbox a host runs for this replica's session, which holds none: it becomes the
        session's again (a restart or a takeover left it running), with its subagents that the
        log shows running and the host still runs (`command_ids`, the sandbox's commands)."""
        live.sandbox = handle
        self._sandboxes.adopt(handle)
        self._idle.started(live.session_id, handle)
        log.info("re-attached sandbox %s of session %s", handle.sandbox_id, live.session_id)
        logged = await self._store.subagent_events(live.session_id)
        self._subagents.adopt(live, handle.host, command_ids, logged)

    async def close(self) -> None:
        """Last shutdown phase. Sandboxes keep running on their hosts; the next start takes them back."""
        await self._idle.close()
        await self._sandboxes.close()
