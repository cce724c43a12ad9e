"""The session engine of one replica: its components, built from the ports it is given, and
its lifecycle in phases (start; drain; stop).

Each component has one job:
- `registry`: the live sessions and the one write path (append, publish);
- `ownership`: this replica's leases on its sessions, takeovers of a dead replica's;
- `mcp`: each live session's MCP connections;
- `subagents`, `sandboxes`: each live session's remote subagents and sandbox;
- `reconciler`: what the sandbox hosts run, compared with the store, at start and periodically;
- `turns`: turns and compactions (TurnEngine), through `TurnLoop` and `ToolDispatch`;
- `closer`: a session's close; `revocations`: a revoked key, across replicas.
"""

from __future__ import annotations

import asyncio
import logging

from bae.common.config import Config
from bae.services.session.engine.closing import SessionCloser
from bae.services.session.engine.engine import TurnEngine
from bae.services.session.engine.errors import SessionNotOpen
from bae.services.session.engine.loop import TurnLoop
from bae.services.session.engine.mcp_sessions import SessionMcp
from bae.services.session.engine.ownership import NotOwner, Ownership
from bae.services.session.engine.ports import McpConnector, Peers, ProviderSteps, Sandboxes
from bae.services.session.engine.reconcile import Reconciler
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.engine.revocation import Revocations
from bae.services.session.engine.sandboxes import SessionSandboxes
from bae.services.session.engine.spans import SessionSpans
from bae.services.session.engine.subagent_calls import SessionSubagents
from bae.services.session.engine.tools import ToolDispatch
from bae.services.session.store import Store

log = logging.getLogger("bae.session.engine")


class SessionEngine:
    def __init__(
        self,
        *,
        store: Store,
        steps: ProviderSteps,
        sandboxes: Sandboxes,
        mcp: McpConnector,
        peers: Peers,
        config: Config,
        spans: SessionSpans,
        address: str,
        lease_seconds: float,
        turn_timeout: float,
        rpc_timeout: float,
        max_subagents: int,
        subagent_timeout: float,
        sandbox_idle_timeout: float,
        reconcile_interval: float,
    ) -> None:
        self.spans = spans
        self._steps = steps
        self._peers = peers
        self.ownership = Ownership(
            store=store, address=address, lease_seconds=lease_seconds, on_lost=self._lost, on_adopt=self._adopt
        )
        self.registry = SessionRegistry(store=store, ownership=self.ownership)
        self.mcp = SessionMcp(registry=self.registry, connector=mcp)
        self.subagents = SessionSubagents(
            registry=self.registry, sandboxes=sandboxes, limit=max_subagents, default_timeout=subagent_timeout
        )
        self.sandboxes = SessionSandboxes(
            registry=self.registry, store=store, sandboxes=sandboxes, subagents=self.subagents,
            idle_timeout=sandbox_idle_timeout,
        )
        self.reconciler = Reconciler(
            registry=self.registry, ownership=self.ownership, store=store, hosts=sandboxes, sandboxes=self.sandboxes,
            interval=reconcile_interval, rpc_timeout=rpc_timeout,
        )
        tools = ToolDispatch(sandboxes=self.sandboxes, subagents=self.subagents)
        loop = TurnLoop(store=store, mcp=self.mcp, tools=tools, turn_timeout=turn_timeout)
        self.turns = TurnEngine(registry=self.registry, store=store, steps=steps, loop=loop, config=config, spans=spans)
        self.closer = SessionCloser(
            registry=self.registry, sandboxes=self.sandboxes, subagents=self.subagents, ownership=self.ownership,
            rpc_timeout=rpc_timeout,
        )
        self.revocations = Revocations(
            registry=self.registry, store=store, ownership=self.ownership, peers=peers, closer=self.closer,
            spans=spans,
        )

    async def start(self) -> None:
        """Join the replicas, then take back what the sandbox hosts still run for open sessions."""
        await self.ownership.start()
        await self.sandboxes.prepare()
        await self.reconciler.start()

    async def drain(self, timeout: float) -> None:
        """Shutdown phases 1 and 2: take no new turn; running turns and the sandbox stops of
        sessions closed just before end within `timeout`."""
        for live in self.registry.all():
            live.feed.let_go()  # held session.subscribe calls end, or they would hold up the drain
        await asyncio.gather(self.turns.drain(timeout), self.closer.drain(timeout))

    async def stop(self) -> None:
        """Last shutdown phase: drop every session's live state. Sandboxes and subagents keep
        running on their hosts; the next start takes them back (`Reconciler`).
        The ports it was given are closed last."""
        self.spans.end_all()
        await self.closer.stop()
        await self.reconciler.stop()
        await self.registry.stop()
        await self.sandboxes.close()
        await self.ownership.stop()
        await self._peers.close()
        await self._steps.close()

    async def _lost(self, session_ids: set[str]) -> None:
        """Sessions another replica took: their live state goes, their work runs on there."""
        await self.registry.drop(session_ids)

    async def _adopt(self, session_id: str) -> None:
        """A session taken over from a replica that died: its log is read again (a turn it left
        parked comes back expired, to be abandoned) and its sandbox and subagents re-attached."""
        try:
            live = await self.registry.attach(session_id)
        except (SessionNotOpen, NotOwner):
            return
        await self.registry.load_history(live)
        await self.reconciler.run(session_id)
