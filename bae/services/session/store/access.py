"""Transactions that authenticate a session key and act on its session in one store call."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, TypeVar

from sqlalchemy import Connection, Row, and_, bindparam, select

from bae.services.session.store import keys, profiles, sessions
from bae.services.session.store.records import Principal, ProfileRecord, SessionRecord
from bae.services.session.store.schema import keys as key_table
from bae.services.session.store.schema import profiles as profile_table
from bae.services.session.store.schema import sessions as session_table

T = TypeVar("T")


def as_session_key(
    conn: Connection, digest: str, session_id: str, fn: Callable[..., T] | None, args: tuple[Any, ...]
) -> tuple[Principal | None, T | None]:
    """The principal of a session key, and `fn(conn, *args)` run only when the key is valid."""
    principal = keys.session_principal(conn, digest, session_id)
    if principal is None or fn is None:
        return principal, None
    return principal, fn(conn, *args)


# What every JSON-RPC call reads first, as one statement rather than three: the key a token names,
# the session the key is named after, and that session's profile unless it was deleted.
_JOINED_TABLES = (key_table, session_table, profile_table)
# Each table's column names, in the order the statement selects them.
_JOINED_NAMES = [table.c.keys() for table in _JOINED_TABLES]
_KEY_SESSION_PROFILE = (
    select(*(column for table in _JOINED_TABLES for column in table.c))
    .select_from(
        key_table.outerjoin(session_table, session_table.c.id == key_table.c.name).outerjoin(
            profile_table,
            and_(profile_table.c.id == session_table.c.profile_id, profile_table.c.deleted_at.is_(None)),
        )
    )
    .where(key_table.c.key_hash == bindparam("digest"))
)


def session_key_and_records(
    conn: Connection, digest: str, session_id: str
) -> tuple[Principal | None, SessionRecord | None, ProfileRecord | None]:
    """The principal of a session key, with its session's record and live profile (None for a
    missing or deleted one); all three None for any token that is not a valid key of `session_id`."""
    row = conn.execute(_KEY_SESSION_PROFILE, {"digest": digest}).first()
    if row is None:
        return None, None, None
    key, session, profile = _split(row)
    principal = keys.principal_of(keys.record(key), digest, session_id)
    if principal is None:
        return None, None, None
    return (
        principal,
        None if session.id is None else sessions.record(session),
        None if profile.id is None else profiles.record(profile),
    )


def _split(row: Row[Any]) -> list[Any]:
    """Each joined table's columns of `row`, read by their own names as that table's record builder does."""
    parts, start = [], 0
    for names in _JOINED_NAMES:
        parts.append(SimpleNamespace(**dict(zip(names, row[start : start + len(names)]))))
        start += len(names)
    return parts
