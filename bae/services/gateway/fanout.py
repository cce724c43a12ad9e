"""Live events for `session.subscribe` observers: one relay per session per gateway, copied here.

The session service sends each event of a session once to each gateway that
has observers of it (its `Relay` stream), not once per observer. An observer
joins its session's relay before it asks for its replay, and the session
service answers with the feed position it joined at: the observer gets what
comes after that position, as a watcher joining the feed in the session
service would (SERVER-SPEC §6.4). Word that streams end, a revoked key or
`session.unsubscribe`, travels in the relay's order, so no event published
after it reaches a stream it ended. Each observer has its own bounded queue:
a slow one is cut off as lagged and never slows the others. An event that
comes in pieces (client_api.proto, EventBatch) is made whole first: each
observer gets its line whole, at its place. Deltas travel in the relay too, one
position each, and are queued only for the observers that asked for them; an
entry's lines are made once per wire (NDJSON, Server-Sent Events) that asks.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from typing import AsyncIterator

import grpc

from bae.common.jsontext import dump
from bae.common.protos import client_api_pb2, session_pb2
from bae.services.gateway.frames import NDJSON_WIRE, Wire, whole
from bae.services.gateway.upstream import Upstream

log = logging.getLogger("bae.gateway")

# Events (and notices) an observer may have queued, as the session service's per-watcher buffer (§6.4).
LAG_LIMIT = 256
KEEPALIVE = b": keepalive\n\n"


class Ending(enum.Enum):
    CLEAN = "clean"  # the session's live state ended, its streams were ended, or the gateway is stopping
    LAGGED = "lagged"  # the observer, or the whole relay, fell too far behind
    FAILED = "failed"  # the relay broke: the session replica went away


PROVIDER_REQUEST = "provider.request"
PROVIDER_RESPONSE = "provider.response"


class ReplayedCalls:
    """What an observer's replay told of the session's provider calls, which run one at a time: once
    it sent a `provider.response`, every call is over but those whose `provider.request` it sent
    after that. A delta of a call that is over is stale (the response holds it all)."""

    def __init__(self) -> None:
        self._responded = False
        self._open: set[str] = set()

    def saw(self, event: client_api_pb2.Event) -> None:
        if event.event_type == PROVIDER_REQUEST:
            self._open.add(event.id)
        elif event.event_type == PROVIDER_RESPONSE:
            self._responded = True
            self._open.clear()

    def over(self, request_event_id: str) -> bool:
        return self._responded and request_event_id not in self._open


class _Entry:
    """One relay frame as observers queue it: its first item's position, how many positions it
    takes, the ids it names (its events', or its deltas' request events'), and its lines in each
    wire that asked, made once."""

    __slots__ = ("position", "frame", "deltas", "ids", "count", "_lines")

    def __init__(self, position: int, frame: session_pb2.RelayFrame) -> None:
        self.position = position
        self.frame = frame
        kind = frame.WhichOneof("kind")
        self.deltas = kind == "deltas"
        if kind == "events":
            self.ids = [event.id for event in frame.events.events]
        elif self.deltas:
            self.ids = [delta.request_event_id for delta in frame.deltas.deltas]
        else:
            self.ids = []
        self.count = len(self.ids) or 1
        self._lines: dict[Wire, list[bytes]] = {}

    def lines(self, wire: Wire, session_id_json: str) -> list[bytes]:
        lines = self._lines.get(wire)
        if lines is None:
            if self.deltas:
                lines = [wire.delta(session_id_json, delta) for delta in self.frame.deltas.deltas]
            else:
                lines = [wire.event(event) for event in self.frame.events.events] if self.ids else []
            self._lines[wire] = lines
        return lines


class Observer:
    """One `session.subscribe` stream's share of its session's relay, written in `wire`; with
    `deltas` it is queued the deltas too."""

    def __init__(self, session_id: str, *, wire: Wire = NDJSON_WIRE, deltas: bool = False) -> None:
        self.session_id_json = dump(session_id)
        self.wire = wire
        self.deltas = deltas
        self._entries: deque[_Entry] = deque()
        self._queued = 0  # events, deltas and notices in `_entries`
        self._ready = asyncio.Event()
        self.ending: Ending | None = None
        # Set from the session service's `observer` frame before the live part is read.
        self.key = ""
        self.after = 0

    def push(self, entry: _Entry) -> None:
        if self.ending is not None or (entry.deltas and not self.deltas):
            return
        if self._queued >= LAG_LIMIT:
            self.finish(Ending.LAGGED)
            return
        self._entries.append(entry)
        self._queued += entry.count
        self._ready.set()

    def finish(self, ending: Ending) -> None:
        if self.ending is None:
            self.ending = ending
        self._ready.set()

    def admit(self, observer: client_api_pb2.Observer) -> None:
        self.key, self.after = observer.key, observer.position
        if not observer.live:  # the replay is all it gets
            self._entries.clear()
            self.finish(Ending.CLEAN)

    async def lines(
        self, replayed: set[str], calls: ReplayedCalls, *, keepalive: float | None = None
    ) -> AsyncIterator[bytes]:
        """The lines of what comes after this observer's position, less the events the replay sent
        and the deltas of the calls it showed over, until its stream ends (`ending` says how). With
        `keepalive`, a Server-Sent Events comment whenever that many seconds pass without a line."""
        while True:
            if self.ending is Ending.LAGGED:
                return  # what is queued is not sent: the lagged error follows at once (§6.4)
            if not self._entries:
                if self.ending is not None:
                    return
                self._ready.clear()
                try:
                    async with asyncio.timeout(keepalive):
                        await self._ready.wait()
                except TimeoutError:
                    yield KEEPALIVE
                continue
            entries = list(self._entries)
            self._entries.clear()
            self._queued = 0
            out: list[bytes] = []
            for entry in entries:
                frame = entry.frame
                if entry.ids:
                    lines = entry.lines(self.wire, self.session_id_json)
                    for offset, (named, line) in enumerate(zip(entry.ids, lines)):
                        if entry.position + offset > self.after and not (
                            calls.over(named) if entry.deltas else named in replayed
                        ):
                            out.append(line)
                elif entry.position > self.after and (
                    frame.subscriptions_ended or frame.revoked_key == self.key
                ):
                    self.finish(Ending.CLEAN)
                    self._entries.clear()
                    break
            if out:
                yield b"".join(out)


class _Relay:
    """One session's Relay stream and the observers it feeds; it ends with its last observer."""

    def __init__(self, session_id: str, fanout: Fanout) -> None:
        self.session_id = session_id
        self.fanout = fanout
        self.observers: set[Observer] = set()
        # True once the stream is open, False when the session is not open; or the call's error.
        self.opened: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self._run(), name=f"relay:{session_id}")

    async def _run(self) -> None:
        ending = Ending.CLEAN
        call = None
        try:
            opened = await self._open()
            if opened is None:
                return
            call, position = opened
            self.opened.set_result(True)
            pieces: list[client_api_pb2.EventBatch] = []  # the batches of an event in pieces, so far
            while (frame := await call.read()) is not grpc.aio.EOF:
                kind = frame.WhichOneof("kind")
                if kind == "lagged":  # the relay itself lagged in the session service
                    ending = Ending.LAGGED
                    return
                if kind == "events" and (pieces or frame.events.continued):
                    pieces.append(frame.events)
                    if frame.events.continued:
                        continue
                    frame, pieces = session_pb2.RelayFrame(events=whole(pieces)), []
                entry = _Entry(position + 1, frame)
                position += entry.count
                for observer in list(self.observers):
                    observer.push(entry)
        except grpc.aio.AioRpcError as error:
            if not self.opened.done():
                self.opened.set_exception(error)
                return
            log.warning("relay of session %s failed: %s %s", self.session_id, error.code().name, error.details())
            ending = Ending.FAILED
        finally:
            if call is not None:
                call.cancel()
            if not self.opened.done():
                self.opened.cancel()
            self.fanout.forget(self)
            for observer in self.observers:
                observer.finish(ending)

    async def _open(self) -> tuple[grpc.aio.UnaryStreamCall, int] | None:
        """The open Relay call and the position it starts after; None when the session is not open."""
        request = session_pb2.RelayRequest(session_id=self.session_id)
        try:
            call, first = await self.fanout.upstream.open_stream(self.session_id, "Relay", request)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            self.opened.set_result(False)  # not open: its observers get their replay only
            return None
        if not isinstance(first, session_pb2.RelayFrame):  # EOF: torn down as it opened
            self.opened.set_result(False)
            return None
        return call, first.position


