"""The live JSON-RPC methods of `POST /api/v1/sessions/{id}/rpc` (SERVER-SPEC §6, §7, §12):
registration, client tools, subscriptions, turns and compaction. The sandbox
methods are in `sandbox_methods`.

Each method receives an authenticated `RpcCall`, runs its checks in the
spec's order and raises `RpcFault`/`EngineError` to refuse; the servicer turns
those into the error. Streaming methods yield events as frames, then their
terminal frame. Turns and compactions run in the engine: these methods only
translate.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, TypeVar, cast

from google.protobuf.message import Message as ProtoMessage

from bae.common.errors import NotFound, QuotaExceeded, echo
from bae.common.jsontext import dump, load
from bae.common.limits import Limits
from bae.common.protos import admin_api_pb2, client_api_pb2, edge_pb2, session_pb2
from bae.common.rpc_codes import LAGGED_MESSAGE, RpcCode
from bae.services.session.api.event_messages import EventBatch, event_of_view, in_pieces, view_pieces
from bae.services.session.api.faults import RpcError, RpcFault
from bae.services.session.api.jsonrpc import RpcCall, message_of, require_driver
from bae.services.session.api.pagination import PAGE_PAYLOAD_CHARS, fitting
from bae.services.session.engine.budgets import exhausted
from bae.services.session.engine.domain import CompactRequest, SessionState, TurnOutcome, TurnRequest
from bae.services.session.engine.engine import TurnEngine
from bae.services.session.engine.errors import KeyRevoked, SessionNotOpen
from bae.services.session.engine.feed import Buffer, Item, Lagged, Notice, Watcher
from bae.services.session.engine.ports import Delta, DeltaKind
from bae.services.session.engine.live import LiveSession
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.engine.sandboxes import SessionSandboxes
from bae.services.session.engine.subagent_calls import SessionSubagents
from bae.services.session.store import Store
from bae.services.session.store.events import EventView
from bae.services.session.store.records import SessionRecord

log = logging.getLogger("bae.session.live")

REPLAY_PAGE = 200
# Event text per frame, in characters (at most 4 bytes each): far under the internal plane's 64 MiB message.
FRAME_EVENTS_CHARS = 4 * 1024 * 1024
RESERVED_TOOL = "remote_subagent_status"

T = TypeVar("T")
F = TypeVar("F", bound=ProtoMessage)

LAGGED_ERROR = RpcError(code=RpcCode.APPLICATION_ERROR, message=LAGGED_MESSAGE, id_mode=RpcError.NO_ID)
TurnFrame = client_api_pb2.TurnFrame
CompactionFrame = client_api_pb2.CompactionFrame
SubscriptionFrame = client_api_pb2.SubscriptionFrame
RelayFrame = session_pb2.RelayFrame


class LiveApi:
    def __init__(
        self,
        *,
        store: Store,
        sessions: SessionRegistry,
        turns: TurnEngine,
        sandboxes: SessionSandboxes,
        subagents: SessionSubagents,
        limits: Limits,
    ) -> None:
        self.limits = limits  # the [limits] defaults; a profile's own override them
        self.store = store
        self.sessions = sessions
        self.turns = turns
        self.sandboxes = sandboxes
        self.subagents = subagents

    # -- registration and tools -------------------------------------------------

    async def register_driver(self, call: RpcCall[ProtoMessage]) -> client_api_pb2.RegisterDriverResult:
        call.open_session()
        live = await self.sessions.attach(call.session_id)
        async with live.lock:
            if call.actor in live.drivers:
                return client_api_pb2.RegisterDriverResult(registered=True)
            items: list[tuple[str, dict[str, Any]]] = [("session.driver.register", {})]
            if call.profile is not None and call.profile.available_sandboxes:
                images = self.sandboxes.available_images(call.profile)
                items.append(("session.sandbox.available", {"images": images}))
            await self.sessions.append(call.session_id, call.actor, items)
            live.drivers.add(call.actor)
        return client_api_pb2.RegisterDriverResult(registered=True)

    async def update_client_tools(
        self, call: RpcCall[client_api_pb2.UpdateClientToolsParams]
    ) -> client_api_pb2.UpdateClientToolsResult:
        await require_driver(self.sessions, call, "session.updateClientTools")
        call.open_session()
        normalized = [
            {
                "name": tool.name,
                "description": tool.description if tool.HasField("description") else None,
                "input_schema": load(tool.input_schema.json) if tool.input_schema.json else {},
            }
            for tool in call.params().tools
        ]
        if call.profile is None:
            raise RpcFault(RpcCode.INTERNAL_ERROR, "Internal error")
        for tool in normalized:
            if tool["name"] == RESERVED_TOOL or tool["name"] not in call.profile.allowed_tools:
                raise RpcFault(
                    RpcCode.TOOL_NOT_ALLOWED,
                    f'tool_not_allowed: tool "{echo(tool["name"])}" is not in the profile\'s allowlist',
                )
        await self.store.set_client_tools(call.session_id, call.actor, normalized)
        return client_api_pb2.UpdateClientToolsResult(updated=True)

    # -- subscriptions ----------------------------------------------------------

    async def subscribe(self, call: RpcCall[client_api_pb2.SubscribeParams]) -> AsyncIterator[SubscriptionFrame]:
        """`session.subscribe`, whose live events the gateway takes from its relay (`feed_relay`), joined
        before this call: who observes from which feed position (where a watcher would join), then
        the replay (§6.4), then, with `deltas`, the catch-up of the provider call streaming then."""
        params = call.params()
        since = params.since_event_id if params.HasField("since_event_id") else None
        overrides = call.profile.limits if call.profile is not None else None  # None: the profile was deleted
        limit = self.limits.overridden(overrides).max_subscribers_per_session
        live = await self._attach_observed(call.session)
        async for frame in self._observe(call.session_id, live, call.actor, since, params.deltas, limit, streams=True):
            yield frame

    async def watch(self, request: admin_api_pb2.WatchSessionRequest) -> AsyncIterator[SubscriptionFrame]:
        """The admin port's view of a session: as `session.subscribe`, for a session in any state,
        counted against no limit. Watching changes nothing of the session: with `deltas` it gets the
        deltas of provider calls that stream for a client, but makes no call stream itself (an
        operator's console would otherwise turn every watched call into a streaming one). Raises
        NotFound before the first frame for an unknown session."""
        session = await self.store.get_session(request.session_id)
        if session is None:
            raise NotFound(f"no session {echo(request.session_id)}")
        live = await self._attach_observed(session)
        since = request.since_event_id if request.HasField("since_event_id") else None
        async for frame in self._observe(request.session_id, live, "", since, request.deltas, None, streams=False):
            yield frame

    async def _observe(
        self, session_id: str, live: LiveSession | None, key: str, since: str | None, deltas: bool, limit: int | None,
        *, streams: bool,
    ) -> AsyncIterator[SubscriptionFrame]:
        """An observer of `live` (None: replay only) acting as `key`, counted against `limit` (None: not counted).
        With `deltas` and `streams`, the session's provider calls stream while it watches."""
        if live is None:
            yield SubscriptionFrame(observer=client_api_pb2.Observer(key=key, live=False))
            async for frame in self._replay(session_id, since):
                yield frame
            return
        feed = live.feed
        if limit is not None and not feed.admit_subscriber(limit):
            raise RpcFault(RpcCode.QUOTA_EXCEEDED, QuotaExceeded("max_subscribers_per_session", limit).detail)
        asks_streaming = deltas and streams
        feed.delta_subscribers += asks_streaming
        try:
            # The position and the catch-up at the same moment: the live part starts right after both.
            observer = client_api_pb2.Observer(key=key, live=key not in feed.revoked, position=feed.position)
            catch_up = feed.stream.catch_up() if deltas else []
            yield SubscriptionFrame(observer=observer)
            async for frame in self._replay(session_id, since):
                yield frame
            if catch_up:
                yield SubscriptionFrame(deltas=delta_batch(catch_up))
            # Held open, counted, while the observer watches; the gateway cancels it when it stops.
            yield SubscriptionFrame(replayed=True)
            await feed.until_let_go()
        finally:
            feed.delta_subscribers -= asks_streaming
            if limit is not None:
                feed.leave_subscriber()

    async def feed_relay(self, session_id: str) -> AsyncIterator[RelayFrame]:
        """The session's feed for one gateway's observers: the position it starts after, then every
        event, delta and notice in order, until the session's live state ends; cut off when lagged
        like any watcher. Raises SessionNotOpen before the first frame."""
        live = await self.sessions.attach(session_id)
        feed_relay = live.feed.relay()
        try:
            yield RelayFrame(position=live.feed.position)
            async for frame in relay(feed_relay, relay_frames, RelayFrame(lagged=True)):
                yield frame
        finally:
            live.feed.forget(feed_relay)

    async def _attach_observed(self, session: SessionRecord | None) -> LiveSession | None:
        """The live session a subscription watches; None when it is not open (replay only)."""
        if session is None or session.state != SessionState.OPEN:
            return None
        try:
            return await self.sessions.attach(session.id)
        except SessionNotOpen:
            return None  # closed since the key was checked: replay only

    async def _replay(self, session_id: str, since: str | None) -> AsyncIterator[SubscriptionFrame]:
        """With `since` (an event id): the stored events after it, in pages (the gateway drops the live
        events the replay sent, by id)."""
        if since is None:
            return
        try:
            seq = await self.store.event_seq(session_id, since) or 0
            while True:
                # Pages as the events listing reads them, so a large event never holds many in memory.
                rows = await self.store.list_events(session_id, seq, REPLAY_PAGE + 1, PAGE_PAYLOAD_CHARS)
                page = rows[: fitting(rows[:REPLAY_PAGE], _text_chars)]
                for frame in event_frames((event for _, event in page), SubscriptionFrame):
                    yield frame
                if len(page) == len(rows):
                    break
                seq = page[-1][0]
        except Exception:
            log.exception("replay for %s failed", session_id)
            raise RpcFault(RpcCode.APPLICATION_ERROR, "replay failed", id_mode=RpcError.NULL_ID) from None

    async def unsubscribe(self, call: RpcCall[ProtoMessage]) -> client_api_pb2.UnsubscribeResult:
        live = self.sessions.get(call.session_id)
        if live is not None:
            live.feed.end_subscriptions()
        return client_api_pb2.UnsubscribeResult(unsubscribed=True)

    # -- turns and compaction ----------------------------------------------------

    async def send_message(self, call: RpcCall[client_api_pb2.SendMessageParams]) -> AsyncIterator[TurnFrame]:
        await require_driver(self.sessions, call, "session.sendMessage")
        call.open_session()
        message = message_of(call.params())
        await self._within_budgets(call)
        request = TurnRequest(call.session_id, call.actor, message)
        watcher = Watcher(key=call.actor, deltas=call.params().stream_deltas)
        work = asyncio.ensure_future(
            self.turns.run_turn(request, watcher=watcher, records=(call.session, call.profile))
        )
        async for frame in stream_until_done(watcher, work, TurnFrame):
            yield frame
        if watcher.cut_off:
            return  # lagged or revoked: the stream ends here; the turn itself runs on
        try:
            result = await work
        except KeyRevoked:
            return  # revoked while it queued: recorded nothing, and ends as the key's other streams do
        for frame in result_frames(result):
            yield frame

    async def compact(self, call: RpcCall[client_api_pb2.CompactParams]) -> AsyncIterator[CompactionFrame]:
        await require_driver(self.sessions, call, "session.compact")
        call.open_session()
        params = call.params()
        prompt = params.prompt if params.HasField("prompt") else None
        await self._within_budgets(call)
        request = CompactRequest(call.session_id, call.actor, prompt)
        watcher = Watcher(key=call.actor)
        work = asyncio.ensure_future(self.turns.compact(request, watcher=watcher))
        async for frame in stream_until_done(watcher, work, CompactionFrame):
            yield frame
        if watcher.cut_off:
            return
        try:
            outcome = await work
        except KeyRevoked:
            return  # as for sendMessage: revoked while it queued, it ran nothing
        yield CompactionFrame(result=event_of_view(outcome.completed))

    async def _within_budgets(self, call: RpcCall[Any]) -> None:
        """-32051 before anything is recorded when a budget of the caller is already used up (the
        turn checks again before each of its provider calls)."""
        limits = self.limits.overridden(call.profile.limits if call.profile is not None else None)
        live = self.sessions.get(call.session_id)
        spent = await exhausted(
            self.store, limits, call.session_id, call.actor,
            session_spend=live.spend if live is not None else None, key_spends=self.sessions.key_spends,
        )
        if spent is not None:
            raise RpcFault(RpcCode.BUDGET_EXHAUSTED, spent.message)

    async def cancel_turn(self, call: RpcCall[client_api_pb2.CancelTurnParams]) -> client_api_pb2.CancelTurnResult:
        """Stop the session's running or paused turn: any registered driver may, whoever's turn it is."""
        await require_driver(self.sessions, call, "session.cancelTurn")
        call.params()
        cancelled = await self.turns.cancel_turn(call.session_id, call.actor)
        return client_api_pb2.CancelTurnResult(cancelled=cancelled)

    # -- subagents (§11.5, §11.6) --------------------------------------------------

    async def cancel_subagent(
        self, call: RpcCall[client_api_pb2.CancelSubagentParams]
    ) -> client_api_pb2.CancelSubagentResult:
        live = await require_driver(self.sessions, call, "session.cancelSubagent")
        subagent_id = call.params().subagent_id
        entry = live.subagents.entries.get(subagent_id)
        if entry is None:
            raise RpcFault(
                RpcCode.SUBAGENT_NOT_FOUND, f'subagent_not_found: no tracked subagent "{subagent_id}" for this session'
            )
        was_running = await self.subagents.cancel(live, entry, reason="explicit", actor=call.actor)
        return client_api_pb2.CancelSubagentResult(cancelled=True, subagent_id=subagent_id, was_running=was_running)

    async def report_local_subagent(
        self, call: RpcCall[client_api_pb2.ReportLocalSubagentParams]
    ) -> client_api_pb2.ReportResult:
        await require_driver(self.sessions, call, "session.reportLocalSubagent")
        params = call.params()
        state = params.state
        exit_code = params.exit_code if params.HasField("exit_code") else None
        reason = params.reason if params.HasField("reason") else None
        payload: dict[str, Any] = {
            "dispatch": "local", "subagent_id": params.subagent_id, "harness": params.harness, "model": params.model,
            "detail": params.detail if params.HasField("detail") else None,
        }
        if state == "completed":
            payload["exit_code"] = exit_code
        elif state == "failed":
            payload.update(reason=reason, exit_code=exit_code)
        elif state == "cancelled":
            payload.update(reason=reason, exit_code=None)
        await self.sessions.append(call.session_id, call.actor, [(f"session.subagent.{state}", payload)])
        return client_api_pb2.ReportResult(reported=True)


async def stream_until_done(watcher: Watcher, work: asyncio.Future[T], frame: Callable[..., F]) -> AsyncIterator[F]:
    """Relay `watcher` while `work` runs; ends when both are done, or at once if the watcher lagged.

    If the caller goes away, `work` is cancelled: while it still queues for the
    gate that records nothing; once it holds the gate, the engine runs on.
    """
    # The engine ends the watcher when its work ends; this covers work that fails before it does.
    work.add_done_callback(lambda _: watcher.end())
    try:
        async for batch in relay(watcher, lambda items: feed_frames(items, frame), frame(error=LAGGED_ERROR)):
            yield batch
        if not watcher.cut_off:
            await asyncio.wait({work})
    finally:
        if not work.done():
            work.cancel()


async def relay(buffer: Buffer[Item], frames: Callable[[list[Item]], Iterable[F]], lagged: F) -> AsyncIterator[F]:
    """A watcher's or relay's items as `frames`, until it ends; a lagged one gets `lagged` and ends."""
    while True:
        try:
            items = await buffer.take()
        except Lagged:
            yield lagged
            return
        if items is None:
            return
        for frame in frames(items):
            yield frame


def relay_frames(items: list[EventView | Delta | Notice]) -> Iterator[RelayFrame]:
    """A relay's items as frames, in order: runs of events and of deltas batched, each notice a frame
    of its own."""
    run: list[EventView | Delta] = []
    for item in items:
        if isinstance(item, Notice):
            yield from feed_frames(run, RelayFrame)
            run = []
            if item.revoked_key is None:
                yield RelayFrame(subscriptions_ended=True)
            else:
                yield RelayFrame(revoked_key=item.revoked_key)
        else:
            run.append(item)
    yield from feed_frames(run, RelayFrame)


def feed_frames(items: Iterable[EventView | Delta], frame: Callable[..., F]) -> Iterator[F]:
    """Events and deltas as frames, in order: each run of events as `event_frames` makes it, each run
    of deltas one frame."""
    for is_delta, run in itertools.groupby(items, key=lambda item: isinstance(item, Delta)):
        if is_delta:
            yield frame(deltas=delta_batch(cast(list[Delta], list(run))))
        else:
            yield from event_frames(cast(Iterator[EventView], run), frame)


_DELTA_KINDS = {
    DeltaKind.TEXT: client_api_pb2.DELTA_TEXT,
    DeltaKind.THINKING: client_api_pb2.DELTA_THINKING,
    DeltaKind.TOOL_INPUT: client_api_pb2.DELTA_TOOL_INPUT,
    DeltaKind.RESET: client_api_pb2.DELTA_RESET,
}


def delta_batch(deltas: list[Delta]) -> client_api_pb2.DeltaBatch:
    return client_api_pb2.DeltaBatch(
        deltas=[
            client_api_pb2.Delta(
                request_event_id=delta.request_event_id,
                seq=delta.seq,
                index=delta.index,
                kind=_DELTA_KINDS[delta.kind],
                text=delta.text,
            )
            for delta in deltas
        ]
    )


def result_frames(result: TurnOutcome) -> Iterator[TurnFrame]:
    """A turn's terminal result as session.sendMessage ends with it: the message and the events that
    fit one frame, the others after it (client_api.proto, TurnFrame)."""
    reply = client_api_pb2.Message(
        role=result.message["role"], content=edge_pb2.JsonValue(json=dump(result.message["content"]))
    )
    first = _fitting_frame(result.events)
    events = [event_of_view(view) for view in result.events[:first]]
    yield TurnFrame(
        result=client_api_pb2.SendMessageResult(message=reply, events=events),
        result_continues=first < len(result.events),
    )
    yield from event_frames(result.events[first:], _result_events)


def _text_chars(row: tuple[int, EventView]) -> int:
    return len(row[1].json)


def _result_events(events: EventBatch) -> TurnFrame:
    return TurnFrame(result_events=events)


def _fitting_frame(events: list[EventView]) -> int:
    """How many of a result's first events go in its frame: up to FRAME_EVENTS_CHARS, none in pieces."""
    size = 0
    for count, event in enumerate(events):
        size += len(event.json)
        if size > FRAME_EVENTS_CHARS or in_pieces(event):
            return count
    return len(events)


def event_frames(events: Iterable[EventView], frame: Callable[..., F]) -> Iterator[F]:
    """`events` in as few frames as fit, in order: up to FRAME_EVENTS_CHARS of event text each,
    an event larger than that alone, and one over EVENT_PIECE_CHARS in pieces, a frame each
    (gRPC bounds one message, not a stream)."""
    batch: list[EventView] = []
    size = 0
    for event in events:
        if batch and (size + len(event.json) > FRAME_EVENTS_CHARS or in_pieces(event)):
            yield frame(events=EventBatch(events=[event_of_view(view) for view in batch]))
            batch, size = [], 0
        if in_pieces(event):
            pieces = view_pieces(event)
            piece = next(pieces)
            for after in pieces:
                yield frame(events=EventBatch(events=[piece], continued=True))
                piece = after
            yield frame(events=EventBatch(events=[piece]))
            continue
        batch.append(event)
        size += len(event.json)
    if batch:
        yield frame(events=EventBatch(events=[event_of_view(view) for view in batch]))
