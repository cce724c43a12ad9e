"""Per-session live state owned by this session-service replica.

Everything here is memory only (SERVER-SPEC §0.1): the driver registry, the
turn gate and parked turn, the live feed, the cached provider history, MCP
connections, the remote sandbox handle and the auto-compaction backoff. With
several replicas, each open session is owned by one of them, which alone
holds this object (engine/ownership.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from bae.common.config import Config
from bae.common.internal import InternalPlane
from bae.common.protos import session_pb2
from bae.common.settings import Settings
from services.session.engine.domain import SessionState
from services.session.engine.errors import SessionNotOpen
from services.session.engine.feed import SessionFeed
from services.session.engine.gate import ParkedTurn, TurnGate
from services.session.engine.history import History
from services.session.engine.ownership import NotOwner, Ownership, advertised_address
from services.session.engine import subagent_calls
from services.session.engine.sandbox_calls import stop_sandbox
from services.session.engine.spans import session_spans
from services.session.engine.subagents import Subagent, SubagentTracker
from services.session.engine.tasks import TaskOwner
from services.session.remote.mcp import McpSessionConnections
from services.session.remote.peers import Peers
from services.session.remote.sandbox_discovery import SandboxDiscovery, needs_discovery
from services.session.remote.sandbox_idle import Handle as IdleHandle
from services.session.remote.sandbox_idle import IdleWatch
from services.session.engine.ports import SandboxHandle
from services.session.remote.sandbox_pool import SandboxError, SandboxPool
from services.session.store import Store
from services.session.store.events import EventView
from services.session.store.records import ProfileRecord

log = logging.getLogger("bae.session.runtime")

# The share of BAE_RPC_TIMEOUT (the deadline of whoever asked for a close) that a close waits
# for its sandbox stop; the rest of the deadline is left for everything else the call does.
CLOSE_WAIT_SHARE = 1 / 3


@dataclass
class CompactionBackoff:
    """After a failed auto compaction (§12.2): its token count, and turns completed since."""

    failed_token_count: int
    turns_since: int = 0


@dataclass(eq=False)
class LiveSession:
    session_id: str
    drivers: set[str] = field(default_factory=set)
    feed: SessionFeed = field(default_factory=SessionFeed)
    gate: TurnGate = field(default_factory=TurnGate)
    history: History | None = None  # loaded from the log on first use
    mcp: McpSessionConnections | None = None
    mcp_task: asyncio.Task[McpSessionConnections | None] | None = None
    sandbox: SandboxHandle | None = None  # the remote sandbox, one per session
    compaction_backoff: CompactionBackoff | None = None
    subagents: SubagentTracker = field(default_factory=SubagentTracker)
    # Background work of this session (MCP connects); cancelled when it closes.
    tasks: TaskOwner = field(default_factory=lambda: TaskOwner("session"))
    # Serializes registrations (a key's first one logs exactly once) and sandbox starts.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def loaded_history(self) -> History:
        if self.history is None:
            raise RuntimeError(f"history of {self.session_id} used before it was loaded")
        return self.history


def paused_tool_uses(event: EventView) -> list[dict]:
    """The `tool_use` blocks of a paused turn's assistant message (tagged with `dispatch`), else []."""
    payload = event["payload"]
    if event["event_type"] != "server.message.send" or payload.get("role", "assistant") != "assistant":
        return []
    content = payload.get("content")
    blocks = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"] if isinstance(content, list) else []
    return blocks if any("dispatch" in block for block in blocks) else []