class Fanout:
    """The relays of the sessions this gateway's observers watch."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._relays: dict[str, _Relay] = {}

    async def join(self, session_id: str, *, wire: Wire = NDJSON_WIRE, deltas: bool = False) -> Observer | None:
        """An observer of the session's relay, queueing from now on; None when the session is not
        open. Raises the relay's gRPC error when it cannot be opened."""
        relay = self._relays.get(session_id)
        if relay is None:
            relay = self._relays[session_id] = _Relay(session_id, self)
        observer = Observer(session_id, wire=wire, deltas=deltas)
        relay.observers.add(observer)
        try:
            live = await asyncio.shield(relay.opened)
        except BaseException:
            self.leave(session_id, observer)
            raise
        if not live:
            self.leave(session_id, observer)
            return None
        return observer

    def leave(self, session_id: str, observer: Observer) -> None:
        relay = self._relays.get(session_id)
        if relay is None or observer not in relay.observers:
            return
        relay.observers.discard(observer)
        if not relay.observers:
            self.forget(relay)
            relay.task.cancel()

    def forget(self, relay: _Relay) -> None:
        if self._relays.get(relay.session_id) is relay:
            del self._relays[relay.session_id]

    async def close(self) -> None:
        relays = list(self._relays.values())
        for relay in relays:
            relay.task.cancel()
        await asyncio.gather(*(relay.task for relay in relays), return_exceptions=True)
