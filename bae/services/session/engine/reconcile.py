"""Reconciliation: what the sandbox hosts run, compared with the store and this replica's live
sessions. A pass runs at start-up, then every BAE_RECONCILE_INTERVAL seconds, at once when a
host is first seen up, and for one session when this replica takes it over.

A pass asks every reachable host for its sandboxes (containers) and background commands
(subagents), then:

- Sessions this replica owns, or that no replica holds a lease on, are this replica's: a
  sandbox such a session does not hold is taken back (a restart or a graceful stop left it
  running); one it does not use (a second one, or one that no longer runs) is stopped.
- Each sandbox this replica's sessions hold and a host that answered no longer runs (it
  vanished: removed or died behind the server's back) goes through the session's stop, which
  logs `session.sandbox.stop` (`"reason": "vanished"`) then `session.sandbox.stopped` (a stop
  of a container that is not there succeeds, §10.1) or `session.sandbox.error` (phase `stop`).
  The handle is gone afterwards, so a later pass finds nothing to log again.
- A running command in such a sandbox that none of the session's running subagents is (one
  cancelled while its host was down) is killed.
- Sessions another replica holds a lease on are left to it: the owner's own passes check
  them, and a dead owner's sessions are taken over (with a pass for each) by the heartbeat.
- Sandboxes of closed, failed or unknown sessions, and running commands whose sandbox the
  host no longer runs, are stopped by one replica at a time: whichever holds the store's
  "reconcile" duty lease (store/leases.py), taken before the hosts are asked. Nothing is
  written to a closed session's log.

Every step is safe to repeat, and a step that fails is logged and tried again by the next pass.
"""

from __future__ import annotations

import asyncio
import logging

from bae.common.errors import BaeError
from bae.services.session.engine.domain import SessionState
from bae.services.session.engine.errors import SessionNotOpen
from bae.services.session.engine.ownership import NotOwner, Ownership
from bae.services.session.engine.ports import EventStore, HostCommand, HostInventory, HostSandbox, SandboxHandle, Sandboxes
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.engine.sandboxes import SessionSandboxes
from bae.services.session.engine.subagents import SubagentStatus
from bae.services.session.engine.tasks import TaskOwner

log = logging.getLogger("bae.session.reconcile")

# The duty lease of the stops no session owns (store/leases.py).
DUTY = "reconcile"
# How long one hold of the duty lasts, in host-call deadlines (BAE_RPC_TIMEOUT): it is renewed
# before each call, so a holder that died frees it after this long.
DUTY_HOLD_CALLS = 3


