"""Provider requests stored by reference, so a session's storage grows with its length, not its square.

A `provider.request` event holds the whole message list its provider call sent: kept as it
came, n turns would store n histories. Instead each message text of a session's requests is
stored once, in `request_messages`, numbered 1, 2, ... per session in the order first stored
(its ordinal). The event row keeps its payload with the `messages` array's text cut out
(`payload`), the offset of the cut (`messages_at`), and the ordinals the array held, as runs of
consecutive numbers (`messages_runs`, JSON `[[first, last], ...]`).

A request shares with the session's previous one the longest common prefix of their message
lists (between turns the history only grows), so only the messages after that prefix are new,
and its runs are usually one: a turn stores a constant number of bytes. A compaction, or a
request normalized differently from the previous one, stores its messages afresh once.

Reading splices the array back in: `payload[:at] + "[" + ",".join(texts) + "]" + payload[at:]`.
That is the exact text that was appended: the writer checks it before storing a request by
reference, and stores any payload that would not come back byte for byte (or has no `messages`
array) whole, as every payload was before (revision 0006 converted those).
"""

from __future__ import annotations

import itertools
import operator
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple

from sqlalchemy import Connection, and_, bindparam, delete, func, insert, select

from bae.common.jsontext import RawJson, dump, load
from bae.services.session.store.schema import request_messages, session_events, utf8_bytes

PROVIDER_REQUEST = "provider.request"
_MESSAGES_KEY = '"messages":'

# What PreviousRequests holds of all sessions' last requests: message text in characters.
REMEMBERED_CHARS = 64 * 1024 * 1024


@dataclass(frozen=True)
class RequestJson(RawJson):
    """A provider.request payload whose `messages` array is known element by element: `text[at:]`
    begins with "[" + ",".join(messages) + "]". The runner client builds it from the history's
    own message texts, so the writer neither parses the payload nor writes the messages again."""

    messages: tuple[str, ...] = ()
    at: int = 0


class Split(NamedTuple):
    """A payload text, apart: `head + "[" + ",".join(texts) + "]" + tail`."""

    head: str
    tail: str
    texts: list[str]


def split(payload: dict[str, Any] | RawJson, text: str) -> Split | None:
    """`text` (the payload's wire text) with its `messages` array apart, or None when it has no such
    array, or one that would not come back byte for byte."""
    if isinstance(payload, RequestJson):
        texts = list(payload.messages)
        at = payload.at
    else:
        # A request the runner normalized (or one written before this module) carries its messages
        # inside its text: read them, and find the array by its key (a nested "messages" key lies
        # inside the array, so the last occurrence with the whole array after it is the top-level one).
        try:
            messages = load(text).get("messages")
        except (ValueError, AttributeError):
            return None
        if not isinstance(messages, list):
            return None
        texts = [dump(message) for message in messages]
        array = "[" + ",".join(texts) + "]"
        key = text.rfind(_MESSAGES_KEY + array)
        if key < 0:
            return None
        at = key + len(_MESSAGES_KEY)
    end = at + 2 + sum(map(len, texts)) + max(len(texts) - 1, 0)
    parts = Split(text[:at], text[end:], texts)
    # A RequestJson is that text by construction; a request read from its text is checked.
    if not isinstance(payload, RequestJson) and joined(parts) != text:
        return None
    return parts


def joined(parts: Split) -> str:
    return parts.head + "[" + ",".join(parts.texts) + "]" + parts.tail


class Last(NamedTuple):
    """A session's newest event: its number and id (an id is never made twice)."""

    seq: int
    event_id: str


@dataclass
class _Known:
    """A session's last request as stored: its message texts, the runs of ordinals they are, and the
    session's highest ordinal; `last` is the session's newest event after this store's last append
    to it, which says whether anything else was written since."""

    texts: list[str]
    runs: list[list[int]]
    newest_ordinal: int
    chars: int
    last: Last | None = None