class SessionRuntime:
    def __init__(self, *, store: Store, settings: Settings, config: Config) -> None:
        self.store = store
        self.settings = settings
        self.config = config
        self.sessions: dict[str, LiveSession] = {}
        # Sessions being torn down: no longer live for new calls, but their subscribers still
        # get the close's own events (§14 item 13: cancelled*, stop, stopped; then streams end).
        self._closing_feeds: dict[str, LiveSession] = {}
        self.ownership = Ownership(
            store=store,
            address=advertised_address(settings.session_grpc_addr, settings.session_advertise_addr),
            lease_seconds=settings.session_lease_seconds,
            on_lost=self._drop,
            on_adopt=self._adopt,
        )
        self.peers = Peers(InternalPlane.of(settings), settings.rpc_timeout)
        # Sandbox stops of closed sessions that outlasted their close's wait (see `close`).
        self.closing = TaskOwner("closing")
        # Reconciliations of sandbox hosts first seen up after start-up.
        self._reconciling = TaskOwner("reconcile")
        self.sandboxes: SandboxPool | None = (
            SandboxPool(
                settings.sandbox_grpc_addrs, settings.rpc_timeout, InternalPlane.of(settings),
                idle=IdleWatch(settings.sandbox_idle_timeout, self._stop_idle_sandbox),
            )
            if settings.sandbox_grpc_addrs
            else None
        )
        # Host names (e.g. a scaled docker-compose service) are re-resolved to all their addresses.
        self.sandbox_discovery: SandboxDiscovery | None = (
            SandboxDiscovery(self.sandboxes, settings.sandbox_grpc_addrs)
            if self.sandboxes is not None and needs_discovery(settings.sandbox_grpc_addrs)
            else None
        )

    def existing(self, session_id: str) -> LiveSession:
        """The live state of a session this replica serves; SessionNotOpen once it closed."""
        live = self.sessions.get(session_id)
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
        live = self.sessions.get(session_id)
        if live is not None:
            return live
        await self.ownership.claim(session_id)
        live = self.sessions.get(session_id)  # attached by another caller meanwhile
        if live is not None:
            return live
        live = self.sessions[session_id] = LiveSession(session_id)
        session = await self.store.get_session(session_id)
        if session is None or session.state != SessionState.OPEN:
            if self.sessions.get(session_id) is live:
                del self.sessions[session_id]
            raise SessionNotOpen.of(session.state if session else None)
        return live

    def drivers(self, session_id: str) -> list[str]:
        live = self.sessions.get(session_id)
        return sorted(live.drivers) if live else []

    async def load_history(self, live: LiveSession) -> History:
        """The session's effective history, read from the log once per replica.

        A log that ends in a paused assistant turn whose pause this replica does not
        hold (it was parked by a process that has since died) gets that pause back,
        already expired: its owner may still answer it, anyone else reclaims it with
        synthetic results, so the next provider call never sees an unanswered tool_use.
        """
        if live.history is None:
            events = await self.store.message_events(live.session_id)
            live.history = History.from_events(events)
            if events and not live.gate.busy:
                tool_uses = paused_tool_uses(events[-1])
                if tool_uses:
                    results = await self.store.server_tool_results(
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
        views = await self.store.append_events(
            session_id, [(actor, kind, payload) for kind, payload in items], new_state=new_state
        )
        await self.publish(session_id, views)
        return views

    async def publish(self, session_id: str, events: list[EventView]) -> None:
        """Fan committed events out to the session's watchers and its history cache."""
        live = self.sessions.get(session_id) or self._closing_feeds.get(session_id)
        if live is None:
            return
        if live.history is not None:
            live.history.observe(events)
        live.feed.publish(events)

    async def on_open(self, session_id: str, profile: ProfileRecord) -> None:
        """A session was created: connect its MCP servers in the background.

        No re-read as in `attach`: nobody holds the session's key yet, so nothing can have closed it.
        """
        await self.ownership.claim(session_id)
        live = self.sessions.setdefault(session_id, LiveSession(session_id))
        self._start_mcp(live, profile)

    async def ensure_mcp(self, live: LiveSession, profile: ProfileRecord) -> McpSessionConnections | None:
        """The session's MCP connections; (re)connects after a restart of this service."""
        task = live.mcp_task or self._start_mcp(live, profile)
        return await asyncio.shield(task)

    def _start_mcp(self, live: LiveSession, profile: ProfileRecord) -> asyncio.Task[McpSessionConnections | None]:
        live.mcp_task = live.tasks.spawn(self._connect_mcp(live, profile), name=f"mcp-connect:{live.session_id}")
        return live.mcp_task

    async def _connect_mcp(self, live: LiveSession, profile: ProfileRecord) -> McpSessionConnections | None:
        if not profile.mcp_servers:
            return None
        connections = await McpSessionConnections.connect(
            live.session_id, list(profile.mcp_servers), self.config, profile_id=profile.id, profile_name=profile.name,
            call_timeout=self.settings.mcp_timeout,
        )
        if self.sessions.get(live.session_id) is not live:  # closed while connecting
            await connections.close()
            return None
        live.mcp = connections
        return connections

    async def revoke_key(self, key_id: str, closed: dict[str, list[EventView]], still_open: list[str]) -> None:
        """A client key was revoked, and the store says what that did: the sessions it alone held
        are closed (their close events written), on the others it loses its live access. Each
        session's owner applies that to its live state, whichever replica that is."""
        owners = await self.ownership.owners(
            [session_id for session_id in (*closed, *still_open) if session_id not in self.ownership.held]
        )
        elsewhere: dict[str, session_pb2.Revocation] = {}
        here: dict[str, list[EventView]] = {}
        for session_id, views in closed.items():
            if (address := owners.get(session_id)) is not None:
                revocation = elsewhere.setdefault(address, session_pb2.Revocation(key_id=key_id))
                revocation.closed.add(session_id=session_id, event_ids=[view["id"] for view in views])
            else:
                here[session_id] = views
        for session_id in still_open:
            if (address := owners.get(session_id)) is not None:
                elsewhere.setdefault(address, session_pb2.Revocation(key_id=key_id)).session_ids.append(session_id)
        self.revoke(key_id, [session_id for session_id in still_open if session_id not in owners])
        # Side by side: each close may wait a while for its sandbox host (see `close`), all within one deadline.
        await asyncio.gather(
            *(self._closed_by_revocation(key_id, session_id, views) for session_id, views in here.items()),
            *(self.peers.apply_revocation(address, r) for address, r in elsewhere.items()),
        )

    async def apply_revocation(self, revocation: session_pb2.Revocation) -> None:
        """Another replica revoked a key: apply it to the sessions this one owns."""
        await asyncio.gather(*(self._apply_closed(revocation.key_id, closed) for closed in revocation.closed))
        self.revoke(revocation.key_id, list(revocation.session_ids))

    async def _apply_closed(self, key_id: str, closed: session_pb2.ClosedSession) -> None:
        views: list[EventView] = []
        if closed.event_ids:
            first = await self.store.event_seq(closed.session_id, closed.event_ids[0])
            if first is not None:
                page = await self.store.list_events(closed.session_id, first - 1, len(closed.event_ids))
                views = [view for _, view in page if view["id"] in closed.event_ids]
        await self._closed_by_revocation(key_id, closed.session_id, views)

    async def _closed_by_revocation(self, key_id: str, session_id: str, views: list[EventView]) -> None:
        await self.publish(session_id, views)
        await self.close(session_id, attribute_to=key_id)
        session_spans.end(session_id)  # a forced close ends the session's span as DELETE does

    def revoke(self, key_id: str, session_ids: list[str]) -> None:
        """A revoked client key loses its live access: its streams end (a call of its still queued
        for the gate records nothing), it is no longer a driver, and a turn it left paused, or
        pauses later, becomes reclaimable at once (§7.3 abandonment)."""
        for session_id in session_ids:
            live = self.sessions.get(session_id)
            if live is not None:
                live.drivers.discard(key_id)
                live.feed.end_streams_of(key_id)
                live.gate.revoke(key_id)

    async def close(self, session_id: str, attribute_to: str | None) -> None:
        """Tear a closed session down (§5.5 step 2): subagents, sandbox, subscribers, MCP, drivers, gate.

        The sandbox stop is the close's one call to a sandbox host, and a host can be frozen or slow
        without having been seen down yet: the stop's own deadline is as long as the caller's. So
        the stop runs as work of `self.closing`, and the close waits for it only CLOSE_WAIT_SHARE of
        that deadline. Past that the close goes on without it; the stop still writes its `stopped`
        or `error` event when the host answers or its deadline passes, and that event is the last
        one the close writes, so the log keeps §14's order (close, cancelled*, stop, stopped|error).
        A container whose stop failed is stopped by `reconcile` at the next start.
        """
        live = self.sessions.pop(session_id, None)
        if live is not None:
            self._closing_feeds[session_id] = live
            try:
                try:
                    await subagent_calls.cancel_at_close(self, live, actor=attribute_to)
                except Exception:  # logged; never blocks a close
                    log.exception("cancelling the subagents of %s failed", session_id)
                if live.sandbox is not None:
                    stopping = self.closing.spawn(
                        stop_sandbox(self, live, attribute_to, reason="session_close"), name=f"stop:{session_id}"
                    )
                    await asyncio.wait({stopping}, timeout=self.settings.rpc_timeout * CLOSE_WAIT_SHARE)
            finally:
                # A stop that outlasts the wait is logged only: the subscribers' streams end now.
                del self._closing_feeds[session_id]
            await self._teardown(live)
        await self.ownership.release(session_id)

    async def _drop(self, session_ids: set[str]) -> None:
        """Sessions this replica no longer owns: forget their live state, leaving their work running
        (the new owner takes the sandboxes and subagents back)."""
        for session_id in session_ids:
            live = self.sessions.pop(session_id, None)
            if live is not None:
                await self._teardown(live)

    async def _adopt(self, session_id: str) -> None:
        """A session taken over from a replica that died: its log is read again (a turn it left
        parked comes back expired, to be abandoned) and its sandbox and subagents re-attached."""
        try:
            live = await self.attach(session_id)
        except (SessionNotOpen, NotOwner):
            return
        await self.load_history(live)
        if self.sandboxes is not None:
            await self.reconcile(session_id)

    async def _teardown(self, live: LiveSession) -> None:
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

    async def _stop_idle_sandbox(self, session_id: str, handle: IdleHandle) -> None:
        """BAE_SANDBOX_IDLE_TIMEOUT passed without a command: stop it as an explicit stop would."""
        live = self.sessions.get(session_id)
        if live is not None and live.sandbox is handle:
            await stop_sandbox(self, live, None, reason="idle_timeout")

    def sandbox_status(self) -> dict:
        if self.sandboxes is None:
            return {"items": []}
        return self.sandboxes.status_view()

    def provision(self, profile: ProfileRecord) -> None:
        """Profile created or replaced: (re)provision its sandbox images in the background (§10.2)."""
        if self.sandboxes is not None:
            self.sandboxes.provision(profile.id, profile.available_sandboxes)  # [] forgets the profile

    async def start(self) -> None:
        """Join the replicas, resolve the sandbox hosts, re-provision the images of every live
        profile that declares any, then take back what the hosts still run for open sessions."""
        await self.ownership.start()
        if self.sandbox_discovery is not None:
            await self.sandbox_discovery.refresh()
            self.sandbox_discovery.start()
        if self.sandboxes is not None:
            for profile in await self.store.live_profiles():
                if profile.available_sandboxes:
                    self.provision(profile)
            await self.reconcile()
            # A host that was down or silent just now is reconciled when it is first seen up.
            self.sandboxes.on_uninventoried_up = self._reconcile_late

    def _reconcile_late(self) -> None:
        self._reconciling.spawn(self.reconcile(uninventoried_only=True), name="hosts")

    async def reconcile(self, only_session: str | None = None, *, uninventoried_only: bool = False) -> None:
        """Adopt the sandboxes and subagents of open sessions this replica owns that the hosts
        still run (a restart or a takeover leaves them running), and stop the containers of
        sessions that are closed, failed or unknown. Sessions other replicas own are theirs.
        `uninventoried_only` limits it to hosts no reconciliation has covered yet."""
        assert self.sandboxes is not None
        for inventory in await self.sandboxes.inventory(uninventoried_only=uninventoried_only):
            host = inventory.host
            for info in inventory.sandboxes:
                if only_session is not None and info.session_id != only_session:
                    continue
                handle = SandboxHandle(host=host, sandbox_id=info.sandbox_id, image=info.image)
                session = await self.store.get_session(info.session_id)
                live = self.sessions.get(info.session_id)
                if live is not None and live.sandbox is not None and live.sandbox.sandbox_id == info.sandbox_id:
                    continue  # already this session's sandbox
                keep = (
                    session is not None
                    and session.state == SessionState.OPEN
                    and info.state == "running"
                    and (live is None or live.sandbox is None)
                )
                if not keep:
                    log.info("stopping sandbox %s of %s session %s", info.sandbox_id,
                             session.state if session else "unknown", info.session_id)
                    try:
                        await self.sandboxes.stop(handle)
                    except SandboxError as exc:
                        log.warning("stopping orphan sandbox %s failed: %s", info.sandbox_id, exc.detail)
                    continue
                try:
                    live = await self.attach(info.session_id)
                except (SessionNotOpen, NotOwner):
                    continue
                if live.sandbox is not None:  # the session started another one meanwhile
                    continue
                live.sandbox = handle
                self.sandboxes.adopt(info.session_id, handle)
                log.info("re-attached sandbox %s of session %s", info.sandbox_id, info.session_id)
                mine = [command for command in inventory.commands if command.sandbox_id == info.sandbox_id]
                await self._adopt_subagents(live, host, [command.command_id for command in mine])

    async def _adopt_subagents(self, live: LiveSession, host: str, command_ids: list[str]) -> None:
        """Track again the subagents the log shows running and the host still knows."""
        launched: dict[str, Subagent] = {}
        for event in await self.store.subagent_events(live.session_id):
            payload = event["payload"]
            subagent_id = payload.get("subagent_id")
            if payload.get("dispatch") != "remote" or not isinstance(subagent_id, str):
                continue
            if event["event_type"] == "session.subagent.start":
                launched[subagent_id] = Subagent(
                    subagent_id, str(payload.get("harness")), str(payload.get("model")),
                    launched_by=event["client_key_id"] or "", host=host,
                )
            elif event["event_type"] != "session.subagent.running":
                launched.pop(subagent_id, None)  # it ended
        for subagent_id, entry in launched.items():
            if subagent_id in command_ids and subagent_id not in live.subagents.entries:
                live.subagents.entries[subagent_id] = entry
                live.tasks.spawn(subagent_calls.watch(self, live, entry), name=f"subagent:{subagent_id}")
                log.info("re-attached subagent %s of session %s", subagent_id, live.session_id)

    async def drain(self, timeout: float) -> None:
        """Shutdown phase 2: the sandbox stops of sessions closed just before end within `timeout`."""
        if not await self.closing.drain(timeout):
            log.warning("%d sandbox stop(s) of closed sessions still waiting after %.1fs; cancelling them",
                        len(self.closing), timeout)

    async def stop(self) -> None:
        """Last shutdown phase: drop every session's live state. Sandboxes and subagents keep
        running on their hosts; the next start takes them back (`reconcile`)."""
        if self.sandbox_discovery is not None:
            await self.sandbox_discovery.close()
        await self.closing.cancel()  # what `drain` left: those containers are stopped at the next start
        await self._reconciling.cancel()
        while self.sessions:
            _, live = self.sessions.popitem()
            await self._teardown(live)
        if self.sandboxes is not None:
            await self.sandboxes.close()
        await self.ownership.stop()
        await self.peers.close()
