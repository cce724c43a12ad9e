"""Live fan-out of a session's events to its watchers.

Every event is persisted before it is published here. Each watcher has its
own bounded buffer, so a slow one never slows the turn or the others: one
that has not come back for `LAG_LIMIT` queued items when more arrive is cut
off with the `lagged` error. Lag is judged per published batch, and a reader
takes everything queued at once: a batch is committed and published before
any reader can run, so a reader that keeps coming back receives it whole,
however large it is.

A gateway fans a session's events out to its own `session.subscribe`
observers from one `Relay` per session: the feed counts every event, delta and
notice it carries (its position), so an observer that joins at a position
gets exactly what a watcher joining here would have got.

Deltas (a provider call's output as it streams) travel with the events, in
order, to the watchers and observers that asked for them; they are never
stored. The feed keeps what the call streaming now has streamed so far
(`CallStream`), so that an observer joining mid-call catches up with it: one
delta per content block, as of the position it joins at.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from bae.common.jsontext import JsonObject
from bae.services.session.engine.ports import Delta, DeltaKind
from bae.services.session.store.events import EventView

LAG_LIMIT = 256
PROVIDER_RESPONSE = "provider.response"

Item = TypeVar("Item")


class Lagged(Exception):
    """The watcher fell too far behind; its stream must end."""


@dataclass(eq=False)
class Buffer(Generic[Item]):
    """A reader's bounded queue: it ends, or is cut off as lagged, and takes everything queued at once."""

    _items: deque[Item] = field(default_factory=deque, init=False)
    _ready: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _ended: bool = field(default=False, init=False)
    _lagged: bool = field(default=False, init=False)

    def push(self, *items: Item) -> None:
        """Queue one published batch, unless this reader has fallen behind."""
        if self._ended:
            return
        if len(self._items) >= LAG_LIMIT:
            self._lagged = True
            self._ended = True
        else:
            self._items.extend(items)
        self._ready.set()

    @property
    def lagged(self) -> bool:
        return self._lagged

    def end(self) -> None:
        self._ended = True
        self._ready.set()

    async def take(self) -> list[Item] | None:
        """Every queued item (waits for one), None once ended; raises Lagged when cut off."""
        while True:
            if self._lagged:
                raise Lagged
            if self._items:
                items = list(self._items)
                self._items.clear()
                return items
            if self._ended:
                return None
            self._ready.clear()
            await self._ready.wait()