class PreviousRequests:
    """Each session's last stored request, so the next one finds its shared prefix without reading
    the store. Held per Store, bounded by REMEMBERED_CHARS (least recently written dropped first).

    An entry is used only while the session's newest event in the database is the one this store
    appended last: an append by another writer (another replica), or one of ours rolled back,
    makes it stale, and the request is read back from the store instead."""

    def __init__(self, max_chars: int = REMEMBERED_CHARS) -> None:
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._chars = 0
        self._max_chars = max_chars

    def check(self, session_id: str, last: Last | None) -> None:
        """Before an append: forget the session's entry unless `last` (its newest event now) is ours."""
        known = self._known.get(session_id)
        if known is not None and known.last != last:
            self.forget(session_id)

    def appended(self, session_id: str, last: Last) -> None:
        """After an append (not yet committed: a rollback leaves `last` ahead of the database)."""
        known = self._known.get(session_id)
        if known is not None:
            known.last = last

    def get(self, session_id: str) -> _Known | None:
        known = self._known.get(session_id)
        if known is not None:
            self._known.move_to_end(session_id)
        return known

    def put(self, session_id: str, known: _Known) -> None:
        self.forget(session_id)
        self._known[session_id] = known
        self._chars += known.chars
        while self._chars > self._max_chars and len(self._known) > 1:
            _, dropped = self._known.popitem(last=False)
            self._chars -= dropped.chars

    def forget(self, session_id: str) -> None:
        known = self._known.pop(session_id, None)
        if known is not None:
            self._chars -= known.chars


_NEWEST_ORDINAL = select(func.coalesce(func.max(request_messages.c.ordinal), 0)).where(
    request_messages.c.session_id == bindparam("session_id")
)
_NEWEST_RUNS = (
    select(session_events.c.messages_runs)
    .where(
        and_(
            session_events.c.session_id == bindparam("session_id"),
            session_events.c.event_type == PROVIDER_REQUEST,
            session_events.c.messages_runs.is_not(None),
        )
    )
    .order_by(session_events.c.seq.desc())
    .limit(1)
)
_TEXTS = (
    select(request_messages.c.ordinal, request_messages.c.text)
    .where(
        and_(
            request_messages.c.session_id == bindparam("session_id"),
            request_messages.c.ordinal >= bindparam("first"),
            request_messages.c.ordinal <= bindparam("last"),
        )
    )
    .order_by(request_messages.c.ordinal)
)
_INSERT = insert(request_messages)


class Stored(NamedTuple):
    """What an event row holds of its payload: a request stored by reference has `messages_at` and
    `messages_runs`; any other payload is its text whole, with both None."""

    payload: str
    messages_at: int | None = None
    messages_runs: str | None = None


def stored(
    conn: Connection,
    session_id: str,
    event_type: str,
    payload: dict[str, Any] | RawJson,
    text: str,
    previous: PreviousRequests | None,
) -> Stored:
    """How an event's payload (`text`, its wire text) is stored: a provider request by reference
    where it comes back byte for byte, anything else whole."""
    parts = split(payload, text) if event_type == PROVIDER_REQUEST else None
    return Stored(text) if parts is None else store(conn, session_id, parts, previous)


def store(conn: Connection, session_id: str, parts: Split, previous: PreviousRequests | None) -> Stored:
    """Write the request's new messages and say what its event row holds (in the caller's transaction;
    `previous` was checked against the session's newest event at its start)."""
    known = previous.get(session_id) if previous is not None else None
    if known is None:
        known = _read_newest(conn, session_id)
    shared = common_prefix(known.texts, parts.texts)
    new = parts.texts[shared:]
    first = known.newest_ordinal + 1
    if new:
        conn.execute(
            _INSERT, [{"session_id": session_id, "ordinal": first + i, "text": text} for i, text in enumerate(new)]
        )
    spans = _prefix(known.runs, shared)
    if new:
        if spans and spans[-1][1] + 1 == first:
            spans[-1][1] = first + len(new) - 1
        else:
            spans.append([first, first + len(new) - 1])
    if previous is not None:
        previous.put(session_id, _Known(parts.texts, spans, first + len(new) - 1, sum(map(len, parts.texts))))
    return Stored(parts.head + parts.tail, len(parts.head), dump(spans))


def common_prefix(old: list[str], new: list[str]) -> int:
    # Usually the new list extends the old one: one comparison of the lists, element by element in C
    # (an element that is the same string object compares at once).
    if len(old) <= len(new) and new[: len(old)] == old:
        return len(old)
    return sum(1 for _ in itertools.takewhile(bool, map(operator.eq, old, new)))


