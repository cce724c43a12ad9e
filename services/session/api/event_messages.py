"""Events as every API shows them (SERVER-SPEC §13.1): typed `Event` messages whose payload is the
stored JSON text, never parsed or written again here."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row

from bae.common.protos import client_api_pb2, edge_pb2
from services.session.store.events import EventView

Event = client_api_pb2.Event
EventBatch = client_api_pb2.EventBatch

_PAYLOAD = ',"payload":'
_CREATED_AT = ',"created_at":'


def event_of_row(row: Row[Any]) -> client_api_pb2.Event:
    return Event(
        id=row.id,
        session_id=row.session_id,
        client_key_id=row.client_key_id,
        event_type=row.event_type,
        payload=edge_pb2.JsonValue(json=row.payload),
        created_at=row.created_at,
    )


def event_of_view(view: EventView) -> client_api_pb2.Event:
    # The view's wire text holds the payload as stored, between two keys the server wrote:
    # every field before it is an id or a type, and `created_at` follows it.
    text = view.json
    payload = text[text.index(_PAYLOAD) + len(_PAYLOAD): text.rindex(_CREATED_AT)]
    return Event(
        id=view["id"],
        session_id=view["session_id"],
        client_key_id=view["client_key_id"],
        event_type=view["event_type"],
        payload=edge_pb2.JsonValue(json=payload),
        created_at=view["created_at"],
    )
