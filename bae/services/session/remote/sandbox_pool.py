"""Session-side pool of sandbox hosts: placement, calls with deadlines, image provisioning.

One channel per host. A background task polls each host's health every
`poll_interval` seconds; only hosts answering SERVING receive new sandboxes,
and a new sandbox goes to the one with the fewest running sandboxes (counted
here). A sandbox stays on its host: calls for it go there, and a host that is
down turns them into an `Unavailable` error at once or within the call's deadline.

Image status (SERVER-SPEC §10.2) is process memory keyed profile_id → image.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bae.common import error_codes
from bae.common.discovery import Discovery, needs_discovery
from bae.common.errors import BaeError, Conflict, DeadlineExceeded, Internal, TooLarge, Unavailable, Unprocessable
from bae.common.grpcutil import channel
from bae.common.internal import InternalPlane
from bae.common.protos import sandbox_pb2, sandbox_pb2_grpc
from bae.services.session.engine.ports import (
    CommandState,
    CommandStatus,
    ExecResult,
    HostCommand,
    HostInventory,
    HostSandbox,
    ImageStatus,
    SandboxHandle,
)

log = logging.getLogger("bae.session.sandboxes")

SERVICE_NAME = sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"].full_name
HOST_UNAVAILABLE = "the sandbox host is unavailable"
# The reason of a host's refusal before it was told the allowed images (bae/services/sandbox/images.py):
# it restarted since, so it is told again and the call retried once.
IMAGES_UNKNOWN = "images_unknown"


_STATES = {
    sandbox_pb2.CommandStatus.RUNNING: CommandState.RUNNING,
    sandbox_pb2.CommandStatus.EXITED: CommandState.EXITED,
    sandbox_pb2.CommandStatus.TIMED_OUT: CommandState.TIMED_OUT,
    sandbox_pb2.CommandStatus.KILLED: CommandState.KILLED,
    sandbox_pb2.CommandStatus.FAILED: CommandState.FAILED,
}


def command_status(status: sandbox_pb2.CommandStatus) -> CommandStatus:
    return CommandStatus(
        state=_STATES.get(status.state, CommandState.FAILED),
        exit_code=status.exit_code,
        stdout=status.stdout,
        stderr=status.stderr,
        stdout_truncated=status.stdout_truncated,
        stderr_truncated=status.stderr_truncated,
        detail=status.detail,
    )


class _Host:
    def __init__(self, address: str, plane: InternalPlane) -> None:
        self.address = address
        self.channel = channel(address, plane)
        self.stub = sandbox_pb2_grpc.SandboxStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.up: bool | None = None  # None until the first poll answers or fails
        self.running = 0
        self.images_version = -1  # the version of the allowed images this host last received
        # Whether an inventory (reconciliation) has covered this host since it was added.
        self.inventoried = False


class SandboxPool:
    def __init__(
        self,
        addrs: list[str],
        rpc_timeout: float,
        plane: InternalPlane,
        *,
        # Bounds an Exec call whose host stopped answering; the host enforces the real
        # exec timeout (BAE_SANDBOX_EXEC_TIMEOUT), which may be set far above the default.
        exec_timeout: float = 86_400.0,
        pull_timeout: float = 600.0,
        poll_interval: float = 2.0,
        host_wait: float = 30.0,
    ) -> None:
        """`addrs`: host addresses, or names (e.g. a scaled docker-compose service) that are
        re-resolved to all their addresses. `host_wait`: how long provisioning waits for a first
        healthy host (start-up races)."""
        self._rpc_timeout = rpc_timeout
        self._plane = plane
        self._exec_timeout = exec_timeout
        self._pull_timeout = pull_timeout
        self._poll_interval = poll_interval
        self._host_wait = host_wait
        self._hosts: dict[str, _Host] = {}
        self._poller: asyncio.Task[None] | None = None
        # Profile id -> its images' statuses by name.
        self._status: dict[str, dict[str, ImageStatus]] = {}
        self._provisioning: dict[str, asyncio.Task[None]] = {}
        self._retired: list[_Host] = []
        # The images hosts may pull and start (every image some profile declares), and its version.
        self._images: tuple[str, ...] = ()
        self._images_version = 0
        # Called when a host no inventory has covered yet is seen up: a host down or silent at
        # start-up still holds the sandboxes and subagents of open sessions.
        self._on_new_host: Callable[[], None] | None = None
        self._discovery = Discovery(self, addrs, what="sandbox hosts") if needs_discovery(addrs) else None
        self.set_addrs(addrs)

    async def start_watching(self) -> None:
        """Resolve the hosts named by DNS, and keep resolving them."""
        if self._discovery is not None:
            await self._discovery.refresh()
            self._discovery.start()

    def on_new_host(self, callback: Callable[[], None]) -> None:
        self._on_new_host = callback

    # -- hosts and health -------------------------------------------------------------------

    def set_addrs(self, addrs: list[str]) -> None:
        """Replace the host list (e.g. a DNS name re-resolved); removed hosts' sandboxes become unreachable."""
        wanted = list(dict.fromkeys(addrs))
        for address in list(self._hosts):
            if address not in wanted:
                self._retired.append(self._hosts.pop(address))
        for address in wanted:
            if address not in self._hosts:
                self._hosts[address] = _Host(address, self._plane)

    def _ensure_polling(self) -> None:
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    async def _poll_forever(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(self._poll_interval)

    async def poll(self) -> None:
        """Check every host's health once, concurrently, each within a deadline."""
        await asyncio.gather(*(self._check(host) for host in list(self._hosts.values())))
        for host in self._retired:
            await host.channel.close()
        self._retired.clear()

    async def _check(self, host: _Host) -> None:
        request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        try:
            reply = await host.health.Check(request, timeout=min(self._rpc_timeout, self._poll_interval))
            up = reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            up = False
        if up != host.up:
            log.log(logging.INFO if up else logging.WARNING, "sandbox host %s is %s", host.address, "up" if up else "down")
            if up and host.up is False and not host.inventoried and self._on_new_host is not None:
                self._on_new_host()
        host.up = up

    async def _healthy(self) -> list[_Host]:
        """Hosts up at the last poll; polls now when a host is new or none is up."""
        self._ensure_polling()
        if not any(host.up for host in self._hosts.values()) or any(
            host.up is None for host in self._hosts.values()
        ):
            await self.poll()
        return [host for host in self._hosts.values() if host.up]

    def _host_of(self, handle: SandboxHandle) -> _Host:
        host = self._hosts.get(handle.host)
        if host is None:
            log.warning("sandbox %s: its host %s is no longer configured", handle.sandbox_id, handle.host)
            raise Unavailable("the sandbox's host is no longer configured")
        if host.up is False:
            raise Unavailable(HOST_UNAVAILABLE)
        return host

    def _failure(self, host: _Host, error: grpc.aio.AioRpcError, timeout: float) -> BaeError:
        """The error of a failed call. Its detail reaches clients and events: an error the host
        raised on purpose (bae.common.error_codes) is raised again as it came; a host that is
        down or failed, and gRPC's own failures, are told by what happened, their texts (which
        may name addresses, e.g. "Sent message larger than max") going to the log."""
        verdict = error_codes.raised_by(error)
        if verdict is not None and not isinstance(verdict, (Unavailable, Internal)):
            return verdict
        code = error.code()
        log.warning("sandbox host %s: call failed: %s %s", host.address, code.name, error.details())
        if code == grpc.StatusCode.UNAVAILABLE:
            host.up = False
            return Unavailable(HOST_UNAVAILABLE)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceeded(f"the sandbox host did not answer within {timeout:g}s")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return TooLarge("the sandbox call exceeded a size limit")
        if code == grpc.StatusCode.UNIMPLEMENTED:  # a host older than this client
            return Unprocessable(error.details() or "unimplemented")
        return Internal("the sandbox host failed; see its log")

    async def _call(self, host: _Host, method: str, request: Message, timeout: float) -> Any:
        """The reply of the Sandbox service's `method` (its stub is looked up by name)."""
        try:
            return await getattr(host.stub, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise self._failure(host, error, timeout) from None

    async def _image_call(self, host: _Host, method: str, request: Message, timeout: float) -> Any:
        """EnsureImage or Start, once the host has the current allowed images. A host that lost
        them (ABORTED: it restarted) is told again and the call retried once."""
        for attempt in range(2):
            if host.images_version != self._images_version:
                version, images = self._images_version, self._images
                await self._call(host, "AllowImages", sandbox_pb2.AllowImagesRequest(images=images), self._rpc_timeout)
                host.images_version = version
            try:
                return await getattr(host.stub, method)(request, timeout=timeout)
            except grpc.aio.AioRpcError as error:
                failure = self._failure(host, error, timeout)
                if attempt or not (isinstance(failure, Conflict) and failure.reason == IMAGES_UNKNOWN):
                    raise failure from None
                host.images_version = -1

    # -- sandboxes ----------------------------------------------------------------------------

    async def ensure_image(self, image: str) -> bool:
        """Ensure the image on every healthy host; True when some host pulled it now."""
        hosts = await self._healthy()
        if not hosts:
            raise Unavailable("no sandbox host is available")
        request = sandbox_pb2.EnsureImageRequest(image=image)
        replies = await asyncio.gather(
            *(self._image_call(host, "EnsureImage", request, self._pull_timeout) for host in hosts),
            return_exceptions=True,
        )
        answered = [reply for reply in replies if not isinstance(reply, BaseException)]
        for host, reply in zip(hosts, replies):
            # A host that went down meanwhile is not a verdict on the image, if another host had it.
            if isinstance(reply, BaseException) and (host.up or not answered):
                raise reply
        return any(reply.pulled for reply in answered)

    async def start(self, session_id: str, image: str) -> SandboxHandle:
        """Place a sandbox on the least loaded healthy host (the next one if that host is down)."""
        hosts = await self._healthy()
        if not hosts:
            raise Unavailable("no sandbox host is available")
        last: BaeError | None = None
        for host in sorted(hosts, key=lambda h: h.running):
            host.running += 1  # counted at once, so concurrent starts spread out
            try:
                await self._image_call(
                    host, "EnsureImage", sandbox_pb2.EnsureImageRequest(image=image), self._pull_timeout
                )
                reply = await self._image_call(
                    host, "Start", sandbox_pb2.StartRequest(session_id=session_id, image=image), self._rpc_timeout
                )
            except BaeError as exc:
                host.running -= 1
                if host.up is False:  # the host went away: the next one may do
                    last = exc
                    continue
                raise
            return SandboxHandle(host=host.address, sandbox_id=reply.sandbox_id, image=image)
        assert last is not None
        raise last

    async def exec(self, handle: SandboxHandle, command: str) -> ExecResult:
        """Run one command; the host applies its own exec timeout (BAE_SANDBOX_EXEC_TIMEOUT).

        The call's deadline only bounds a host that stops answering.
        """
        host = self._host_of(handle)
        request = sandbox_pb2.ExecRequest(sandbox_id=handle.sandbox_id, command=command, timeout_seconds=0)
        reply = await self._call(host, "Exec", request, self._exec_timeout + self._rpc_timeout)
        return ExecResult(stdout=reply.stdout, stderr=reply.stderr, exit_code=reply.exit_code)

    async def stop(self, handle: SandboxHandle) -> None:
        """Stop the sandbox; the pool forgets it either way (the caller already dropped its handle)."""
        host = self._hosts.get(handle.host)
        if host is not None:
            host.running = max(host.running - 1, 0)
        host = self._host_of(handle)
        await self._call(host, "Stop", sandbox_pb2.StopRequest(sandbox_id=handle.sandbox_id), self._rpc_timeout)

    # -- background commands (subagents) --------------------------------------------------------

    async def start_command(
        self, handle: SandboxHandle, command_id: str, command: str, *, stdin: bytes, timeout: float, output_limit: int
    ) -> None:
        request = sandbox_pb2.StartCommandRequest(
            sandbox_id=handle.sandbox_id,
            command_id=command_id,
            command=command,
            stdin=stdin,
            timeout_seconds=timeout,
            output_limit_bytes=output_limit,
        )
        await self._call(self._host_of(handle), "StartCommand", request, self._rpc_timeout)

    async def wait_command(self, host: str, command_id: str, wait: float) -> CommandStatus:
        """The command's state once it ended, or after `wait` seconds; its whole kept output."""
        request = sandbox_pb2.WaitCommandRequest(command_id=command_id, wait_seconds=wait)
        return command_status(await self._call(self._address(host), "WaitCommand", request, wait + self._rpc_timeout))

    async def kill_command(self, host: str, command_id: str) -> None:
        request = sandbox_pb2.KillCommandRequest(command_id=command_id)
        await self._call(self._address(host), "KillCommand", request, self._rpc_timeout)

    async def inventory(self) -> list[HostInventory]:
        """Each reachable host's sandboxes and background commands (reconciliation)."""
        found = []
        for host in await self._healthy():
            try:
                # Commands first: a command listed then has its sandbox in the list that follows
                # (unless that sandbox stopped meanwhile, which ended the command too).
                commands = await self._call(host, "ListCommands", sandbox_pb2.ListCommandsRequest(), self._rpc_timeout)
                sandboxes = await self._call(host, "List", sandbox_pb2.ListRequest(), self._rpc_timeout)
            except BaeError as exc:
                log.warning("sandbox host %s: inventory failed: %s", host.address, exc.detail)
                continue
            host.inventoried = True
            found.append(
                HostInventory(
                    host.address,
                    [HostSandbox(i.sandbox_id, i.session_id, i.image, i.state) for i in sandboxes.sandboxes],
                    [HostCommand(c.command_id, c.sandbox_id, c.state == sandbox_pb2.CommandStatus.RUNNING)
                     for c in commands.commands],
                )
            )
        return found

    def adopt(self, handle: SandboxHandle) -> None:
        """Count a sandbox found running on a host as placed (reconciliation)."""
        host = self._hosts.get(handle.host)
        if host is not None:
            host.running += 1

    def _address(self, address: str) -> _Host:
        host = self._hosts.get(address)
        if host is None:
            raise Unavailable("the sandbox's host is no longer configured")
        return host

    def running_counts(self) -> dict[str, int]:
        return {address: host.running for address, host in self._hosts.items()}

    # -- image provisioning (§10.2) ---------------------------------------------------------

    def provision(self, profile_id: str, images: Iterable[str]) -> None:
        """Set the profile's images `pending` now, then ensure them in the background.

        Replaces the profile's previous status set; call from the event loop.
        """
        previous = self._provisioning.pop(profile_id, None)
        if previous is not None:
            previous.cancel()
        names = list(dict.fromkeys(images))
        if not names:
            self._status.pop(profile_id, None)
            self._images_changed()
            return
        statuses: dict[str, ImageStatus] = {name: {"name": name, "status": "pending"} for name in names}
        self._status[profile_id] = statuses
        self._images_changed()
        self._provisioning[profile_id] = asyncio.get_running_loop().create_task(
            self._provision(profile_id, statuses)
        )

    def _images_changed(self) -> None:
        """Hosts may pull and start every image some profile declares, and nothing else."""
        images = tuple(sorted({name for statuses in self._status.values() for name in statuses}))
        if images != self._images:
            self._images = images
            self._images_version += 1

    async def _provision(self, profile_id: str, statuses: dict[str, ImageStatus]) -> None:
        await self._wait_for_a_host()
        for name in list(statuses):
            try:
                pulled = await self.ensure_image(name)
                entry: ImageStatus = {"name": name, "status": "available"}
                log.info("sandbox image %s %s", name, "pulled successfully" if pulled else "already available")
            except BaeError as exc:
                entry = {"name": name, "status": "error", "detail": exc.detail}
                log.warning("sandbox image %s: failed to ensure: %s", name, exc.detail)
            if self._status.get(profile_id) is not statuses:
                return  # replaced or forgotten meanwhile
            statuses[name] = entry
        if self._provisioning.get(profile_id) is asyncio.current_task():
            del self._provisioning[profile_id]

    async def _wait_for_a_host(self) -> None:
        """At start-up the hosts may still be booting: give them `host_wait` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._host_wait
        # A health poll is the event waited for: nothing else announces a host coming up.
        while not await self._healthy() and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(min(self._poll_interval, 0.5))

    def forget(self, profile_id: str) -> None:
        """The profile was deleted: drop its status and stop provisioning it."""
        self.provision(profile_id, [])

    def status_for(self, profile_id: str) -> list[ImageStatus]:
        """The profile's images in declared order."""
        return [entry.copy() for entry in self._status.get(profile_id, {}).values()]

    def status_view(self) -> dict[str, Any]:
        """GET /admin/v1/sandbox-status: profiles by id, their images by name."""
        return {
            "items": [
                {"profile_id": profile_id, "images": sorted(self.status_for(profile_id), key=lambda e: e["name"])}
                for profile_id in sorted(self._status)
            ]
        }

    async def close(self) -> None:
        if self._discovery is not None:
            await self._discovery.close()
        tasks = [task for task in (self._poller, *self._provisioning.values()) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._provisioning.clear()
        self._poller = None
        for host in [*self._hosts.values(), *self._retired]:
            await host.channel.close()


NO_HOSTS = "no sandbox hosts are configured (BAE_SANDBOX_GRPC_ADDRS is empty)"


class NoSandboxHosts:
    """The sandboxes of a deployment with no sandbox host: every start fails, nothing is provisioned."""

    async def start(self, session_id: str, image: str) -> SandboxHandle:
        raise Unavailable(NO_HOSTS)

    async def exec(self, handle: SandboxHandle, command: str) -> ExecResult:
        raise Unavailable(NO_HOSTS)

    async def stop(self, handle: SandboxHandle) -> None:
        raise Unavailable(NO_HOSTS)

    async def start_command(
        self, handle: SandboxHandle, command_id: str, command: str, *, stdin: bytes, timeout: float, output_limit: int
    ) -> None:
        raise Unavailable(NO_HOSTS)

    async def wait_command(self, host: str, command_id: str, wait: float) -> CommandStatus:
        raise Unavailable(NO_HOSTS)

    async def kill_command(self, host: str, command_id: str) -> None:
        raise Unavailable(NO_HOSTS)

    async def inventory(self) -> list[HostInventory]:
        return []

    def adopt(self, handle: SandboxHandle) -> None:
        pass

    def on_new_host(self, callback: Callable[[], None]) -> None:
        pass

    def provision(self, profile_id: str, images: Iterable[str]) -> None:
        pass

    def status_for(self, profile_id: str) -> list[ImageStatus]:
        return []

    def status_view(self) -> dict[str, Any]:
        return {"items": []}

    async def start_watching(self) -> None:
        pass

    async def close(self) -> None:
        pass
