"""The turn engine's entry points: run a turn, run a compaction (SERVER-SPEC §7, §12).

Anything may call them: a JSON-RPC method for a client, or code with no
client at all. They take typed requests, broadcast every event they record
through the session's live feed (which is how callers watch), and return a
typed outcome or raise an `EngineError`. Once a call holds the turn gate its
work runs in a task the engine owns, so a caller that goes away stops only
its own delivery; shutdown drains those tasks before anything is torn down.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Coroutine, TypeVar

from bae.common.config import Config
from bae.common.errors import echo
from bae.common.jsontext import JsonObject
from bae.services.session.engine import compaction
from bae.services.session.engine.domain import (
    CompactionOutcome,
    CompactionReason,
    CompactionTrigger,
    CompactRequest,
    SessionState,
    TurnEnd,
    TurnOutcome,
    TurnRequest,
)
from bae.services.session.engine.cancel import TurnCancel
from bae.services.session.engine.errors import (
    CompactionFailed,
    LoopFailed,
    MergeRefused,
    OrphanToolResult,
    ProfileUnavailable,
    SessionNotOpen,
    ShuttingDown,
    TurnCancelled,
    BudgetExhausted,
)
from bae.services.session.engine.feed import Watcher
from bae.services.session.engine.gate import Claim, ParkedTurn
from bae.services.session.engine.merge import (
    ABANDONED_TEXT,
    MergeInvalid,
    has_tool_result,
    is_continuation,
    merge_abandonment,
    merge_continuation,
    synthesize,
)
from bae.services.session.engine.live import LiveSession
from bae.services.session.engine.loop import TurnLoop
from bae.services.session.engine.ports import EventItem, EventStore, ProviderSteps, StepFailed
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.engine.spans import MERGE_INVALID, PROFILE_UNAVAILABLE, SessionSpans, turn_trace
from bae.services.session.engine.tasks import TaskOwner
from bae.services.session.engine.turn import Turn
from bae.services.session.store.records import ProfileRecord, SessionRecord

log = logging.getLogger("bae.session.engine")

Records = tuple[SessionRecord | None, ProfileRecord | None]

# `server.message.send`'s `synthetic` marker on the results that answer the calls of a turn that
# ended without their own, and the error text of each call left unanswered.
SYNTHETIC_ABANDONED = "abandoned_tool_results"
SYNTHETIC_CANCELLED = "cancelled_tool_results"
SYNTHETIC_BUDGET = "budget_exhausted_tool_results"
SYNTHETIC_TEXTS = {
    SYNTHETIC_ABANDONED: ABANDONED_TEXT,
    SYNTHETIC_CANCELLED: "Tool call was cancelled before returning a result.",
    SYNTHETIC_BUDGET: "Tool call ended without a result: a budget of this session ran out.",
}

T = TypeVar("T")


class TurnEngine:
    def __init__(
        self,
        *,
        registry: SessionRegistry,
        store: EventStore,
        steps: ProviderSteps,
        loop: TurnLoop,
        config: Config,
        spans: SessionSpans,
    ) -> None:
        self._registry = registry
        self._store = store
        self._steps = steps
        self._loop = loop
        self._config = config
        self._spans = spans
        self._work = TaskOwner("turn")
        self._accepting = True
        # One history load per session at a time, which every caller that arrives meanwhile awaits:
        # they resume in arrival order, so they reach the gate in arrival order even on a store
        # whose concurrent reads finish in any order (PostgreSQL's pool).
        self._loading: dict[str, asyncio.Future[Any]] = {}

    # -- entry points -----------------------------------------------------------

    async def run_turn(
        self, request: TurnRequest, *, watcher: Watcher | None = None, records: Records | None = None
    ) -> TurnOutcome:
        """Queue on the session's gate, then run one `sendMessage` turn to its end.

        `watcher` (the caller's stream) joins the feed once the gate is held, and
        is ended when the turn is; the input the turn records is not echoed to it.
        `records` are the session and profile the caller already read, reused
        when the turn did not have to queue.
        Cancelling while queued records nothing; after that the turn runs on, until its end or a
        `cancel_turn`.
        """
        live = await self._admit(request.session_id)
        claim = await live.gate.acquire(request.actor)
        live.cancel = TurnCancel()  # with the gate held, before any await: a cancel from now on finds it
        return await self._owned(
            self._turn(live, request, claim, watcher, records, live.cancel), request.session_id, watcher
        )

    async def compact(self, request: CompactRequest, *, watcher: Watcher | None = None) -> CompactionOutcome:
        """Run one `session.compact` (§12.3): waits for a running turn, never for a paused one."""
        live = await self._admit(request.session_id)
        claim = await live.gate.acquire_for_compaction(request.actor)
        return await self._owned(self._compaction(live, request, claim, watcher), request.session_id, watcher)

    async def cancel_turn(self, session_id: str, actor: str) -> bool:
        """`session.cancelTurn` by `actor`: stop the session's running turn, or end its paused one.

        A running turn stops at its next wait for outside work and records its cancellation
        itself; True once it did, False when it ended on its own first. A paused turn's calls
        are answered here, holding the gate as a turn would. False when no turn runs or waits:
        a queued `sendMessage` or a `session.compact` is not cancelled.
        """
        live = await self._admit(session_id)
        if live.cancel is not None:
            return await asyncio.shield(live.cancel.request(actor))
        parked = live.gate.take_parked()
        if parked is None:
            return False
        return await self._owned(self._cancel_paused(live, parked, actor), session_id, None)

    def busy(self) -> bool:
        """Whether a turn or a compaction runs on this replica now."""
        return len(self._work) > 0

    async def quiet(self) -> None:
        """Wait until no turn or compaction runs on this replica (background work that can wait lets
        them go first: engine/webhook_delivery.py)."""
        await self._work.empty()

    async def next_end(self) -> None:
        """Wait until a turn or a compaction ends on this replica (its events may owe webhook deliveries)."""
        await self._work.next_end()

    async def drain(self, timeout: float) -> None:
        """Shutdown phases 1 and 2: take no new work, let running work finish within `timeout`."""
        self._accepting = False
        if not await self._work.drain(timeout):
            log.warning("%d turn(s) still running after %.1fs; cancelling them", len(self._work), timeout)
            await self._work.cancel()

    async def _owned(self, work: Coroutine[Any, Any, T], session_id: str, watcher: Watcher | None) -> T:
        """Run work that holds the gate in a task the engine owns; a caller that goes away
        stops waiting for it (and its watcher learns so), but the work runs on."""
        task = self._work.spawn(work, name=session_id)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if watcher is not None:
                watcher.leave()
            raise

    async def _admit(self, session_id: str) -> LiveSession:
        if not self._accepting:
            raise ShuttingDown
        live = self._registry.existing(session_id)
        if live.history is None:  # loaded before the gate: it may hold a recovered pause
            loading = self._loading.get(session_id)
            if loading is None:
                loading = asyncio.ensure_future(self._registry.load_history(live))
                self._loading[session_id] = loading
                loading.add_done_callback(lambda _: self._loading.pop(session_id, None))
            await asyncio.shield(loading)
        return live

    def _turn_of(
        self, live: LiveSession, actor: str, watcher: Watcher | None, cancel: TurnCancel | None = None
    ) -> Turn:
        return Turn(live, actor, self._store, self._registry, self._steps, echo=watcher, cancel=cancel)

    # -- a turn -----------------------------------------------------------------

    async def _turn(
        self,
        live: LiveSession,
        request: TurnRequest,
        claim: Claim,
        watcher: Watcher | None,
        records: Records | None,
        cancel: TurnCancel,
    ) -> TurnOutcome:
        turn = self._turn_of(live, request.actor, watcher, cancel)
        turn.counts_turn = True  # in the usage totals, with its first provider response
        parked: ParkedTurn | None = None
        try:
            if records is None or claim.waited:  # the session may have changed while queued
                records = await self._store.session_and_profile(live.session_id)
            outcome, parked = await self._claimed_turn(turn, request, claim, watcher, *records)
            return outcome
        except StepFailed as exc:
            raise LoopFailed(str(exc)) from exc
        finally:
            await self._flush_quietly(turn)
            if watcher is not None:
                live.feed.forget(watcher)
            # With no await between: a cancel that comes now finds the pause, or no turn at all.
            cancel.close()
            live.cancel = None
            if parked is not None:
                live.gate.park(parked)
            else:
                live.gate.release()

    async def _claimed_turn(
        self,
        turn: Turn,
        request: TurnRequest,
        claim: Claim,
        watcher: Watcher | None,
        session: SessionRecord | None,
        profile: ProfileRecord | None,
    ) -> tuple[TurnOutcome, ParkedTurn | None]:
        live = turn.live
        previous = claim.parked
        if claim.reclaimed and previous is not None:
            await self._abandoned(turn, previous)
        if session is None or session.state != SessionState.OPEN:
            raise SessionNotOpen.of(session.state if session else None)
        role, content = request.message.role, request.message.content
        server_ids: set[str] = set()
        if previous is not None:
            try:
                if role != "user":
                    raise MergeInvalid(f'paused tool continuation must have role "user", got "{echo(str(role))}"')
                if claim.reclaimed:
                    content = merge_abandonment(previous.tool_uses, previous.server_results, content, timed_out=True)
                elif is_continuation(content):
                    content = merge_continuation(previous.tool_uses, previous.server_results, content)
                else:
                    content = merge_abandonment(previous.tool_uses, previous.server_results, content, timed_out=False)
            except MergeInvalid as exc:
                await self._merge_refused(turn, exc)
            server_ids = set(previous.server_results)
        elif has_tool_result(content):
            raise OrphanToolResult

        await self._registry.load_history(live)
        if watcher is not None:
            live.feed.join(watcher)
        items: list[tuple[str, JsonObject]] = [("client.message.send", {"role": role, "content": content})]
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("tool_use_id") not in server_ids:
                items.append(("tool.result", client_result(block)))
        # Written while the provider step starts: the step's own events wait for this write, and
        # its failure fails the turn before anything else is recorded (Turn.emit_soon).
        turn.emit_soon(items, echo=True)

        if profile is None:
            await turn.emit(
                [("session.error", {"reason": "profile_unavailable", "profile_id": session.profile_id})],
                new_state=SessionState.ERROR,
            )
            self._spans.end(live.session_id, PROFILE_UNAVAILABLE)
            raise ProfileUnavailable
        paused = previous.span_context if previous is not None else None
        with turn_trace(self._spans, live.session_id, request.actor, previous is not None, paused) as traced:
            if watcher is not None:
                watcher.when_left(traced.client_left)
            turn.limits = self._config.limits.overridden(profile.limits)
            try:
                result = await self._loop.run(turn, session, profile)
            except TurnCancelled as cancelled:
                traced.cancelled()
                await self._cancelled(turn, cancelled)
                raise
            except BudgetExhausted as stopped:
                traced.cancelled()
                await self._budget_exhausted(turn, stopped)
                raise
            if turn.cancel is not None:
                turn.cancel.close()  # the loop ended on its own: a cancel from now on is answered False
            span_context = traced.ended(result.end)
            pending = previous.pending_compaction if previous is not None else None
            if result.end == TurnEnd.PAUSED and result.parked is not None:
                result.parked.pending_compaction = self._crossed(session, turn) or pending
                result.parked.span_context = span_context
                return TurnOutcome(result.end, result.message, turn.events), result.parked
            if result.end == TurnEnd.COMPLETED:
                await self._auto_compact(turn, session, profile, pending)
            return TurnOutcome(result.end, result.message, turn.events), None

    # -- cancelling a turn ---------------------------------------------------------------

    async def _cancelled(self, turn: Turn, cancelled: TurnCancelled) -> None:
        """A running turn stopped by `session.cancelTurn`: the tool calls it was running, if any,
        recorded as a paused turn's would be and answered with synthetic results, then
        `session.turn.cancelled`; all in one write, after what the turn had carried."""
        cancel = turn.cancel
        assert cancel is not None and cancel.by is not None
        tool_uses, items = stopped_calls(cancelled.message, cancelled.answered, SYNTHETIC_CANCELLED)
        items.append(turn_cancelled(tool_uses, cancelled.answered, cancel.by))
        try:
            await turn.emit(items)
        except BaseException as exc:
            cancel.failed(exc)
            raise
        cancel.honoured()

    async def _budget_exhausted(self, turn: Turn, stopped: BudgetExhausted) -> None:
        """A turn stopped before a provider call by a used-up budget: the tool calls it had
        answered, if any, recorded with their results (as a cancelled turn's are), then
        `session.error` {reason: budget_exhausted, budget, used, limit}; the session stays open."""
        _, items = stopped_calls(stopped.message, stopped.answered, SYNTHETIC_BUDGET)
        items.append(("session.error", stopped.payload))
        await turn.emit(items)

    async def _cancel_paused(self, live: LiveSession, parked: ParkedTurn, actor: str) -> bool:
        """End a paused turn, for which the gate is held: its unanswered calls get synthetic results,
        then `session.turn.cancelled`, in one write attributed to the turn's owner."""
        turn = self._turn_of(live, parked.owner, watcher=None)
        try:
            try:
                items = synthetic_results(parked.tool_uses, parked.server_results, SYNTHETIC_CANCELLED)
            except MergeInvalid as exc:  # as when a compaction retires it (§12.3)
                await self._merge_refused(turn, exc)
            items.append(turn_cancelled(parked.tool_uses, parked.server_results, actor))
            await turn.emit(items)
        finally:
            live.gate.release()
        return True

    async def _abandoned(self, turn: Turn, parked: ParkedTurn) -> None:
        """An expired pause was taken from its owner: say so, attributed to the owner (§7.3)."""
        await turn.emit(
            [("session.error", {"reason": "driver_turn_abandoned", "owner_client_key_id": parked.owner})],
            attribute_to=parked.owner,
            in_result=False,
        )

    async def _merge_refused(self, turn: Turn, exc: MergeInvalid) -> None:
        await turn.emit(
            [("session.error", {"reason": "tool_result_merge_invalid", "detail": str(exc)})],
            new_state=SessionState.ERROR,
        )
        self._spans.end(turn.session_id, MERGE_INVALID)
        raise MergeRefused(str(exc))

    # -- auto compaction (§12.2) ------------------------------------------------------

    @staticmethod
    def _crossed(session: SessionRecord, turn: Turn) -> int | None:
        """The token count when this turn's last provider call crossed the auto threshold."""
        size = compaction.auto_threshold(session)
        usage = turn.last_usage
        if size is None or usage is None or usage.token_count <= size:
            return None
        return usage.token_count

    async def _auto_compact(
        self, turn: Turn, session: SessionRecord, profile: ProfileRecord, pending: int | None
    ) -> None:
        size = compaction.auto_threshold(session)
        if size is None:
            return
        usage = turn.last_usage
        token_count = usage.token_count if usage is not None else None
        if pending is not None and (token_count is None or token_count <= size):
            token_count = pending  # crossed on the paused call, honoured at this boundary
        reason = compaction.auto_reason(turn.live, token_count, size)
        if reason is None or token_count is None:
            return
        spent = await turn.exhausted()
        if spent is not None:  # a compaction is a provider call too: not made on a used-up budget
            log.info("auto compaction of %s skipped: %s", turn.session_id, spent.message)
            return
        try:
            await compaction.run_compaction(
                turn,
                self._config,
                profile,
                trigger=CompactionTrigger.AUTO,
                reason=reason,
                token_count=token_count,
                threshold=size,
                instruction=compaction.DEFAULT_PROMPT,
            )
        except CompactionFailed as exc:
            log.warning("auto compaction of %s failed: %s", turn.session_id, exc.detail)
            compaction.arm_backoff(turn.live, token_count)
        except Exception as exc:  # the records could not be written: the turn still succeeds
            log.exception("auto compaction of %s could not be recorded", turn.session_id)
            compaction.arm_backoff(turn.live, token_count)
            try:
                await turn.emit(
                    [("session.error", {"reason": "compaction_store_failed", "detail": type(exc).__name__})]
                )
            except Exception:
                log.exception("recording compaction_store_failed on %s failed", turn.session_id)

    # -- a manual compaction (§12.3) --------------------------------------------------

    async def _compaction(
        self, live: LiveSession, request: CompactRequest, claim: Claim, watcher: Watcher | None
    ) -> CompactionOutcome:
        turn = self._turn_of(live, request.actor, watcher=None)
        try:
            if watcher is not None:
                live.feed.join(watcher)
            previous = claim.parked
            if claim.reclaimed and previous is not None:
                await self._abandoned(turn, previous)
            session, profile = await self._store.session_and_profile(live.session_id)
            if session is None or session.state != SessionState.OPEN:
                raise SessionNotOpen.of(session.state if session else None)
            await self._registry.load_history(live)
            if previous is not None:
                await self._retire(turn, previous)
            if profile is None:
                raise ProfileUnavailable
            usage = await self._store.latest_turn_usage(live.session_id)
            completed = await compaction.run_compaction(
                turn,
                self._config,
                profile,
                trigger=CompactionTrigger.CLIENT,
                reason=CompactionReason.MANUAL,
                token_count=_token_count(usage),
                threshold=None,
                instruction=compaction.client_prompt(session, request.prompt),
            )
            return CompactionOutcome(completed, turn.events)
        except StepFailed as exc:
            raise CompactionFailed(f"the model runner is unreachable ({exc})") from exc
        finally:
            await self._flush_quietly(turn)
            if watcher is not None:
                live.feed.forget(watcher)
            live.gate.release()

    async def _retire(self, turn: Turn, parked: ParkedTurn) -> None:
        """Answer a reclaimed pause's calls so the history stays valid (§12.3 step 7)."""
        try:
            items = synthetic_results(parked.tool_uses, parked.server_results, SYNTHETIC_ABANDONED)
        except MergeInvalid as exc:
            await self._merge_refused(turn, exc)
        await turn.emit(items)

    @staticmethod
    async def _flush_quietly(turn: Turn) -> None:
        try:
            await turn.flush()
        except Exception:
            log.exception("writing the last events of %s's turn failed", turn.session_id)


def synthetic_results(tool_uses: list[JsonObject], answered: dict[str, JsonObject], marker: str) -> list[EventItem]:
    """The events that answer every call of `tool_uses`, an assistant message already in the
    history, so that the next provider call sees a valid one: one synthetic user message (the
    `answered` result of each call, else an error result saying why: `marker`), then a
    `tool.result` for each error result, so every `tool.call` stays paired. Raises MergeInvalid
    when the calls cannot be answered (no ids, or one twice)."""
    results = synthesize(tool_uses, answered, SYNTHETIC_TEXTS[marker])
    dispatch = {block.get("id"): block.get("dispatch", "client") for block in tool_uses}
    items: list[EventItem] = [("server.message.send", {"role": "user", "content": results, "synthetic": marker})]
    items += [
        ("tool.result", {**client_result(block), "dispatch": dispatch[block["tool_use_id"]]})
        for block in results
        if block["tool_use_id"] not in answered
    ]
    return items


def stopped_calls(
    message: JsonObject | None, answered: dict[str, JsonObject], marker: str
) -> tuple[list[JsonObject], list[EventItem]]:
    """A running turn stopped between its tool calls and its next provider call: the calls of
    `message` (the assistant message they came in; None before the first call), and the events
    that record it as a paused turn's would be, answered (`synthetic_results`). Calls that cannot
    be answered (an id twice) stay out of the history: no events then."""
    if message is None:
        return [], []
    content = message["content"]
    tool_uses = [block for block in content if isinstance(block, dict) and block.get("type") == "tool_use"]
    try:
        return tool_uses, [("server.message.send", message), *synthetic_results(tool_uses, answered, marker)]
    except MergeInvalid:
        return tool_uses, []


def turn_cancelled(tool_uses: list[JsonObject], answered: dict[str, JsonObject], actor: str) -> EventItem:
    """`session.turn.cancelled`: who cancelled, and the calls of `tool_uses` left without a result of their own."""
    unanswered = [block.get("id") for block in tool_uses if block.get("id") not in answered]
    return "session.turn.cancelled", {"cancelled_by": actor, "tool_use_ids": unanswered}


def client_result(block: JsonObject) -> JsonObject:
    """The `tool.result` payload of a client-answered `tool_result` block."""
    return {
        "tool_use_id": block.get("tool_use_id"),
        "dispatch": "client",
        "server_name": None,
        "is_error": bool(block.get("is_error", False)),
        "content": block.get("content"),
    }


def _token_count(usage: JsonObject | None) -> int | None:
    if usage is None:
        return None
    try:
        return int(usage["input_tokens"]) + int(usage["output_tokens"])
    except (KeyError, TypeError, ValueError):
        return None
