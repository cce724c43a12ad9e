"""A session the server opens and drives itself, with no client attached: a schedule's tick
or an HTTP trigger's call (engine/triggers.py).

It goes through the same paths a client's calls do, so quotas (max_open_sessions_per_key at the
open), budgets (before each provider call of the turn), usage, MCP servers, the Auto sandbox and
subagents apply as they would: `open` is `POST /api/v1/sessions` (store/opening.py, with the
API's vetting), `drive` is `session.registerDriver` then `session.sendMessage` (the engine's
`run_turn`), `close` is `DELETE /api/v1/sessions/{id}`. Nothing answers client tools, so an opener
must not use a profile that allows them (the schedules and triggers APIs refuse one at create time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.session.engine.closing import SessionCloser
from services.session.engine.domain import Message, TurnOutcome, TurnRequest
from services.session.engine.engine import TurnEngine
from services.session.engine.feed import Watcher
from services.session.engine.mcp_sessions import SessionMcp
from services.session.engine.registry import SessionRegistry
from services.session.engine.sandboxes import SessionSandboxes
from services.session.engine.spans import SessionSpans
from services.session.store import opening
from services.session.store.opening import Opened, Refused, Then, Vetting
from services.session.store.records import KeyRecord
from services.session.store.store import Store


@dataclass(frozen=True)
class ServerDeclarations:
    """What a server-opened session declares (opening.Declarations): no client tools of any kind.
    `client_version` names the opener (e.g. "schedule sch_…"), so the session's summary says who."""

    client_version: str | None
    tools: tuple[()] = ()
    sandbox_tools: tuple[()] = ()
    subagent_tools: tuple[()] = ()
    compaction: dict[str, Any] | None = None

    def names(self) -> dict[str, Any]:
        return {"client_version": self.client_version, "tools": [], "sandbox_tools": [], "subagent_tools": []}


class Fire:
    def __init__(
        self,
        *,
        store: Store,
        registry: SessionRegistry,
        turns: TurnEngine,
        mcp: SessionMcp,
        sandboxes: SessionSandboxes,
        closer: SessionCloser,
        spans: SessionSpans,
        vetting: Vetting,
    ) -> None:
        self.store = store
        self.registry = registry
        self.turns = turns
        self.mcp = mcp
        self.sandboxes = sandboxes
        self.closer = closer
        self.spans = spans
        self.vetting = vetting  # the client API's checks of an open (profile, provider, quota)

    async def open(self, key: KeyRecord, opener: str, then: Then) -> Opened:
        """Open a session for `key` on this replica; `then(conn, session_id)` commits with it.
        A refusal raises its error (a BaeError: profile or provider unavailable, quota exceeded)."""
        outcome = await self.store.write(
            opening.open_session_then, key, ServerDeclarations(client_version=opener), self.vetting, then
        )
        if isinstance(outcome, Refused):
            raise outcome.error
        await self.opened(key, outcome)
        return outcome

    async def opened(self, key: KeyRecord, outcome: Opened) -> None:
        """What follows an open's commit on this replica, the session's owner from now on: its
        events published, its span and its MCP connections started (as `POST /api/v1/sessions`)."""
        self.registry.publish(outcome.session_id, outcome.views)
        self.spans.open(outcome.session_id, outcome.profile.id, key.id)
        await self.mcp.opened(outcome.session_id, outcome.profile)

    async def drive(self, session_id: str, key_id: str, text: str, watcher: Watcher | None = None) -> TurnOutcome:
        """Register `key_id` as a driver (once) and run one turn with `text` as the user message, its
        whole tool loop included; `watcher` follows it as a session.sendMessage stream does. Raises
        EngineError (e.g. SessionNotOpen) or NotOwner as the JSON-RPC methods would see them."""
        live = await self.registry.attach(session_id)
        async with live.lock:
            if key_id not in live.drivers:
                items: list[tuple[str, Any]] = [("session.driver.register", {})]
                profile = (await self.store.session_and_profile(session_id))[1]
                if profile is not None and profile.available_sandboxes:
                    items.append(("session.sandbox.available", {"images": self.sandboxes.available_images(profile)}))
                await self.registry.append(session_id, key_id, items)
                live.drivers.add(key_id)
        return await self.turns.run_turn(TurnRequest(session_id, key_id, Message("user", text)), watcher=watcher)

    async def close(self, session_id: str, key_id: str) -> None:
        """Close the session as its client would (`session.close`, reason `client_close`), attributed to `key_id`."""
        session, views = await self.store.write(opening.close_by_client, session_id)
        if views:
            self.registry.publish(session_id, views)
        if session is not None:
            await self.closer.close(session_id, attribute_to=key_id)
            self.spans.end(session_id)
