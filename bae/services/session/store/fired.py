"""What schedule runs and trigger runs share (store/schedules.py, store/triggers.py): the outcomes of
a run whose session the server opened and drove itself (engine/fire.py), and the reading of that
session's log that a run resumed by another replica takes its outcome from."""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy import Connection

from bae.services.session.store import events, sessions


class Outcome(StrEnum):
    """A trigger run's outcome, as stored and as the API writes it (a schedule's runs add `skipped`)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


def turn_log(conn: Connection, session_id: str) -> tuple[str | None, list[tuple[str, str]]]:
    """A run's session as its log tells it: the session's state (None: gone), and its messages as
    (event_type, payload text), in order."""
    session = sessions.get(conn, session_id)
    if session is None:
        return None, []
    return session.state, [(row.event_type, row.payload) for row in events.message_rows(conn, session_id)]
