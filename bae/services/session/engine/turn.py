"""One call's record of its work on a session while it holds the gate (SERVER-SPEC §7.6).

A `Turn` records every event before it is broadcast and asks for one provider step at a
time, recording the step's events as they stream. The provider loop (`loop.py`) and a
compaction (`compaction.py`) both work through it. It knows no wire format: the caller's
stream is only a `Watcher` whose own input echo the turn marks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from bae.common.jsontext import JsonObject, dump
from bae.common.limits import DEFAULT_LIMITS, Limits
from bae.services.session.engine.budgets import Exhausted, exhausted
from bae.services.session.engine.cancel import TurnCancel
from bae.services.session.engine.domain import SessionState, Usage
from bae.services.session.engine.feed import Watcher
from bae.services.session.engine.history import MESSAGE_EVENTS
from bae.services.session.engine.live import LiveSession
from bae.services.session.engine.ports import (
    EventItem,
    EventStore,
    NewEvent,
    ProviderSteps,
    StepFailed,
    StepMessages,
    StepOutcome,
    StepRequest,
    StepResult,
    StepUpdate,
)
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.store.events import EventView
from bae.services.session.store.records import ProfileRecord
from bae.services.session.store.usage import Charge

log = logging.getLogger("bae.session.turn")

T = TypeVar("T")

PROVIDER_REQUEST = "provider.request"
PROVIDER_RESPONSE = "provider.response"
# A step may walk several providers, each bounded by the runner's own per-attempt timeout.
STEP_DEADLINE = 900.0


@dataclass
class Turn:
    live: LiveSession
    actor: str
    store: EventStore
    registry: SessionRegistry
    steps: ProviderSteps
    # The caller's own stream, if any: the input it recorded is not echoed back to it (§6.4).
    echo: Watcher | None = None
    # A `sendMessage` turn's cancellation (session.cancelTurn); None for work nobody cancels.
    cancel: TurnCancel | None = None
    events: list[EventView] = field(default_factory=list)
    # Usage of the last successful provider call of this turn (§12.2); None when unreported.
    last_usage: Usage | None = None
    # The events that came with a step's result (its provider.response, and its provider.request
    # when the provider answered at once), held back to be written in one store call with the
    # events that follow them.
    carried: list[NewEvent] = field(default_factory=list)
    # The usage of the provider responses among `carried`, added to the totals when they are written.
    carried_charge: Charge | None = None
    # A `session.sendMessage` turn, not yet counted in the usage totals: its first provider
    # response counts it.
    counts_turn: bool = False
    # The session's limits as its profile sets them when the turn starts (bae.common.limits).
    limits: Limits = DEFAULT_LIMITS
    # A write emit_soon started and nothing has waited for yet.
    _pending: asyncio.Future[list[EventView]] | None = field(default=None, init=False, repr=False)
    # Its messages, which the history gets only when the write is broadcast: a step that starts
    # before then sends them after the history.
    _unwritten: list[JsonObject] = field(default_factory=list, init=False, repr=False)

    @property
    def session_id(self) -> str:
        return self.live.session_id

    def step_messages(self, extensions: Sequence[JsonObject] = ()) -> StepMessages:
        """The history a provider step sends: the session's, then the messages of a write still
        under way, then `extensions` (this turn's messages not yet logged)."""
        return self.live.loaded_history.step_messages([*self._unwritten, *extensions])

    async def interruptible(self, work: Awaitable[T]) -> T:
        """Outside work the turn waits for (a provider step, a tool call): stopped, and TurnCancelled
        raised, when the turn is cancelled meanwhile (engine/cancel.py)."""
        if self.cancel is None:
            return await work
        return await self.cancel.interruptible(work)

    async def emit(
        self,
        items: Sequence[EventItem],
        *,
        echo: bool = False,
        new_state: SessionState | None = None,
        attribute_to: str | None = None,
        in_result: bool = True,
        charge: Charge | None = None,
    ) -> list[EventView]:
        """Persist (after any carried event), then broadcast. `echo` marks the caller's own input;
        `charge` is the usage of the provider responses among `items`."""
        await self.settle()
        carried, charge = self._take_carried(charge)
        return await self._write(
            carried, items, echo=echo, new_state=new_state, attribute_to=attribute_to, in_result=in_result, charge=charge
        )

    @contextlib.contextmanager
    def _charging(self, charge: Charge | None) -> Iterator[None]:
        """Around the write that records `charge`: the session's and the key's totals follow it."""
        with self.live.spend.charging(charge), self.registry.key_spends.charging(charge):
            yield

    async def exhausted(self) -> Exhausted | None:
        """The budget already used up for this turn's next provider call, if any (budgets.py)."""
        return await exhausted(
            self.store, self.limits, self.session_id, self.actor,
            session_spend=self.live.spend, key_spends=self.registry.key_spends,
        )

    def _take_carried(self, charge: Charge | None = None) -> tuple[list[NewEvent], Charge | None]:
        """The carried events to write now, and their charge with `charge`."""
        carried, self.carried = self.carried, []
        carried_charge, self.carried_charge = self.carried_charge, None
        return carried, charge.plus(carried_charge) if charge is not None else carried_charge

    def emit_soon(self, items: list[tuple[str, JsonObject]], *, echo: bool = False) -> None:
        """Start persisting and broadcasting `items` while the turn goes on to its provider call.

        The next emit (or `settle`) waits for this write first, so the log keeps its order and
        nothing that follows is written or broadcast when it fails: the turn then fails with the
        write's error, as it would have before calling the provider. What the provider step
        carries meanwhile is written after these, however soon it comes.
        """
        self._unwritten = [payload for kind, payload in items if kind in MESSAGE_EVENTS]
        carried, charge = self._take_carried()
        self._pending = asyncio.ensure_future(self._write(carried, list(items), echo=echo, charge=charge))

    async def _write(
        self,
        carried: list[NewEvent],
        items: Sequence[EventItem],
        *,
        echo: bool,
        new_state: SessionState | None = None,
        attribute_to: str | None = None,
        in_result: bool = True,
        charge: Charge | None = None,
    ) -> list[EventView]:
        with self._charging(charge):
            views = await self.store.append_events(
                self.session_id,
                carried + [(attribute_to or self.actor, kind, payload) for kind, payload in items],
                new_state=new_state,
                charge=charge,
            )
        own = views[len(carried):]
        if echo and self.echo is not None:  # before publishing, so the caller's stream never sees them
            self.echo.echo_ids.update(view["id"] for view in own)
        self.events.extend(views if in_result else views[: len(carried)])
        self.registry.publish(self.session_id, views)
        self._unwritten = []  # the history has them now
        return own

    async def settle(self) -> None:
        """Wait for a write `emit_soon` started; raises what it raised."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        try:
            await pending
        except BaseException:
            # They follow a write that did not succeed: nothing after it is recorded, or counted.
            self.carried, self.carried_charge = [], None
            raise

    async def emit_compaction(self, *, preamble: JsonObject, summary: JsonObject, completed: JsonObject) -> list[EventView]:
        """A compaction's preamble, summary and `completed` marker, written together, then broadcast."""
        await self.settle()
        carried, charge = self._take_carried()
        with self._charging(charge):
            views = await self.store.append_compaction(
                self.session_id, self.actor, carried, preamble, summary, completed, charge=charge
            )
        self.events.extend(views)
        self.registry.publish(self.session_id, views)
        return views

    async def flush(self) -> None:
        """Finish a write still under way, and write the events still carried when the
        turn ends without a following event."""
        await self.settle()
        if self.carried:
            await self.emit([])

    async def step(
        self,
        profile: ProfileRecord,
        messages: StepMessages,
        tools: list[JsonObject],
        *,
        purpose: str = "",
        min_max_tokens: int = 0,
    ) -> StepResult:
        """One provider step; records its events as they stream and returns the step's result. When
        someone listens for deltas (feed.wants_deltas) the step streams, and its deltas are published
        as they come, named after the `provider.request` event recorded last."""
        feed = self.live.feed
        request = StepRequest(
            session_id=self.session_id,
            primary_provider=profile.primary_provider,
            fallback_providers=profile.fallback_providers,
            tools_json=dump(tools),
            purpose=purpose,
            min_max_tokens=min_max_tokens,
            stream_deltas=feed.wants_deltas(),
        )
        result = None
        request_event_id = ""
        updates = self.steps.run_step(request, messages, timeout=STEP_DEADLINE)
        try:
            while result is None and (update := await self._next_update(updates)) is not None:
                if update.deltas:
                    feed.publish_deltas([replace(delta, request_event_id=request_event_id) for delta in update.deltas])
                charge = self._charge(profile, update)
                if update.result is not None:
                    result = update.result
                    self.carried += [(self.actor, kind, payload) for kind, payload in update.events]
                    self.carried_charge = charge.plus(self.carried_charge) if charge is not None else self.carried_charge
                elif update.events:
                    views = await self.emit(update.events, charge=charge)
                    request_event_id = next(
                        (view["id"] for view in reversed(views) if view["event_type"] == PROVIDER_REQUEST), request_event_id
                    )
        except StepFailed as exc:
            await self.settle()  # a failed write of what came before is the turn's error, not this
            log.error("runner step for session %s failed: %s", self.session_id, exc)
            raise
        finally:
            # What streamed is void if the call's response is not published (the turn was cancelled,
            # the step failed); a published one emptied it already.
            feed.stream.clear()
            await updates.aclose()  # stops the step when an emit failed or the turn was cancelled
        if result is None:
            raise StepFailed("the step ended without a result")
        if result.outcome == StepOutcome.OK:
            self.last_usage = result.usage
        return result

    async def _next_update(self, updates: AsyncIterator[StepUpdate]) -> StepUpdate | None:
        """The step's next update, None after its last: a cancelled turn stops waiting for it here."""
        try:
            return await self.interruptible(anext(updates))
        except StopAsyncIteration:
            return None

    def _charge(self, profile: ProfileRecord, update: StepUpdate) -> Charge | None:
        """The usage of the provider responses among a step update's events: each is a call, and
        the step's result has the usage of the one that succeeded (a failed one reports none)."""
        calls = sum(1 for event in update.events if event.event_type == PROVIDER_RESPONSE)
        if not calls:
            return None
        turns, self.counts_turn = int(self.counts_turn), False
        result = update.result
        usage = result.usage if result is not None and result.outcome == StepOutcome.OK else None
        if usage is None:
            return Charge(self.actor, profile.id, provider_calls=calls, turns=turns)
        read, created = usage.cache_read_input_tokens, usage.cache_creation_input_tokens
        return Charge(
            self.actor,
            profile.id,
            input_tokens=max(usage.input_tokens - read - created, 0),
            output_tokens=usage.output_tokens,
            cache_read_input_tokens=read,
            cache_creation_input_tokens=created,
            provider_calls=calls,
            turns=turns,
            cost_usd=result.cost_usd if result is not None else None,
        )
