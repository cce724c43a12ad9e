"""Key rows: client, session and admin keys (SERVER-SPEC §0.1, §2, §4.3)."""

from __future__ import annotations

from typing import Any, Callable

from sqlalchemy import Connection, Row, and_, bindparam, func, insert, select, text, update

from bae.common.ids import digests_equal, new_id, new_token, token_digest
from bae.common.timefmt import now
from bae.services.session.store.records import KeyRecord, Principal
from bae.services.session.store.schema import keys, profiles

PHC_PREFIX = "$argon2id$"
# Held by `bootstrap_admin`'s transaction on PostgreSQL: replicas starting together make one admin key.
_PG_ADMIN_BOOTSTRAP_LOCK = 0x6261655F61646D  # "bae_adm"

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
_ACTIVE_PROFILE = select(profiles.c.seq).where(and_(profiles.c.id == bindparam("id"), profiles.c.deleted_at.is_(None)))


def record(row: Row[Any]) -> KeyRecord:
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


def active_by_digest(conn: Connection, digest: str, role: str) -> KeyRecord | None:
    """The active key of `role` whose stored digest is `digest`."""
    row = by_digest(conn, digest)
    return row if row is not None and _active(row, digest, role) else None


def _active(row: KeyRecord, digest: str, role: str) -> bool:
    """Whether `row`, found by `digest`, is an active key of `role`."""
    # The index found the row by digest; compare again in constant time anyway.
    return row.role == role and row.deleted_at is None and digests_equal(row.key_hash, digest)


def session_principal(conn: Connection, digest: str, session_id: str) -> Principal | None:
    """Who an active session key of `session_id` acts as; None for any other token."""
    row = by_digest(conn, digest)
    return None if row is None else principal_of(row, digest, session_id)


def principal_of(row: KeyRecord, digest: str, session_id: str) -> Principal | None:
    """Who the key `row`, found by `digest`, acts as on `session_id`: None unless it is an active session key of it."""
    if row.name != session_id or not _active(row, digest, "session"):
        return None
    return Principal(key_id=row.id, client_key_id=row.client_id or "", session_id=session_id, profile_id=row.profile_id)


def admin_lookup(
    conn: Connection, digest: str, verified_id: str | None
) -> tuple[KeyRecord | None, list[tuple[str, str]], bool]:
    """The active admin row of a token digest, directly or through `verified_id` (a row the token
    passed Argon2id for before). Otherwise None and the (row id, PHC hash) pairs left to verify
    against; the flag says `verified_id` no longer names an active admin row."""
    row = active_by_digest(conn, digest, "admin")
    if row is not None:
        return row, [], False
    if verified_id is not None:
        row = by_id(conn, verified_id)
        if row is not None and row.role == "admin" and row.deleted_at is None:
            return row, [], False
        return None, [], True
    return None, [(row.id, row.key_hash) for row in active_admins(conn) if row.key_hash.startswith(PHC_PREFIX)], False


def mint_client(conn: Connection, name: str, profile_id: str) -> tuple[str, KeyRecord] | None:
    """A new client key bound to an active profile; None when there is no such active profile."""
    if conn.execute(_ACTIVE_PROFILE, {"id": profile_id}).first() is None:
        return None
    return mint(conn, role="client", name=name, profile_id=profile_id)


def stamped_client_page(
    conn: Connection, stamps: dict[str, str], after_seq: int, limit: int
) -> list[tuple[int, KeyRecord]]:
    """Write pending last_used_at stamps, then read a page of active client keys (showing them)."""
    stamp_last_used(conn, stamps)
    return client_page(conn, after_seq, limit)


BOOTSTRAP_ADMIN_NAME = "bootstrap-admin"


def bootstrap_admin(
    conn: Connection,
    rotate: bool,
    remove_key_file: Callable[[], None],
    write_key_file: Callable[[str], None],
    read_provisioned: Callable[[], tuple[str, str, str] | None],
    key_file_holds: Callable[[list[str]], bool | None],
) -> str:
    """Make sure an admin key exists (SERVER-SPEC §2.3); says what it did: rotated, kept, provisioned, generated,
    or why it did nothing: "mismatch" (the key file holds none of this store's admin keys), "foreign" (a key
    file exists and this store has no admin key yet: the file belongs to another store).

    `read_provisioned` gives a pre-provisioned (name, key hash, prefix), or None. `key_file_holds(hashes)`
    says whether the key file holds the key of one of `hashes`; None when there is no key file. An existing
    key file is never replaced, except by an asked-for rotation. A generated key's plaintext is written by
    `write_key_file` inside this transaction: a failed write rolls the row back, so there is never an
    active admin row whose plaintext nobody has.
    """
    if conn.dialect.name == "postgresql":
        # The next replica waits here until this transaction commits, then finds the key made.
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_ADMIN_BOOTSTRAP_LOCK})
    if rotate:
        soft_delete_admins(conn)
        remove_key_file()
        token, _ = mint(conn, role="admin", name=BOOTSTRAP_ADMIN_NAME)
        write_key_file(token)
        return "rotated"
    admins = active_admins(conn)
    if admins:
        return "mismatch" if key_file_holds([row.key_hash for row in admins]) is False else "kept"
    provisioned = read_provisioned()
    if provisioned is not None:
        name, key_hash, prefix = provisioned
        if key_file_holds([key_hash]) is False:
            return "mismatch"
        insert_key(conn, name=name, key_hash=key_hash, prefix=prefix, role="admin")
        return "provisioned"
    if key_file_holds([]) is not None:
        return "foreign"
    token, _ = mint(conn, role="admin", name=BOOTSTRAP_ADMIN_NAME)
    write_key_file(token)
    return "generated"
