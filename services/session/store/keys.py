"""Key rows: client, session and admin keys (SERVER-SPEC §0.1, §2, §4.3)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, and_, bindparam, func, insert, select, update

from bae.ids import new_id, new_token, token_digest
from bae.timefmt import now
from services.session.store.records import KeyRecord
from services.session.store.schema import keys

PHC_PREFIX = "$argon2id$"

_BY_DIGEST = select(keys).where(keys.c.key_hash == bindparam("digest"))
_BY_ID = select(keys).where(keys.c.id == bindparam("id"))
_ACTIVE_CLIENT_PAGE = (
    select(keys)
    .where(
        and_(keys.c.role == "client", keys.c.deleted_at.is_(None), keys.c.seq > bindparam("after"))
    )
    .order_by(keys.c.seq)
    .limit(bindparam("limit"))
)
_ACTIVE_ADMIN = select(keys).where(and_(keys.c.role == "admin", keys.c.deleted_at.is_(None)))
_ACTIVE_CLIENT_COUNT_FOR_PROFILE = select(func.count()).where(
    and_(
        keys.c.role == "client",
        keys.c.deleted_at.is_(None),
        keys.c.profile_id == bindparam("profile_id"),
    )
)
_STAMP = (
    update(keys)
    .where(keys.c.id == bindparam("key_id"))
    .values(last_used_at=bindparam("stamp"))
)
_INSERT = insert(keys)


def record(row: Row) -> KeyRecord:
    return KeyRecord(
        id=row.id,
        name=row.name,
        key_hash=row.key_hash,
        key_prefix=row.key_prefix,
        role=row.role,
        profile_id=row.profile_id,
        client_id=row.client_id,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        deleted_at=row.deleted_at,
    )


def by_digest(conn: Connection, digest: str) -> KeyRecord | None:
    row = conn.execute(_BY_DIGEST, {"digest": digest}).first()
    return None if row is None else record(row)


def by_id(conn: Connection, key_id: str) -> KeyRecord | None:
    row = conn.execute(_BY_ID, {"id": key_id}).first()
    return None if row is None else record(row)


def insert_key(
    conn: Connection,
    *,
    name: str,
    key_hash: str,
    prefix: str,
    role: str,
    profile_id: str | None = None,
    client_id: str | None = None,
) -> KeyRecord:
    row: dict[str, Any] = {
        "id": new_id("key_"),
        "name": name,
        "key_hash": key_hash,
        "key_prefix": prefix,
        "role": role,
        "profile_id": profile_id,
        "client_id": client_id,
        "created_at": now(),
        "last_used_at": None,
        "deleted_at": None,
    }
    conn.execute(_INSERT, row)
    return KeyRecord(**row)


TOKEN_PREFIXES = {"client": "bae_", "session": "bae_ses_", "admin": "bae_admin_"}


def mint(
    conn: Connection, *, role: str, name: str, profile_id: str | None = None, client_id: str | None = None
) -> tuple[str, KeyRecord]:
    """A new key of `role`: its plaintext (returned once, never stored) and its row."""
    token = new_token(TOKEN_PREFIXES[role])
    row = insert_key(
        conn,
        name=name,
        key_hash=token_digest(token),
        prefix=token[:8],
        role=role,
        profile_id=profile_id,
        client_id=client_id,
    )
    return token, row


def client_page(conn: Connection, after_seq: int, limit: int) -> list[tuple[int, KeyRecord]]:
    rows = conn.execute(_ACTIVE_CLIENT_PAGE, {"after": after_seq, "limit": limit})
    return [(row.seq, record(row)) for row in rows]


def active_admins(conn: Connection) -> list[KeyRecord]:
    return [record(row) for row in conn.execute(_ACTIVE_ADMIN)]


def active_client_count(conn: Connection, profile_id: str) -> int:
    return conn.execute(_ACTIVE_CLIENT_COUNT_FOR_PROFILE, {"profile_id": profile_id}).scalar_one()


def soft_delete_admins(conn: Connection) -> None:
    conn.execute(
        update(keys)
        .where(and_(keys.c.role == "admin", keys.c.deleted_at.is_(None)))
        .values(deleted_at=now())
    )


def stamp_last_used(conn: Connection, stamps: dict[str, str]) -> None:
    if stamps:
        conn.execute(_STAMP, [{"key_id": k, "stamp": v} for k, v in stamps.items()])


def revoke_client(conn: Connection, key_id: str) -> list[str] | None:
    """Soft-delete a client key and its session keys; None if it is not an active client key.

    Returns the ids of the sessions it held session keys in.
    """
    stamp = now()
    revoked = conn.execute(
        update(keys)
        .where(and_(keys.c.id == key_id, keys.c.role == "client", keys.c.deleted_at.is_(None)))
        .values(deleted_at=stamp)
    )
    if revoked.rowcount == 0:
        return None
    its_session_keys = and_(
        keys.c.role == "session", keys.c.client_id == key_id, keys.c.deleted_at.is_(None)
    )
    session_ids = sorted(conn.execute(select(keys.c.name).where(its_session_keys).distinct()).scalars())
    conn.execute(update(keys).where(its_session_keys).values(deleted_at=stamp))
    return session_ids


def sessions_with_active_keys(conn: Connection, session_ids: list[str]) -> set[str]:
    if not session_ids:
        return set()
    rows = conn.execute(
        select(keys.c.name)
        .where(
            and_(
                keys.c.role == "session",
                keys.c.deleted_at.is_(None),
                keys.c.name.in_(session_ids),
            )
        )
        .distinct()
    )
    return set(rows.scalars())
