"""The sandbox JSON-RPC methods (SERVER-SPEC §10): start, stop and exec a remote
sandbox, and record what a client reports of its local one.

One remote sandbox per session, shared by its drivers; the work itself is in
`engine.sandboxes`, which the turn loop's Auto dispatch uses too.
"""

from __future__ import annotations

import logging

from bae.common.limits import Limits
from bae.common.protos import client_api_pb2
from bae.common.rpc_codes import RpcCode
from bae.services.session.api.faults import RpcFault, invalid_params
from bae.services.session.api.jsonrpc import RpcCall, require_driver
from bae.services.session.engine.errors import ProfileUnavailable, SandboxFailed
from bae.services.session.engine.live import LiveSession
from bae.services.session.engine.ports import SandboxHandle
from bae.services.session.engine.reconcile import Reconciler
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.engine.sandboxes import SessionSandboxes

log = logging.getLogger("bae.session.sandbox_methods")

SANDBOX_NOT_RUNNING = "sandbox_not_running: no remote sandbox is running for this session"


class SandboxMethods:
    def __init__(
        self, *, sessions: SessionRegistry, sandboxes: SessionSandboxes, reconciler: Reconciler, limits: Limits
    ) -> None:
        self.sessions = sessions
        self.sandboxes = sandboxes
        self.reconciler = reconciler
        self.limits = limits  # the [limits] defaults; a profile's own override them

    async def start_remote_sandbox(
        self, call: RpcCall[client_api_pb2.StartRemoteSandboxParams]
    ) -> client_api_pb2.StartRemoteSandboxResult:
        live = await require_driver(self.sessions, call, "session.startRemoteSandbox")
        call.open_session()
        image = call.params().image
        if call.profile is None:
            raise ProfileUnavailable
        if image not in call.profile.available_sandboxes:
            raise RpcFault(
                RpcCode.SANDBOX_IMAGE_NOT_ALLOWED,
                f'sandbox_image_not_allowed: image "{image}" is not in this session profile\'s available_sandboxes',
            )
        async with live.lock:
            if live.sandbox is not None:
                raise RpcFault(
                    RpcCode.APPLICATION_ERROR,
                    "a remote sandbox is already running for this session; call session.stopRemoteSandbox first",
                )
            # The profile may have been created through another replica: its images are allowed on
            # the hosts before the start asks for one.
            self.sandboxes.know(call.profile)
            try:
                owner_key = call.open_session().client_key_id
                max_per_key = self.limits.overridden(call.profile.limits).max_sandboxes_per_key
                handle, running = await self.sandboxes.start(
                    live, call.actor, image, owner_key=owner_key, max_per_key=max_per_key
                )
            except SandboxFailed as exc:
                raise RpcFault(RpcCode.SANDBOX_START_FAILED, f"sandbox_start_failed: {exc.detail}") from None
        return client_api_pb2.StartRemoteSandboxResult(
            sandbox_id=handle.sandbox_id, image=image, started_at=running["created_at"]
        )

    async def stop_remote_sandbox(
        self, call: RpcCall[client_api_pb2.StopRemoteSandboxParams]
    ) -> client_api_pb2.StopRemoteSandboxResult:
        live = await require_driver(self.sessions, call, "session.stopRemoteSandbox")
        handle = await self._running(live)
        detail = await self.sandboxes.stop(live, call.actor, reason="explicit")
        if detail is not None:
            raise RpcFault(RpcCode.APPLICATION_ERROR, f"sandbox stop failed: {detail}")
        return client_api_pb2.StopRemoteSandboxResult(stopped=True, image=handle.image, sandbox_id=handle.sandbox_id)

    async def exec_remote_sandbox(
        self, call: RpcCall[client_api_pb2.ExecRemoteSandboxParams]
    ) -> client_api_pb2.ExecRemoteSandboxResult:
        live = await require_driver(self.sessions, call, "session.execRemoteSandbox")
        command = call.params().command
        handle = await self._running(live)
        try:
            result = await self.sandboxes.exec(live, call.actor, handle, command)
        except SandboxFailed as exc:
            raise RpcFault(RpcCode.APPLICATION_ERROR, f"sandbox exec failed: {exc.detail}") from None
        return client_api_pb2.ExecRemoteSandboxResult(
            stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code
        )

    async def _running(self, live: LiveSession) -> SandboxHandle:
        """The session's sandbox. When it holds none, a pass for this session looks first: this replica
        may have taken the session over (or restarted) a moment ago, before its sandbox, which the
        host still runs, was taken back."""
        if live.sandbox is None:
            await self.reconciler.run(live.session_id)
        if live.sandbox is None:
            raise RpcFault(RpcCode.SANDBOX_NOT_RUNNING, SANDBOX_NOT_RUNNING)
        return live.sandbox

    async def report_local_sandbox(
        self, call: RpcCall[client_api_pb2.ReportLocalSandboxParams]
    ) -> client_api_pb2.ReportResult:
        await require_driver(self.sessions, call, "session.reportLocalSandbox")
        params = call.params()
        unsandboxed = params.unsandboxed
        image = params.image if params.HasField("image") else None
        # The one rule across fields: an image exactly when sandboxed.
        if unsandboxed and image is not None:
            raise invalid_params('"image" must be null when "unsandboxed" is true')
        if image is None and not unsandboxed:
            raise invalid_params('missing "image"')
        payload = {
            "dispatch": "local",
            "image": image,
            "unsandboxed": unsandboxed,
            "container_id": params.container_id if params.HasField("container_id") else None,
            "detail": params.detail if params.HasField("detail") else None,
        }
        await self.sessions.append(call.session_id, call.actor, [(f"session.sandbox.{params.state}", payload)])
        return client_api_pb2.ReportResult(reported=True)
