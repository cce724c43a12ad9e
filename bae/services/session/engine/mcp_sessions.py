"""Each live session's MCP connections (SERVER-SPEC §9.2): connected in the background when
the session is created, again on first use after a restart of this service, closed with the
session's live state."""

from __future__ import annotations

import asyncio

from bae.services.session.engine.live import LiveSession
from bae.services.session.engine.ports import McpConnector, McpSession
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.store.records import ProfileRecord


class SessionMcp:
    def __init__(self, *, registry: SessionRegistry, connector: McpConnector) -> None:
        self._registry = registry
        self._connector = connector

    async def opened(self, session_id: str, profile: ProfileRecord) -> None:
        """A session was created: its live state, and its MCP servers connecting in the background."""
        self._start(await self._registry.opened(session_id), profile)

    async def ensure(self, live: LiveSession, profile: ProfileRecord) -> McpSession | None:
        """The session's MCP connections; (re)connects after a restart of this service."""
        task = live.mcp_task or self._start(live, profile)
        return await asyncio.shield(task)

    def _start(self, live: LiveSession, profile: ProfileRecord) -> asyncio.Task[McpSession | None]:
        live.mcp_task = live.tasks.spawn(self._connect(live, profile), name=f"mcp-connect:{live.session_id}")
        return live.mcp_task

    async def _connect(self, live: LiveSession, profile: ProfileRecord) -> McpSession | None:
        if not profile.mcp_servers:
            return None
        connections = await self._connector.connect(live.session_id, profile)
        if self._registry.get(live.session_id) is not live:  # closed while connecting
            await connections.close()
            return None
        live.mcp = connections
        return connections