class Reconciler:
    def __init__(
        self,
        *,
        registry: SessionRegistry,
        ownership: Ownership,
        store: EventStore,
        hosts: Sandboxes,
        sandboxes: SessionSandboxes,
        interval: float,
        rpc_timeout: float,
    ) -> None:
        self._registry = registry
        self._ownership = ownership
        self._store = store
        self._hosts = hosts
        self._sandboxes = sandboxes
        self._interval = interval  # BAE_RECONCILE_INTERVAL
        self._duty_hold = DUTY_HOLD_CALLS * rpc_timeout
        self._passes = asyncio.Lock()  # one pass at a time in this replica
        self._woken = asyncio.Event()  # a host came up: pass now
        self._tasks = TaskOwner("reconcile")

    async def start(self) -> None:
        """The start-up pass, then one every interval and one whenever a host is first seen up."""
        await self.run()
        self._hosts.on_new_host(self._woken.set)
        self._tasks.spawn(self._every_interval(), name="periodic")

    async def stop(self) -> None:
        """Shutdown: no pass any more (one under way is cancelled between two calls)."""
        await self._tasks.cancel()

    async def _every_interval(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._woken.wait(), self._interval)
            except TimeoutError:
                pass
            self._woken.clear()
            try:
                await self._sandboxes.follow_profiles()
                await self.run()
            except Exception:  # a store or host failure: the next pass tries again
                log.exception("reconciliation pass failed")

    async def run(self, only_session: str | None = None) -> None:
        """One pass; `only_session`: take back the sandbox of that session only (a takeover, which
        does not wait for a whole pass under way: what it does is safe beside one)."""
        if only_session is not None:
            await self._pass(only_session, duty=False)
            return
        async with self._passes:
            # Taken before the hosts are asked: what they answer then already shows the stops of the
            # replica that held the duty before, so no stray is stopped twice.
            duty = await self._ownership.take_duty(DUTY, self._duty_hold)
            try:
                await self._pass(None, duty=duty)
            finally:
                if duty:
                    await self._ownership.release_duty(DUTY)

    async def _pass(self, only_session: str | None, *, duty: bool) -> None:
        # The handles held before the hosts are asked: only those can be missing from the answers.
        held = {live.session_id: handle for live in self._registry.all() if (handle := live.sandbox) is not None}
        changes = {live.session_id: live.sandbox_changes for live in self._registry.all()}
        inventories = await self._hosts.inventory()
        found = [
            (inventory, info)
            for inventory in inventories
            for info in inventory.sandboxes
            if only_session is None or info.session_id == only_session
        ]
        session_ids = sorted({info.session_id for _, info in found})
        states = await self._store.session_states(session_ids)
        open_ids = [sid for sid in session_ids if states.get(sid) == SessionState.OPEN]
        holders = await self._ownership.holders([sid for sid in open_ids if self._registry.get(sid) is None])
        strays: list[tuple[str, HostSandbox, str]] = []
        for inventory, info in found:
            state = states.get(info.session_id)
            if state != SessionState.OPEN:
                strays.append((inventory.host, info, state or "unknown"))
            elif holders.get(info.session_id, self._ownership.replica_id) == self._ownership.replica_id:
                await self._own(inventory, info, changes.get(info.session_id, 0))
        if only_session is None:
            for session_id, handle in held.items():
                await self._check(session_id, handle, inventories)
            if duty:
                await self._sweep(strays, inventories)
            elif strays:
                log.debug("leaving %d sandboxes of sessions that are not open to the replica holding the duty",
                          len(strays))

    async def _own(self, inventory: HostInventory, info: HostSandbox, changes: int) -> None:
        """A sandbox of an open session this replica owns or may take: taken back, or stopped if
        unused. `changes`: the session's sandbox starts and stops finished before the hosts were asked."""
        try:
            live = await self._registry.attach(info.session_id)
        except (SessionNotOpen, NotOwner):
            return  # closed meanwhile (the next pass stops it), or another replica took it
        if self._sandboxes.busy(info.session_id) or live.sandbox_changes != changes:
            return  # a start or stop is under way or ended since: what the host listed is stale
        handle = SandboxHandle(host=inventory.host, sandbox_id=info.sandbox_id, image=info.image)
        if live.sandbox is not None and live.sandbox.sandbox_id == info.sandbox_id:
            return  # the session's own (if it stopped running, `_check` sees to it)
        if live.sandbox is None and info.state == "running":
            commands = [command.command_id for command in inventory.commands if command.sandbox_id == info.sandbox_id]
            await self._sandboxes.take_back(live, handle, commands)
            return
        log.info("stopping sandbox %s (%s) of session %s, which does not use it",
                 info.sandbox_id, info.state, info.session_id)
        await self._stop(handle)

    async def _check(self, session_id: str, handle: SandboxHandle, inventories: list[HostInventory]) -> None:
        """A sandbox this replica's session held before the hosts were asked."""
        inventory = next((inventory for inventory in inventories if inventory.host == handle.host), None)
        if inventory is None:
            return  # its host did not answer: nothing is known
        live = self._registry.get(session_id)
        if live is None or live.sandbox is not handle:
            return  # stopped, replaced or closed meanwhile
        info = next((info for info in inventory.sandboxes if info.sandbox_id == handle.sandbox_id), None)
        if info is None or info.state != "running":
            log.warning("sandbox %s of session %s vanished: host %s %s; stopping it", handle.sandbox_id, session_id,
                        handle.host, "no longer runs it" if info is None else f"reports it {info.state}")
            await self._sandboxes.stop(live, None, reason="vanished")
            return
        for command in inventory.commands:
            if command.running and command.sandbox_id == handle.sandbox_id:
                entry = live.subagents.entries.get(command.command_id)
                if entry is None or entry.status != SubagentStatus.RUNNING:
                    log.info("killing command %s of session %s, which runs no subagent of it",
                             command.command_id, session_id)
                    await self._kill(handle.host, command)

    async def _sweep(self, strays: list[tuple[str, HostSandbox, str]], inventories: list[HostInventory]) -> None:
        """Holding the duty: the sandboxes of sessions that are not open, and the running commands
        whose sandbox is gone. The duty is renewed before each call; a hold that lapsed meanwhile
        (another replica has taken it) ends the sweep."""
        listed = {(inventory.host, info.sandbox_id) for inventory in inventories for info in inventory.sandboxes}
        orphans = [
            (inventory.host, command)
            for inventory in inventories
            for command in inventory.commands
            if command.running and (inventory.host, command.sandbox_id) not in listed
        ]
        for host, info, state in strays:
            if not await self._ownership.take_duty(DUTY, self._duty_hold):
                return
            log.info("stopping sandbox %s of %s session %s", info.sandbox_id, state, info.session_id)
            await self._stop(SandboxHandle(host=host, sandbox_id=info.sandbox_id, image=info.image))
        for host, command in orphans:
            if not await self._ownership.take_duty(DUTY, self._duty_hold):
                return
            log.info("killing command %s on host %s: its sandbox %s is gone", command.command_id, host,
                     command.sandbox_id)
            await self._kill(host, command)

    async def _stop(self, handle: SandboxHandle) -> None:
        try:
            await self._hosts.stop(handle)
        except BaeError as exc:
            log.warning("stopping sandbox %s failed: %s", handle.sandbox_id, exc.detail)

    async def _kill(self, host: str, command: HostCommand) -> None:
        try:
            await self._hosts.kill_command(host, command.command_id)
        except BaeError as exc:
            log.warning("killing command %s failed: %s", command.command_id, exc.detail)
