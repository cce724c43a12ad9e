"""A revoked client key, applied to the live sessions it touched, whichever replica owns them."""

from __future__ import annotations

import asyncio

from bae.services.session.engine.closing import SessionCloser
from bae.services.session.engine.ownership import Ownership
from bae.services.session.engine.ports import ClosedSession, EventStore, Peers, Revocation
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.engine.spans import SessionSpans
from bae.services.session.store.events import EventView


class Revocations:
    def __init__(
        self,
        *,
        registry: SessionRegistry,
        store: EventStore,
        ownership: Ownership,
        peers: Peers,
        closer: SessionCloser,
        spans: SessionSpans,
    ) -> None:
        self._registry = registry
        self._store = store
        self._ownership = ownership
        self._peers = peers
        self._closer = closer
        self._spans = spans

    async def revoke_key(self, key_id: str, closed: dict[str, list[EventView]], still_open: list[str]) -> None:
        """A client key was revoked, and the store says what that did: the sessions it alone held
        are closed (their close events written), on the others it loses its live access. Each
        session's owner applies that to its live state, whichever replica that is."""
        owners = await self._ownership.owners(
            [session_id for session_id in (*closed, *still_open) if session_id not in self._ownership.held]
        )
        elsewhere: dict[str, Revocation] = {}
        here: dict[str, list[EventView]] = {}
        for session_id, views in closed.items():
            if (address := owners.get(session_id)) is not None:
                revocation = elsewhere.setdefault(address, Revocation(key_id))
                revocation.closed.append(ClosedSession(session_id, [view["id"] for view in views]))
            else:
                here[session_id] = views
        for session_id in still_open:
            if (address := owners.get(session_id)) is not None:
                elsewhere.setdefault(address, Revocation(key_id)).session_ids.append(session_id)
        self._revoke(key_id, [session_id for session_id in still_open if session_id not in owners])
        # Side by side: each close may wait a while for its sandbox host (see SessionCloser), all within one deadline.
        await asyncio.gather(
            *(self._closed_by_revocation(key_id, session_id, views) for session_id, views in here.items()),
            *(self._peers.apply_revocation(address, r) for address, r in elsewhere.items()),
        )

    async def apply(self, revocation: Revocation) -> None:
        """Another replica revoked a key: apply it to the sessions this one owns."""
        await asyncio.gather(*(self._apply_closed(revocation.key_id, closed) for closed in revocation.closed))
        self._revoke(revocation.key_id, list(revocation.session_ids))

    async def _apply_closed(self, key_id: str, closed: ClosedSession) -> None:
        views: list[EventView] = []
        if closed.event_ids:
            first = await self._store.event_seq(closed.session_id, closed.event_ids[0])
            if first is not None:
                page = await self._store.list_events(closed.session_id, first - 1, len(closed.event_ids))
                views = [view for _, view in page if view["id"] in closed.event_ids]
        await self._closed_by_revocation(key_id, closed.session_id, views)

    async def _closed_by_revocation(self, key_id: str, session_id: str, views: list[EventView]) -> None:
        self._registry.publish(session_id, views)
        await self._closer.close(session_id, attribute_to=key_id)
        self._spans.end(session_id)  # a forced close ends the session's span as DELETE does

    def _revoke(self, key_id: str, session_ids: list[str]) -> None:
        """A revoked client key loses its live access: its streams end (a call of its still queued
        for the gate records nothing), it is no longer a driver, and a turn it left paused, or
        pauses later, becomes reclaimable at once (§7.3 abandonment)."""
        for session_id in session_ids:
            live = self._registry.get(session_id)
            if live is not None:
                live.drivers.discard(key_id)
                live.feed.end_streams_of(key_id)
                live.gate.revoke(key_id)
