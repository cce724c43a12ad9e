"""The per-session turn gate: one logical turn at a time, FIFO-fair.

A turn that pauses for client tools keeps the gate ("parked"). Its owner
takes it back at once; anyone else queues behind it until it is resumed or
its deadline passes, at which point the first queued caller reclaims it
(SERVER-SPEC §7.3 and O-4: no waiter sleeps forever behind an absent owner).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class ParkedTurn:
    owner: str
    deadline: float
    tool_uses: list[dict]
    server_results: dict[str, dict]

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.deadline


@dataclass
class Claim:
    """What a caller got when it took the gate."""

    parked: ParkedTurn | None = None
    # True when the parked turn was taken from another owner after its deadline.
    reclaimed: bool = False
    # True when the caller queued first: what it read before queuing may be stale.
    waited: bool = False


class TurnInProgress(Exception):
    """A live paused turn blocks the gate (session.compact never waits on one)."""


@dataclass
class TurnGate:
    _busy: bool = False
    _waiters: deque[asyncio.Future] = field(default_factory=deque)
    parked: ParkedTurn | None = None

    async def acquire(self, caller: str) -> Claim:
        """Take the gate for `sendMessage`; waits in arrival order."""
        parked = self.parked
        if parked is not None and (parked.owner == caller or parked.expired):
            self.parked = None
            return Claim(parked, reclaimed=parked.owner != caller)
        return await self._wait(caller, compact=False)

    async def acquire_for_compaction(self) -> Claim:
        """Take the gate for `session.compact`: fail fast on a live pause, never wait on one."""
        parked = self.parked
        if parked is not None:
            if not parked.expired:
                raise TurnInProgress
            self.parked = None
            return Claim(parked, reclaimed=True)
        return await self._wait(None, compact=True)

    async def _wait(self, caller: str | None, *, compact: bool) -> Claim:
        if not self._busy and not self._waiters:
            self._busy = True
            return Claim()
        future: asyncio.Future[Claim] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            while True:
                poll = self._poll_interval(compact)
                try:
                    claim = await asyncio.wait_for(asyncio.shield(future), poll)
                    claim.waited = True
                    return claim
                except TimeoutError:
                    pass
                parked = self.parked
                if parked is None:
                    continue
                if compact and not parked.expired:
                    raise TurnInProgress
                if parked.owner == caller or (parked.expired and self._waiters[0] is future):
                    self._waiters.remove(future)
                    self.parked = None
                    return Claim(parked, reclaimed=parked.owner != caller, waited=True)
        except BaseException:
            if future in self._waiters:
                self._waiters.remove(future)
            if future.done() and not future.cancelled():
                self.release()  # the gate was handed to us as we gave up: pass it on
            else:
                future.cancel()
            raise

    def _poll_interval(self, compact: bool) -> float | None:
        parked = self.parked
        if parked is None:
            # A running turn may still pause; compaction re-checks every 100 ms.
            return 0.1 if compact else 0.5
        if compact:
            return 0.1
        return max(parked.deadline - time.monotonic(), 0.0) + 0.001

    def park(self, turn: ParkedTurn) -> None:
        """End a running turn as Paused: the gate stays held by the parked turn."""
        self.parked = turn

    def release(self) -> None:
        """End a running turn: hand the gate to the next waiter, in arrival order."""
        while self._waiters:
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(Claim())
                return
        self._busy = False

    def clear(self) -> None:
        """Session closed: drop the parked turn and let every waiter through to see it."""
        self.parked = None
        waiters, self._waiters = self._waiters, deque()
        for future in waiters:
            if not future.done():
                future.set_result(Claim())
        self._busy = bool(waiters)
