"""The live sessions of this replica: which it serves, their state, and the one write path.

A session is live here while this replica owns it (engine/ownership.py) and it is open.
Every event live code writes goes through `append` (or a `Turn`, which publishes the same
way): persisted first, then published to the session's watchers and its history cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from bae.services.session.engine.budgets import KeySpends
from bae.services.session.engine.domain import SessionState
from bae.services.session.engine.errors import SessionNotOpen
from bae.services.session.engine.gate import ParkedTurn
from bae.services.session.engine.history import History
from bae.services.session.engine.live import CompactionBackoff, LiveSession, paused_tool_uses
from bae.services.session.engine.ownership import Ownership
from bae.services.session.engine.ports import EventStore
from bae.services.session.store.events import EventView
from bae.services.session.store.live_state import LiveState

log = logging.getLogger("bae.session.registry")


def rebuild(live: LiveSession, state: LiveState) -> None:
    """What the log says a replica serving the session holds (a takeover, a restart): the drivers
    registered before keep driving without registering again, and a failed auto compaction keeps
    its backoff. Added to what callers did meanwhile (a registration that raced the read)."""
    live.drivers.update(state.drivers)
    failed = state.failed_compaction
    if failed is not None and live.compaction_backoff is None:
        live.compaction_backoff = CompactionBackoff(failed.token_count, failed.turns_since)


class SessionRegistry:
    def __init__(self, *, store: EventStore, ownership: Ownership) -> None:
        self._store = store
        self._ownership = ownership
        self._sessions: dict[str, LiveSession] = {}
        # Sessions whose live state `attach` is still rebuilding from the log: visible in `_sessions`
        # (so a close meanwhile drops it), but other callers wait for the rebuild before using it,
        # or a takeover would serve a call before the session's drivers are known again.
        self._rebuilding: dict[str, asyncio.Future[bool]] = {}
        # Sessions being torn down: no longer live for new calls, but their subscribers still
        # get the close's own events (§14 item 13: cancelled*, stop, stopped; then streams end).
        self._closing: dict[str, LiveSession] = {}
        # The client keys' usage of today, followed as this replica records it (budgets.py).
        self.key_spends = KeySpends()

    def get(self, session_id: str) -> LiveSession | None:
        """The session's live state, if this replica holds it."""
        return self._sessions.get(session_id)

    def all(self) -> tuple[LiveSession, ...]:
        return tuple(self._sessions.values())

    def existing(self, session_id: str) -> LiveSession:
        """The live state of a session this replica serves; SessionNotOpen once it closed."""
        live = self._sessions.get(session_id)
        if live is None:
            raise SessionNotOpen.of(SessionState.CLOSED)
        return live

    async def attach(self, session_id: str) -> LiveSession:
        """The session's live state, created on first use, and only while the session is open
        and this replica owns it (NotOwner names the owner otherwise).

        A close can land between a caller's state check and this call. Creating
        the state first and re-reading the session after closes that window:
        either the close (which commits, then drops the live state) removes it,
        or this re-read sees the close and removes it.
        """
        live = self._sessions.get(session_id)
        if live is not None:
            return await self._rebuilt(session_id, live)
        await self._ownership.claim(session_id)
        live = self._sessions.get(session_id)  # attached by another caller meanwhile
        if live is not None:
            return await self._rebuilt(session_id, live)
        live = self._sessions[session_id] = LiveSession(session_id)
        rebuilt = self._rebuilding[session_id] = asyncio.get_running_loop().create_future()
        try:
            state = await self._store.live_state(session_id)
            session = state.session
            if session is None or session.state != SessionState.OPEN:
                raise SessionNotOpen.of(session.state if session else None)
            rebuild(live, state)
        except BaseException as exc:
            # Not live after all (closed, the read failed, or this caller was cancelled): nobody may use
            # a state that was never rebuilt. Waiters get the same error, or try again after a cancel.
            if self._sessions.get(session_id) is live:
                del self._sessions[session_id]
            if isinstance(exc, Exception):
                rebuilt.set_exception(exc)
                rebuilt.exception()  # retrieved here: a rebuild nobody waited for logs nothing
            else:
                rebuilt.set_result(False)
            raise
        else:
            rebuilt.set_result(True)
        finally:
            del self._rebuilding[session_id]
        return live

    async def _rebuilt(self, session_id: str, live: LiveSession) -> LiveSession:
        """`live` once the `attach` rebuilding it from the log is done; what that attach raised otherwise."""
        rebuilding = self._rebuilding.get(session_id)
        if rebuilding is not None and not await asyncio.shield(rebuilding):
            return await self.attach(session_id)  # the rebuilding caller was cancelled: attach anew
        return live

    async def opened(self, session_id: str) -> LiveSession:
        """A session just created: its live state, with no re-read as in `attach` (nobody holds
        the session's key yet, so nothing can have closed it)."""
        await self._ownership.claim(session_id)
        return self._sessions.setdefault(session_id, LiveSession(session_id))

    def drivers(self, session_id: str) -> list[str]:
        live = self._sessions.get(session_id)
        return sorted(live.drivers) if live else []

    async def load_history(self, live: LiveSession) -> History:
        """The session's effective history, read from the log once per replica.

        A log that ends in a paused assistant turn whose pause this replica does not
        hold (it was parked by a process that has since died) gets that pause back,
        already expired: its owner may still answer it, anyone else reclaims it with
        synthetic results, so the next provider call never sees an unanswered tool_use.
        """
        if live.history is None:
            events = await self._store.message_events(live.session_id)
            live.history = History.from_events(events)
            if events and not live.gate.busy:
                tool_uses = paused_tool_uses(events[-1])
                if tool_uses:
                    results = await self._store.server_tool_results(
                        live.session_id, [str(block.get("id")) for block in tool_uses]
                    )
                    live.gate.restore(
                        ParkedTurn(
                            owner=events[-1]["client_key_id"] or "",
                            deadline=time.monotonic(),
                            tool_uses=tool_uses,
                            server_results=results,
                        )
                    )
        return live.history

    async def append(
        self,
        session_id: str,
        actor: str | None,
        items: list[tuple[str, Any]],
        new_state: str | None = None,
    ) -> list[EventView]:
        """Persist events (one transaction), then publish them: the one write path of live code."""
        views = await self._store.append_events(
            session_id, [(actor, kind, payload) for kind, payload in items], new_state=new_state
        )
        self.publish(session_id, views)
        return views

    def publish(self, session_id: str, events: list[EventView]) -> None:
        """Fan committed events out to the session's watchers and its history cache."""
        live = self._sessions.get(session_id) or self._closing.get(session_id)
        if live is None:
            return
        if live.history is not None:
            live.history.observe(events)
        live.feed.publish(events)

    @contextlib.asynccontextmanager
    async def closing(self, session_id: str) -> AsyncIterator[LiveSession | None]:
        """A session closes: it is no longer live for new calls, its subscribers still get what
        is written inside this block, then its live state is torn down. None when not live here."""
        live = self._sessions.pop(session_id, None)
        if live is None:
            yield None
            return
        self._closing[session_id] = live
        try:
            yield live
        finally:
            del self._closing[session_id]  # the subscribers' streams end now
            await self._teardown(live)

    async def drop(self, session_ids: Iterable[str]) -> None:
        """Sessions this replica no longer owns: forget their live state, leaving their work running
        (the new owner takes the sandboxes and subagents back)."""
        for session_id in session_ids:
            live = self._sessions.pop(session_id, None)
            if live is not None:
                await self._teardown(live)

    async def stop(self) -> None:
        """Shutdown: drop every session's live state (their sandboxes and subagents keep running)."""
        while self._sessions:
            _, live = self._sessions.popitem()
            await self._teardown(live)

    @staticmethod
    async def _teardown(live: LiveSession) -> None:
        """Drop a session's live state. Its sandbox and subagents are left as they are: a close
        ends them first, while a shutdown or a lost lease leaves them to whoever serves it next."""
        live.feed.close()
        live.gate.close()
        live.drivers.clear()
        await live.tasks.cancel()
        if live.mcp is not None:
            try:
                await live.mcp.close()
            except Exception:
                log.exception("closing MCP connections of %s failed", live.session_id)
