"""Counts for the database gauges (TELEMETRY §4): one query for all five."""

from __future__ import annotations

from sqlalchemy import ColumnElement, Connection, ScalarSelect, Table, and_, func, select

from bae.services.session.store.schema import keys, profiles, session_events, sessions


def _count(table: Table, *where: ColumnElement[bool]) -> ScalarSelect[int]:
    query = select(func.count()).select_from(table)
    return (query.where(and_(*where)) if where else query).scalar_subquery()


_ACTIVITY = select(
    _count(sessions, sessions.c.state == "open"),
    _count(sessions),
    _count(session_events),
    _count(profiles, profiles.c.deleted_at.is_(None)),
    _count(keys, keys.c.role == "client", keys.c.deleted_at.is_(None)),
)


def activity_counts(conn: Connection) -> tuple[int, ...]:
    """Open sessions, all sessions, events, live profiles, live client keys."""
    return tuple(int(value) for value in conn.execute(_ACTIVITY).one())
