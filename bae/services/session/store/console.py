"""The web console's sessions and one-time sign-in links (docs/console.md).

Rows are found by the SHA-256 digest of their token; the tokens themselves are never stored. A
session or a link is valid until its `expires_at`, and only while the admin key it was made with is
still active: rotating the admin key (keys.soft_delete_admins) ends every console session at once,
with nothing to revoke here. Each function takes the time it runs at (`at`), so expiry is tested
with a fixed clock; rows past their expiry are deleted whenever a session or a link is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, Connection, Table, and_, delete, insert, or_, select, update
from sqlalchemy.sql.selectable import Join

from bae.common.console import LINK_SECONDS, SESSION_SECONDS
from bae.common.timefmt import format_time
from bae.services.session.store.schema import console_links, console_sessions, keys


@dataclass(frozen=True)
class ConsoleSessionRecord:
    admin_key_id: str | None  # None: signed in while admin auth was disabled
    expires_at: str


def _key_active(table: Table) -> ColumnElement[bool]:
    """`table`'s row was made while admin auth was disabled, or its admin key is active (with `keys`
    outer-joined on it)."""
    return or_(
        table.c.admin_key_id.is_(None), and_(keys.c.id.is_not(None), keys.c.role == "admin", keys.c.deleted_at.is_(None))
    )


def _with_key(table: Table) -> Join:
    return table.outerjoin(keys, keys.c.id == table.c.admin_key_id)


def _sweep(conn: Connection, stamp: str) -> None:
    """Delete the sessions and links that ran out: what expiry ended stays ended."""
    conn.execute(delete(console_sessions).where(console_sessions.c.expires_at <= stamp))
    conn.execute(delete(console_links).where(console_links.c.expires_at <= stamp))


def _insert(conn: Connection, table: Table, digest: str, admin_key_id: str | None, at: datetime, seconds: int) -> str:
    """Store a row of `table` (a session or a link) that lasts `seconds` from `at`, after deleting the
    rows that ran out; returns when it expires."""
    stamp = format_time(at)
    _sweep(conn, stamp)
    expires_at = format_time(at + timedelta(seconds=seconds))
    conn.execute(
        insert(table),
        {"token_hash": digest, "admin_key_id": admin_key_id, "created_at": stamp, "expires_at": expires_at},
    )
    return expires_at


def start_session(conn: Connection, digest: str, admin_key_id: str | None, at: datetime) -> str:
    """Store a console session (its token's `digest`) of `admin_key_id`; returns when it expires."""
    return _insert(conn, console_sessions, digest, admin_key_id, at, SESSION_SECONDS)


def active_session(conn: Connection, digest: str, at: datetime) -> ConsoleSessionRecord | None:
    """The console session of a token digest, unless it expired or its admin key is no longer active."""
    table = console_sessions
    row = conn.execute(
        select(table.c.admin_key_id, table.c.expires_at)
        .select_from(_with_key(table))
        .where(and_(table.c.token_hash == digest, table.c.expires_at > format_time(at), _key_active(table)))
    ).first()
    return None if row is None else ConsoleSessionRecord(admin_key_id=row.admin_key_id, expires_at=row.expires_at)


def end_session(conn: Connection, digest: str) -> None:
    conn.execute(delete(console_sessions).where(console_sessions.c.token_hash == digest))


def create_link(conn: Connection, digest: str, admin_key_id: str | None, at: datetime) -> str:
    """Store a sign-in link (its token's `digest`) of `admin_key_id`; returns when it expires."""
    return _insert(conn, console_links, digest, admin_key_id, at, LINK_SECONDS)


def exchange_link(conn: Connection, link_digest: str, session_digest: str, at: datetime) -> ConsoleSessionRecord | None:
    """Use up the link of `link_digest` and start a console session (`session_digest`) of its admin key;
    None when the link is unknown, was used, expired, or its admin key is no longer active."""
    stamp = format_time(at)
    table = console_links
    # The conditional update is what makes a link work once: of two exchanges at once, one updates it.
    used = conn.execute(
        update(table)
        .where(and_(table.c.token_hash == link_digest, table.c.used_at.is_(None), table.c.expires_at > stamp))
        .values(used_at=stamp)
    )
    if used.rowcount != 1:
        return None
    row = conn.execute(
        select(table.c.admin_key_id).select_from(_with_key(table))
        .where(and_(table.c.token_hash == link_digest, _key_active(table)))
    ).first()
    if row is None:
        return None
    expires_at = start_session(conn, session_digest, row.admin_key_id, at)
    return ConsoleSessionRecord(admin_key_id=row.admin_key_id, expires_at=expires_at)