@dataclass(eq=False)
class Watcher(Buffer[EventView | Delta]):
    """A live stream of the session's own (a sendMessage's or a compact's caller)."""

    # The client key whose stream this is (ended if that key is revoked); None for internal watchers.
    key: str | None = None
    # The caller asked for deltas (`stream_deltas`).
    deltas: bool = False
    # Event ids this watcher must not be sent (a sendMessage stream's own input echo).
    echo_ids: set[str] = field(default_factory=set)
    _revoked: bool = False
    # Called once if the caller behind this watcher goes away while its work runs on.
    on_leave: Callable[[], None] | None = None
    _left: bool = False

    @property
    def cut_off(self) -> bool:
        """Ended before its work did (lagged, or its key was revoked): no terminal frame follows."""
        return self._lagged or self._revoked

    def leave(self) -> None:
        """The caller went away (its work runs on in the engine)."""
        if not self._left:
            self._left = True
            if self.on_leave is not None:
                self.on_leave()

    def when_left(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the caller goes away; now, if it already has."""
        self.on_leave = callback
        if self._left:
            callback()

    def revoke(self) -> None:
        """The watcher's key was revoked: its stream ends now."""
        self._revoked = True
        self.end()

    def wants(self, event: JsonObject) -> bool:
        """The one live-filter predicate (SERVER-SPEC §6.4): suppress only this stream's own echo."""
        return event["id"] not in self.echo_ids


@dataclass(frozen=True)
class Notice:
    """A relay's word that streams end: one client key's (`revoked_key`), or every subscription's (None)."""

    revoked_key: str | None = None


class Relay(Buffer[EventView | Delta | Notice]):
    """A gateway's copy of the feed: every event, delta and notice, in order, one position each."""


@dataclass
class _Block:
    kind: DeltaKind
    texts: list[str]
    seq: int  # the last one added


@dataclass
class CallStream:
    """What the provider call streaming now has streamed, per content block; emptied when its
    `provider.response` is published (that event holds it all) or it resets."""

    request_event_id: str = ""
    _blocks: dict[int, _Block] = field(default_factory=dict)

    def add(self, deltas: Sequence[Delta]) -> None:
        for delta in deltas:
            if delta.request_event_id != self.request_event_id:
                self.request_event_id = delta.request_event_id
                self._blocks.clear()
            if delta.kind is DeltaKind.RESET:
                self._blocks.clear()
                continue
            block = self._blocks.get(delta.index)
            if block is None:
                self._blocks[delta.index] = _Block(delta.kind, [delta.text], delta.seq)
            else:
                block.texts.append(delta.text)
                block.seq = delta.seq

    def catch_up(self) -> list[Delta]:
        """One delta per content block, holding everything streamed so far; its seq the last one included."""
        return [
            Delta(self.request_event_id, block.seq, index, block.kind, "".join(block.texts))
            for index, block in sorted(self._blocks.items())
        ]

    def clear(self) -> None:
        self._blocks.clear()


@dataclass
class SessionFeed:
    watchers: set[Watcher] = field(default_factory=set)
    # Client keys revoked while the session was live: a stream of theirs that joins late ends at once.
    revoked: set[str] = field(default_factory=set)
    relays: set[Relay] = field(default_factory=set)
    # How many events and notices this feed has carried: where a relay or an observer joins.
    position: int = 0
    # `session.subscribe` calls held open while their observers watch (max_subscribers_per_session).
    subscribers: int = 0
    # Of those (and of the admin port's watchers), the ones that asked for deltas.
    delta_subscribers: int = 0
    stream: CallStream = field(default_factory=CallStream)
    _let_go: asyncio.Event = field(default_factory=asyncio.Event)

    def join(self, watcher: Watcher) -> None:
        """Send `watcher` the session's events from now on (unless its key was revoked meanwhile)."""
        if watcher.key is not None and watcher.key in self.revoked:
            watcher.revoke()
        else:
            self.watchers.add(watcher)

    def relay(self) -> Relay:
        """A relay of everything from now on, which starts after `position`."""
        relay = Relay()
        self.relays.add(relay)
        return relay

    def forget(self, watcher: Watcher | Relay) -> None:
        if isinstance(watcher, Relay):
            self.relays.discard(watcher)
        else:
            self.watchers.discard(watcher)
        watcher.end()

    def publish(self, events: Sequence[EventView]) -> None:
        self.position += len(events)
        if any(event["event_type"] == PROVIDER_RESPONSE for event in events):
            self.stream.clear()
        # The callers' own streams first: their tasks wake first, so a turn's answer is on its way
        # before the observers' copies (watching a session must not slow its turns).
        for watcher in list(self.watchers):
            wanted = [event for event in events if watcher.wants(event)]
            if wanted:
                watcher.push(*wanted)
        for relay in list(self.relays):
            relay.push(*events)

    def publish_deltas(self, deltas: Sequence[Delta]) -> None:
        self.position += len(deltas)
        self.stream.add(deltas)
        for watcher in list(self.watchers):
            if watcher.deltas:
                watcher.push(*deltas)
        for relay in list(self.relays):
            relay.push(*deltas)

    def wants_deltas(self) -> bool:
        """Whether someone listens for deltas: a subscriber, or a caller whose work runs now."""
        return self.delta_subscribers > 0 or any(watcher.deltas for watcher in self.watchers)

    def end_subscriptions(self) -> None:
        """`session.unsubscribe`: the gateways end their observers' streams."""
        self._notify(Notice())

    def end_streams_of(self, key: str) -> None:
        self.revoked.add(key)
        for watcher in [w for w in self.watchers if w.key == key]:
            watcher.revoke()
            self.forget(watcher)
        self._notify(Notice(revoked_key=key))

    def _notify(self, notice: Notice) -> None:
        self.position += 1
        for relay in list(self.relays):
            relay.push(notice)

    def admit_subscriber(self, limit: int) -> bool:
        """Count one more subscriber, unless `limit` are counted already."""
        if self.subscribers >= limit:
            return False
        self.subscribers += 1
        return True

    def leave_subscriber(self) -> None:
        self.subscribers -= 1

    async def until_let_go(self) -> None:
        """Until the feed lets go of its subscribers' calls: it closes, or the replica drains."""
        await self._let_go.wait()

    def let_go(self) -> None:
        self._let_go.set()

    def close(self) -> None:
        self.let_go()
        for relay in list(self.relays):
            self.forget(relay)
        for watcher in list(self.watchers):
            self.forget(watcher)
