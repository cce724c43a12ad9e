"""The per-session turn gate: one logical turn at a time, FIFO-fair (SERVER-SPEC §7.3).

The gate is free, held by a running turn, or held by a parked turn (one that
paused for client tools). The parked turn's owner takes it back at once,
ahead of the queue; anyone else queues until it is resumed, or until its
deadline passes and the first queued caller reclaims it. Queued callers
sleep until the gate changes (release, park, close, a waiter leaving) or,
for the first in line behind a parked turn, until its deadline: nobody polls.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

from opentelemetry.trace import SpanContext

from bae.common.jsontext import JsonObject
from bae.services.session.engine.errors import KeyRevoked, TurnInProgress


@dataclass
class ParkedTurn:
    owner: str
    deadline: float
    tool_uses: list[JsonObject]
    server_results: dict[str, JsonObject]
    # The token count of a crossed auto-compaction threshold, honoured when the turn completes (§12.2).
    pending_compaction: int | None = None
    # The paused `bae.turn` span's context: the resuming turn links to it (TELEMETRY §3.4).
    span_context: SpanContext | None = None

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


class TurnGate:
    def __init__(self) -> None:
        self.parked: ParkedTurn | None = None
        self._running = False
        self._closed = False
        self._queue: deque[object] = deque()
        self._changed = asyncio.Event()
        # Client keys revoked while the session was live: their calls are refused, their pauses expired.
        self._revoked: set[str] = set()

    @property
    def busy(self) -> bool:
        return self._running or self.parked is not None

    async def acquire(self, caller: str) -> Claim:
        """Take the gate for `sendMessage`, in arrival order."""
        return await self._acquire(caller, compact=False)

    async def acquire_for_compaction(self, caller: str | None = None) -> Claim:
        """Take the gate for `session.compact`: a live pause fails at once, never waited on."""
        return await self._acquire(caller, compact=True)

    async def _acquire(self, caller: str | None, *, compact: bool) -> Claim:
        if caller in self._revoked:
            raise KeyRevoked
        if compact and self.parked is not None and not self.parked.expired:
            raise TurnInProgress
        claim = self._take_parked(None if compact else caller, first=not self._queue)
        if claim is not None:
            return claim
        if not self.busy and not self._queue:
            self._running = True
            return Claim()
        return await self._queue_for(caller, compact=compact)

    def _take_parked(self, caller: str | None, *, first: bool) -> Claim | None:
        """The parked turn, if `caller` may take it: its owner always, anyone first in line once expired."""
        parked = self.parked
        if parked is None or not (parked.owner == caller or (parked.expired and first)):
            return None
        self.parked = None
        self._running = True
        return Claim(parked, reclaimed=parked.owner != caller)

    async def _queue_for(self, caller: str | None, *, compact: bool) -> Claim:
        ticket = object()
        self._queue.append(ticket)
        try:
            while True:
                if self._closed:
                    return Claim(waited=True)  # the caller re-reads the session and sees it closed
                if caller in self._revoked:
                    raise KeyRevoked
                first = self._queue[0] is ticket
                parked = self.parked
                if compact and parked is not None and not parked.expired:
                    raise TurnInProgress
                claim = self._take_parked(None if compact else caller, first=first)  # compaction is no owner
                if claim is not None:
                    claim.waited = True
                    return claim
                if first and not self.busy:
                    self._running = True
                    return Claim(waited=True)
                # Only the first in line wakes for a parked turn's deadline; the rest wait their turn.
                timeout = max(parked.deadline - time.monotonic(), 0.0) if first and parked else None
                changed = self._changed
                try:
                    await asyncio.wait_for(changed.wait(), timeout)
                except TimeoutError:
                    pass
        finally:
            self._queue.remove(ticket)
            self._notify()  # the next in line may now be first

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def park(self, turn: ParkedTurn) -> None:
        """End a running turn as Paused: the gate stays held by the parked turn."""
        self._running = False
        self.parked = turn
        if turn.owner in self._revoked:  # a turn of a revoked key ran on; nobody may answer its pause
            turn.deadline = time.monotonic()
        self._notify()

    def take_parked(self) -> ParkedTurn | None:
        """Take the parked turn to end it (session.cancelTurn), live or expired: the gate is then held
        as by a running turn until `release`. None when no turn is parked."""
        parked = self.parked
        if parked is not None:
            self.parked = None
            self._running = True
        return parked

    def restore(self, turn: ParkedTurn) -> None:
        """Hold a pause recovered from the log (the gate must be free)."""
        self.parked = turn
        self._notify()

    def revoke(self, key: str) -> None:
        """Client key `key` was revoked: its queued calls are refused now and later ones at once,
        and its parked turn, now or when a turn it runs pauses, expires for the next caller to reclaim."""
        self._revoked.add(key)
        if self.parked is not None and self.parked.owner == key:
            self.parked.deadline = time.monotonic()
        self._notify()

    def release(self) -> None:
        """End a running turn: the first queued caller goes next."""
        self._running = False
        self._notify()

    def close(self) -> None:
        """Session closed: drop the parked turn and let every waiter through to see it."""
        self._closed = True
        self._running = False
        self.parked = None
        self._notify()
