"""Events as every API shows them (SERVER-SPEC §13.1): typed `Event` messages whose payload is the
stored JSON text, never parsed or written again here.

No event is too large to be read: one whose text is over EVENT_PIECE_CHARS crosses the internal
plane in pieces (client_api.proto, EventBatch; session.proto, ListEvents), each a slice of the
stored text, so neither end ever holds it in one message.
"""

from __future__ import annotations

from typing import Iterator

from bae.common.protos import client_api_pb2, edge_pb2
from bae.services.session.store.events import EventRow, EventView

Event = client_api_pb2.Event
EventBatch = client_api_pb2.EventBatch

_PAYLOAD = ',"payload":'
_CREATED_AT = ',"created_at":'

# Payload text per piece, in characters (at most 4 bytes each): 16 pieces in flight (a streaming
# call's window) stay a few MiB.
EVENT_PIECE_CHARS = 1024 * 1024


def event_of_row(row: EventRow, payload: str | None = None) -> client_api_pb2.Event:
    """The row's event; with `payload`, that text in place of the stored one (a first piece)."""
    return Event(
        id=row.id,
        session_id=row.session_id,
        client_key_id=row.client_key_id,
        event_type=row.event_type,
        payload=edge_pb2.JsonValue(json=row.payload if payload is None else payload),
        created_at=row.created_at,
    )


def _payload_bounds(view: EventView) -> tuple[int, int]:
    # The view's wire text holds the payload as stored, between two keys the server wrote:
    # every field before it is an id or a type, and `created_at` follows it.
    text = view.json
    return text.index(_PAYLOAD) + len(_PAYLOAD), text.rindex(_CREATED_AT)


def event_of_view(view: EventView) -> client_api_pb2.Event:
    start, end = _payload_bounds(view)
    return _event_of_view(view, view.json[start:end])


def _event_of_view(view: EventView, payload: str) -> client_api_pb2.Event:
    return Event(
        id=view["id"],
        session_id=view["session_id"],
        client_key_id=view["client_key_id"],
        event_type=view["event_type"],
        payload=edge_pb2.JsonValue(json=payload),
        created_at=view["created_at"],
    )


def in_pieces(view: EventView) -> bool:
    """Whether the event crosses the internal plane in pieces (its text is over EVENT_PIECE_CHARS)."""
    return len(view.json) > EVENT_PIECE_CHARS


def view_pieces(view: EventView) -> Iterator[client_api_pb2.Event]:
    """The event in pieces: itself with the first piece of its payload text, then an Event with
    only `payload` for each next piece."""
    start, end = _payload_bounds(view)
    pieces = _pieces(view.json, start, end)
    yield _event_of_view(view, next(pieces))
    for piece in pieces:
        yield Event(payload=edge_pb2.JsonValue(json=piece))


def row_pieces(row: EventRow) -> Iterator[client_api_pb2.Event]:
    """`view_pieces` of a stored event row."""
    pieces = _pieces(row.payload, 0, len(row.payload))
    yield event_of_row(row, next(pieces))
    for piece in pieces:
        yield Event(payload=edge_pb2.JsonValue(json=piece))


def _pieces(text: str, start: int, end: int) -> Iterator[str]:
    """text[start:end] in slices of EVENT_PIECE_CHARS, made one at a time."""
    for offset in range(start, end, EVENT_PIECE_CHARS):
        yield text[offset: min(offset + EVENT_PIECE_CHARS, end)]


def payload_chars(row: EventRow) -> int:
    """What a stored event counts for in a page's budget: its payload text's length."""
    return len(row.payload)


def page_messages(rows: list[EventRow], next_cursor: str | None) -> Iterator[client_api_pb2.EventPage]:
    """A page of events as its call's messages (session.proto, ListEvents): the page, with its last
    item's payload only begun when that is over EVENT_PIECE_CHARS, then one message per next piece."""
    if not rows or len(rows[-1].payload) <= EVENT_PIECE_CHARS:
        yield client_api_pb2.EventPage(items=[event_of_row(row) for row in rows], next_cursor=next_cursor)
        return
    pieces = row_pieces(rows[-1])
    items = [*(event_of_row(row) for row in rows[:-1]), next(pieces)]
    yield client_api_pb2.EventPage(items=items, next_cursor=next_cursor)
    for piece in pieces:
        yield client_api_pb2.EventPage(items=[piece])
