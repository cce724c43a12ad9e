"""A session the server opens and drives itself, with no client attached: a schedule's tick
or an HTTP trigger's call (engine/triggers.py).

It goes through the same paths a client's calls do, so quotas (max_open_sessions_per_key at the
open), budgets (before each provider call of the turn), usage, MCP servers, the Auto sandbox and
subagents apply as they would: `open` is `POST /api/v1/sessions` (store/opening.py, with the
API's vetting), `drive` is `session.registerDriver` then `session.sendMessage` (the engine's
`run_turn`), `close` is `DELETE /api/v1/sessions/{id}`. Nothing answers client tools, so an opener
must not use a profile that allows them (the schedules and triggers APIs refuse one at create time).

A run (a schedule's tick, a trigger's call) whose replica stopped is resumed by another replica,
which reads what the run's session log says (`logged_outcome`): its message not sent yet, it is
sent; the turn ended, that is the run's outcome; the turn cut off by the stop, the run failed
(TURN_CUT_OFF: the turn is not run again, which could repeat its tool calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Iterable, Protocol, TypeVar

from bae.common.jsontext import load

from bae.services.session.engine.closing import SessionCloser
from bae.services.session.engine.domain import Message, TurnEnd, TurnOutcome, TurnRequest
from bae.services.session.engine.engine import TurnEngine
from bae.services.session.engine.feed import Watcher
from bae.services.session.engine.mcp_sessions import SessionMcp
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.engine.sandboxes import SessionSandboxes
from bae.services.session.engine.spans import SessionSpans
from bae.services.session.store import fired, opening
from bae.services.session.store.fired import Outcome
from bae.services.session.store.opening import Opened, Refused, Then, Vetting
from bae.services.session.store.records import KeyRecord
from bae.services.session.store.store import Store

TURN_CUT_OFF = "the turn did not finish: the replica running it stopped"


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

    async def logged_outcome(self, session_id: str) -> tuple[str, str | None] | None:
        """What a resumed run's session log says: None when its message was never sent (send it now)."""
        state, messages = await self.store.read(fired.turn_log, session_id)
        if state is None:
            return Outcome.FAILED, "the session was deleted"
        return outcome_from_log(state, messages)


def turn_outcome(end: TurnEnd, opener: str) -> tuple[str, str | None]:
    """A run's outcome from its turn's end; `opener` names who cannot answer client tools ("a schedule")."""
    if end == TurnEnd.COMPLETED:
        return Outcome.COMPLETED, None
    if end == TurnEnd.PAUSED:
        return Outcome.FAILED, f"the turn paused for client tools, which {opener} cannot answer"
    return Outcome.FAILED, "the provider is currently unavailable; the session is in error"


def outcome_from_log(state: str, messages: list[tuple[str, str]]) -> tuple[str, str | None] | None:
    """A run's outcome as its session's messages (event_type, payload) tell it; None: the user message
    was never recorded. Completed: the last message is the assistant's, with no tool call left open."""
    if not any(event_type == "client.message.send" for event_type, _ in messages):
        return None if state == "open" else (Outcome.FAILED, f"the session is {state} and its message was never sent")
    event_type, payload = messages[-1]
    if event_type == "server.message.send":
        message = load(payload)
        content = message.get("content")
        calls = isinstance(content, list) and any(
            isinstance(block, dict) and block.get("type") == "tool_use" for block in content
        )
        if message.get("role") == "assistant" and not calls:
            return Outcome.COMPLETED, None
    if state == "error":
        return Outcome.FAILED, "the provider is currently unavailable; the session is in error"
    return Outcome.FAILED, TURN_CUT_OFF


class Run(Protocol):
    """A schedule's or a trigger's run row, as the check for stranded runs reads it."""

    @property
    def id(self) -> str: ...
    @property
    def replica_id(self) -> str: ...


R = TypeVar("R", bound=Run)


def stranded(running: Iterable[R], live: Collection[str], me: str, driving: Collection[str]) -> list[R]:
    """Of the running runs, those no replica drives: their replica is not live, or it is this one
    and it does not drive them (it restarted). A live other replica's runs are its own."""
    return [run for run in running if run.id not in driving and (run.replica_id == me or run.replica_id not in live)]
