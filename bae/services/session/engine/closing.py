"""Closing a session (§5.5 step 2): its subagents, its sandbox, its subscribers, its live state."""

from __future__ import annotations

import asyncio
import logging

from bae.services.session.engine.ownership import Ownership
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.engine.sandboxes import SessionSandboxes
from bae.services.session.engine.subagent_calls import SessionSubagents
from bae.services.session.engine.tasks import TaskOwner

log = logging.getLogger("bae.session.closing")

# The share of BAE_RPC_TIMEOUT (the deadline of whoever asked for a close) that a close waits
# for its sandbox stop; the rest of the deadline is left for everything else the call does.
CLOSE_WAIT_SHARE = 1 / 3


class SessionCloser:
    def __init__(
        self,
        *,
        registry: SessionRegistry,
        sandboxes: SessionSandboxes,
        subagents: SessionSubagents,
        ownership: Ownership,
        rpc_timeout: float,
    ) -> None:
        self._registry = registry
        self._sandboxes = sandboxes
        self._subagents = subagents
        self._ownership = ownership
        self._stop_wait = rpc_timeout * CLOSE_WAIT_SHARE
        # Sandbox stops of closed sessions that outlasted their close's wait (see `close`).
        self._stopping = TaskOwner("closing")

    async def close(self, session_id: str, attribute_to: str | None) -> None:
        """Tear a closed session down: subagents, sandbox, subscribers, MCP, drivers, gate.

        The sandbox stop is the close's one call to a sandbox host, and a host can be frozen or slow
        without having been seen down yet: the stop's own deadline is as long as the caller's. So
        the stop runs as work of this closer, and the close waits for it only CLOSE_WAIT_SHARE of
        that deadline. Past that the close goes on without it; the stop still writes its `stopped`
        or `error` event when the host answers or its deadline passes, and that event is the last
        one the close writes, so the log keeps §14's order (close, cancelled*, stop, stopped|error).
        A container whose stop failed is stopped by the next reconciliation pass (reconcile.py).
        """
        async with self._registry.closing(session_id) as live:
            if live is not None:
                try:
                    await self._subagents.cancel_at_close(live, actor=attribute_to)
                except Exception:  # logged; never blocks a close
                    log.exception("cancelling the subagents of %s failed", session_id)
                if live.sandbox is not None:
                    stopping = self._stopping.spawn(
                        self._sandboxes.stop(live, attribute_to, reason="session_close"), name=f"stop:{session_id}"
                    )
                    # A stop that outlasts the wait is logged only: the subscribers' streams end now.
                    await asyncio.wait({stopping}, timeout=self._stop_wait)
        await self._ownership.release(session_id)

    async def drain(self, timeout: float) -> None:
        """Shutdown phase 2: the sandbox stops of sessions closed just before end within `timeout`."""
        if not await self._stopping.drain(timeout):
            log.warning("%d sandbox stop(s) of closed sessions still waiting after %.1fs; cancelling them",
                        len(self._stopping), timeout)

    async def stop(self) -> None:
        """Last shutdown phase: what `drain` left is cancelled (a reconciliation pass stops those containers)."""
        await self._stopping.cancel()
