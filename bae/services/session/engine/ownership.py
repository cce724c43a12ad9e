"""This replica's hold on its sessions (several replicas share one PostgreSQL store).

Each open session is owned by one replica at a time: its gate, paused turn,
feed, MCP connections, sandbox handle and subagents live there only. The
owner is recorded in the store as a lease (store/leases.py) that stays valid
while the owner's heartbeat row does. A call for a session owned elsewhere
is refused with the owner's address (`NotOwner`), which the gateway follows.

The heartbeat loop also:
- fences: a replica that could not renew for a whole lease period, or whose
  lease another replica took, drops that live state (`on_lost`) before the
  new owner can act on it twice;
- takes over: open sessions whose owner's heartbeat expired are claimed and
  handed to `on_adopt` (history reloaded, a parked turn expired, sandboxes
  and subagents re-attached), so a dead replica costs seconds, not sessions.

A replica's id is its advertised address: one restarted on the same address
(as `bae run` does) holds its sessions again at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Awaitable, Callable

from bae.common.timefmt import now as timestamp
from bae.services.session.engine.tasks import TaskOwner
from bae.services.session.store import Store
from bae.services.session.store import leases
from bae.services.session.store.leases import Replica

log = logging.getLogger("bae.session.ownership")

# Takeovers per heartbeat: a dead replica's sessions spread over the survivors' next beats.
ADOPT_BATCH = 16


class NotOwner(Exception):
    """The session is owned by another live replica, at `address`."""

    def __init__(self, session_id: str, address: str) -> None:
        super().__init__(f"session {session_id} is owned by the replica at {address}")
        self.session_id = session_id
        self.address = address


def advertised_address(listen: str, advertise: str | None) -> str:
    """Where others reach this replica: BAE_SESSION_ADVERTISE_ADDR, else the listen address
    with a wildcard host replaced by this machine's address."""
    if advertise:
        return advertise
    host, _, port = listen.rpartition(":")
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        host = socket.gethostbyname(socket.gethostname())
    return f"{host}:{port}"


class Ownership:
    def __init__(
        self,
        *,
        store: Store,
        address: str,
        lease_seconds: float,
        on_lost: Callable[[set[str]], Awaitable[None]],
        on_adopt: Callable[[str], Awaitable[None]],
    ) -> None:
        self.store = store
        self.address = address
        self.lease_seconds = lease_seconds
        self.held: set[str] = set()  # sessions this process has claimed
        self._on_lost = on_lost
        self._on_adopt = on_adopt
        self._started_at = timestamp()
        self._renewed = 0.0  # monotonic time of the last successful heartbeat
        self._tasks = TaskOwner("ownership")

    @property
    def replica_id(self) -> str:
        """A replica is known by its advertised address (see the module's docstring)."""
        return self.address

    async def start(self) -> None:
        await self._beat()
        self._tasks.spawn(self._heartbeats(), name="ownership-heartbeat")

    async def stop(self) -> None:
        """Give every session up at once (the next call elsewhere takes them over)."""
        await self._tasks.cancel()
        try:
            await self.store.write(leases.retire, self.replica_id)
        except Exception:
            log.exception("releasing this replica's sessions failed; they move after the lease expires")
        self.held.clear()

    async def claim(self, session_id: str) -> None:
        """Own `session_id` (taking it over if its owner died) or raise NotOwner."""
        if session_id in self.held:
            return
        lease = await self.store.write(leases.claim, session_id, self.replica_id, self.address, time.time())
        if lease is None:
            return  # not open: nothing live to own; the caller reports the session's state
        if lease.replica_id != self.replica_id:
            raise NotOwner(session_id, lease.address)
        self.held.add(session_id)

    async def release(self, session_id: str) -> None:
        """A closed session's lease goes (best effort: a lease left on a closed session binds nothing)."""
        if session_id in self.held:
            self.held.discard(session_id)
            try:
                await self.store.write(leases.release, session_id, self.replica_id)
            except Exception as exc:
                log.warning("releasing the lease of closed session %s failed: %s", session_id, exc)

    async def holders(self, session_ids: list[str]) -> dict[str, str]:
        """session id -> the replica its lease names (live or not), for those that have a lease."""
        found: dict[str, str] = {}
        for start in range(0, len(session_ids), 500):  # a bounded statement, however many
            found.update(await self.store.read(leases.holders, session_ids[start:start + 500]))
        return found

    async def take_duty(self, name: str, hold: float) -> bool:
        """Hold duty `name` (work one replica at a time does for all) for `hold` seconds from now,
        or renew this replica's hold; False while another replica holds it."""
        return await self.store.write(leases.take_duty, name, self.replica_id, time.time(), hold)

    async def release_duty(self, name: str) -> None:
        await self.store.write(leases.release_duty, name, self.replica_id)

    async def owners(self, session_ids: list[str]) -> dict[str, str]:
        """session id -> address of the live replica that owns it, for those that have one."""
        return await self.store.read(leases.owners, session_ids, time.time()) if session_ids else {}

    async def replicas(self) -> list[Replica]:
        return await self.store.read(leases.live_replicas, time.time())

    async def least_loaded(self) -> Replica | None:
        """Where a new session goes: the live replica holding fewest sessions (this one on a tie)."""
        live = await self.replicas()
        if not live:
            return None
        return min(live, key=lambda replica: (replica.sessions, replica.id != self.replica_id, replica.id))

    async def _beat(self) -> None:
        await self.store.write(
            leases.heartbeat, self.replica_id, self.address, self._started_at, time.time() + self.lease_seconds
        )
        self._renewed = time.monotonic()

    async def _heartbeats(self) -> None:
        interval = max(self.lease_seconds / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            try:
                await self._beat()
            except Exception as exc:
                log.warning("session lease renewal failed: %s", exc)
                if self.held and time.monotonic() - self._renewed > self.lease_seconds:
                    lost, self.held = self.held, set()
                    log.error("could not renew for %.0fs: giving up %d sessions", self.lease_seconds, len(lost))
                    await self._on_lost(lost)
                continue
            try:
                await self._check_held()
                await self._adopt_orphans()
            except Exception:
                log.exception("session takeover check failed")

    async def _check_held(self) -> None:
        """Sessions another replica took (this one stalled past its lease) are no longer served here."""
        if not self.held:
            return
        # Only sessions claimed before the read began: a claim committed meanwhile may be missing from it.
        claimed = set(self.held)
        still = await self.store.read(leases.held_by, self.replica_id)
        lost = {session_id for session_id in claimed if session_id not in still and session_id in self.held}
        if lost:
            self.held -= lost
            log.warning("%d sessions were taken over by other replicas", len(lost))
            await self._on_lost(lost)

    async def _adopt_orphans(self) -> None:
        for session_id in await self.store.read(leases.orphaned, time.time(), ADOPT_BATCH):
            try:
                await self.claim(session_id)
            except NotOwner:
                continue  # another replica was faster
            log.info("took over session %s from a replica that stopped answering", session_id)
            await self._on_adopt(session_id)