def _prefix(spans: list[list[int]], count: int) -> list[list[int]]:
    """The runs of the first `count` ordinals of `spans` (new lists: the remembered runs stay as they are)."""
    taken: list[list[int]] = []
    for first, last in spans:
        if count <= 0:
            break
        end = min(last, first + count - 1)
        taken.append([first, end])
        count -= end - first + 1
    return taken


def _read_newest(conn: Connection, session_id: str) -> _Known:
    """The session's newest request stored by reference, read back; empty when there is none."""
    newest_ordinal = conn.execute(_NEWEST_ORDINAL, {"session_id": session_id}).scalar_one()
    runs_text = conn.execute(_NEWEST_RUNS, {"session_id": session_id}).scalar()
    if runs_text is None:
        return _Known([], [], newest_ordinal, 0)
    spans = load(runs_text)
    message_texts = Texts(conn, session_id).of(spans)
    return _Known(message_texts, spans, newest_ordinal, sum(map(len, message_texts)))


def runs(ordinals: Iterable[int]) -> list[list[int]]:
    """[3, 4, 5, 9] -> [[3, 5], [9, 9]]."""
    spans: list[list[int]] = []
    for ordinal in ordinals:
        if spans and spans[-1][1] + 1 == ordinal:
            spans[-1][1] = ordinal
        else:
            spans.append([ordinal, ordinal])
    return spans


class Texts:
    """One session's stored message texts, read as a page of events needs them: each ordinal once,
    so the requests of a page (which share most of their messages) cost one read each of what
    they add, and each request's array is the previous one's text plus what it adds."""

    def __init__(self, conn: Connection, session_id: str) -> None:
        self._conn = conn
        self._session_id = session_id
        self._texts: dict[int, str] = {}
        self._last: tuple[list[list[int]], str] | None = None  # the previous request's runs and array

    def of(self, spans: list[list[int]]) -> list[str]:
        for first, last in spans:
            self._load(first, last)
        return [self._texts[ordinal] for first, last in spans for ordinal in range(first, last + 1)]

    def _load(self, first: int, last: int) -> None:
        # Texts are loaded in whole spans, so an ordinal present means its span was read: only the
        # ends are looked up (a missing middle is read with its span).
        while first <= last and first in self._texts:
            first += 1
        while last >= first and last in self._texts:
            last -= 1
        if first > last:
            return
        rows = self._conn.execute(_TEXTS, {"session_id": self._session_id, "first": first, "last": last})
        self._texts.update({ordinal: text for ordinal, text in rows})

    def payload(self, stored: str, at: int, runs_text: str) -> str:
        """The request's payload text as it was appended."""
        return stored[:at] + self._array(load(runs_text)) + stored[at:]

    def _array(self, spans: list[list[int]]) -> str:
        added = _extension(self._last[0], spans) if self._last is not None else None
        if self._last is None or added is None:
            array = "[" + ",".join(self.of(spans)) + "]"
        else:
            texts, previous = self.of(added), self._last[1]
            if not texts:
                array = previous
            else:
                array = ("[" if previous == "[]" else previous[:-1] + ",") + ",".join(texts) + "]"
        self._last = (spans, array)
        return array


def _extension(old: list[list[int]], new: list[list[int]]) -> list[list[int]] | None:
    """The runs `new` holds after all of `old`'s ordinals, when those begin it; else None."""
    if not old:
        return new
    k = len(old) - 1
    if len(new) <= k or new[:k] != old[:k] or new[k][0] != old[k][0] or new[k][1] < old[k][1]:
        return None
    grown = [[old[k][1] + 1, new[k][1]]] if new[k][1] > old[k][1] else []
    return grown + new[k + 1:]


def delete_session(conn: Connection, session_id: str) -> int:
    """Delete a session's request messages (its events are gone first); returns their bytes (UTF-8)."""
    mine = request_messages.c.session_id == session_id
    size = conn.execute(
        select(func.coalesce(func.sum(utf8_bytes(conn, request_messages.c.text)), 0)).where(mine)
    ).scalar_one()
    conn.execute(delete(request_messages).where(mine))
    return int(size)
