"""Revoking a client key (SERVER-SPEC §4.3): its session keys go too, and the sessions no other key holds close."""

from __future__ import annotations

from sqlalchemy import Connection

from bae.services.session.store import events, keys, sessions
from bae.services.session.store.events import EventView


def revoke_client(conn: Connection, key_id: str) -> tuple[list[str], dict[str, list[EventView]]] | None:
    """Revoke an active client key; None if there is none.

    Returns the sessions it held session keys in, and the `session.close` events of
    those it closed (open ones that no other active key holds).
    """
    held = keys.revoke_client(conn, key_id)
    if held is None:
        return None
    still_keyed = keys.sessions_with_active_keys(conn, held)
    closed = {}
    for session_id in held:
        if session_id in still_keyed:
            continue
        session = sessions.get(conn, session_id)
        if session is None or session.state != "open":
            continue
        closed[session_id] = events.append(
            conn,
            session_id,
            [(key_id, "session.close", {"reason": "client_key_revoked"})],
            new_state="closed",
        )
    return held, closed
