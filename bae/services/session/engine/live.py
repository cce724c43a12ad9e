"""A live session: what this replica holds in memory for one open session it owns.

Everything here is memory only (SERVER-SPEC §0.1): the drivers, the turn gate and
parked turn, the live feed, the cached provider history, MCP connections, the remote
sandbox handle, the subagents, the auto-compaction backoff and the usage totals. The log
is enough to rebuild it (`registry.rebuild`, `SessionRegistry.load_history`, `Reconciler`),
so a restart or a takeover loses none of it but live streams.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from bae.common.jsontext import JsonObject
from bae.services.session.engine.budgets import Spend
from bae.services.session.engine.cancel import TurnCancel
from bae.services.session.engine.feed import SessionFeed
from bae.services.session.engine.gate import TurnGate
from bae.services.session.engine.history import History
from bae.services.session.engine.ports import McpSession, SandboxHandle
from bae.services.session.engine.subagents import SubagentTracker
from bae.services.session.engine.tasks import TaskOwner
from bae.services.session.store.events import EventView


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
    # The running turn's cancellation while a `sendMessage` turn holds the gate (session.cancelTurn).
    cancel: TurnCancel | None = None
    history: History | None = None  # loaded from the log on first use
    mcp: McpSession | None = None
    mcp_task: asyncio.Task[McpSession | None] | None = None
    sandbox: SandboxHandle | None = None  # the remote sandbox, one per session
    # Starts and stops of its sandbox finished so far: a host's list read before one finished is stale.
    sandbox_changes: int = 0
    compaction_backoff: CompactionBackoff | None = None
    spend: Spend = field(default_factory=Spend)  # the session's usage totals, read on first use
    subagents: SubagentTracker = field(default_factory=SubagentTracker)
    # Background work of this session (MCP connects, subagents); cancelled when it closes.
    tasks: TaskOwner = field(default_factory=lambda: TaskOwner("session"))
    # Serializes registrations (a key's first one logs exactly once) and sandbox starts.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def loaded_history(self) -> History:
        if self.history is None:
            raise RuntimeError(f"history of {self.session_id} used before it was loaded")
        return self.history


def paused_tool_uses(event: EventView) -> list[JsonObject]:
    """The `tool_use` blocks of a paused turn's assistant message (tagged with `dispatch`), else []."""
    payload = event["payload"]
    if event["event_type"] != "server.message.send" or payload.get("role", "assistant") != "assistant":
        return []
    content = payload.get("content")
    blocks = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"] if isinstance(content, list) else []
    return blocks if any("dispatch" in block for block in blocks) else []
