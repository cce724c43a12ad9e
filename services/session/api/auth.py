"""Request authentication for both ports (SERVER-SPEC §2.2, docs/keys.md).

A key row stores the SHA-256 hex digest of its plaintext, so a presented
token is found with one lookup on a unique index. Nothing about a key's
validity is cached: a revocation is visible to the very next request. The
one cache holds successful Argon2id verifications of pre-provisioned admin
hashes (digest -> row id); the row is still re-read on every request.
Those Argon2id checks run in `admin_hash`, off the store threads and throttled.
Lookups that only read run on the store's reader (`Store.read`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, TypeVar

from sqlalchemy import Connection

from bae.errors import unauthorized
from bae.ids import digests_equal, token_digest
from bae.timefmt import now
from services.session.api.admin_hash import AdminHashVerifier
from services.session.api.calls import Credential
from services.session.store import keys
from services.session.store.records import KeyRecord, Principal, ProfileRecord, SessionRecord
from services.session.store.store import Store, session_and_profile

log = logging.getLogger("bae.session.auth")

STAMP_FLUSH_INTERVAL = 1.0

T = TypeVar("T")


class LastUsedStamps:
    """Coalesces `last_used_at` stamps in memory; written at most once per interval."""

    def __init__(self) -> None:
        self.pending: dict[str, str] = {}

    def stamp(self, key_id: str) -> None:
        self.pending[key_id] = now()

    def take(self) -> dict[str, str]:
        pending, self.pending = self.pending, {}
        return pending


class Authenticator:
    def __init__(self, store: Store, *, admin_auth_disabled: bool) -> None:
        self.store = store
        self.admin_auth_disabled = admin_auth_disabled
        self.stamps = LastUsedStamps()
        self._admin_hashes = AdminHashVerifier()
        self._flusher: asyncio.Task | None = None

    # Lookups; each is a plain function of a connection so a route can run its
    # authentication and its read in one store call.

    def find_client_key(self, conn: Connection, token: str) -> KeyRecord:
        row = _active_by_digest(conn, token_digest(token), "client")
        if row is None:
            raise unauthorized("invalid client key")
        self.stamps.stamp(row.id)
        return row

    def find_session_key(self, conn: Connection, token: str, session_id: str) -> Principal:
        row = _active_by_digest(conn, token_digest(token), "session")
        if row is None or row.name != session_id:
            raise unauthorized("invalid session key")
        self.stamps.stamp(row.id)
        return Principal(
            key_id=row.id,
            client_key_id=row.client_id or "",
            session_id=session_id,
            profile_id=row.profile_id,
        )

    def find_admin_key(self, conn: Connection, digest: str) -> tuple[KeyRecord | None, list[tuple[str, str]]]:
        """The admin row of a token digest (directly, or one that passed Argon2id before);
        otherwise None and the (row id, PHC hash) pairs left to verify against."""
        row = _active_by_digest(conn, digest, "admin")
        if row is not None:
            return row, []
        verified = self._admin_hashes.verified_row(digest)
        if verified is not None:
            row = keys.by_id(conn, verified)
            if row is not None and row.role == "admin" and row.deleted_at is None:
                return row, []
            self._admin_hashes.forget(digest)
            return None, []
        return None, [
            (row.id, row.key_hash) for row in keys.active_admins(conn) if row.key_hash.startswith(keys.PHC_PREFIX)
        ]

    # Async entry points.

    async def with_session_key(
        self,
        credential: Credential,
        session_id: str,
        fn: Callable[[Connection, Principal], T],
        *,
        writes: bool = True,
    ) -> T:
        """Authenticate a session key, then run `fn(conn, principal)` in the same store call
        (on the store's reader when `fn` only reads)."""
        token = credential.token()

        def authenticated(conn: Connection) -> T:
            return fn(conn, self.find_session_key(conn, token, session_id))

        return await (self.store.call if writes else self.store.read)(authenticated)

    async def session_principal(self, credential: Credential, session_id: str) -> Principal:
        return await self.with_session_key(
            credential, session_id, lambda _conn, principal: principal, writes=False
        )

    async def session_principal_and_records(
        self, credential: Credential, session_id: str
    ) -> tuple[Principal, SessionRecord | None, ProfileRecord | None]:
        """The principal, the session's record and its live profile, read in one store call."""
        return await self.with_session_key(
            credential,
            session_id,
            lambda conn, principal: (principal, *session_and_profile(conn, session_id)),
            writes=False,
        )

    async def client_key(self, credential: Credential) -> KeyRecord:
        token = credential.token()
        return await self.store.read(self.find_client_key, token)

    async def require_admin(self, credential: Credential) -> None:
        if self.admin_auth_disabled:
            return
        token = credential.token()
        digest = token_digest(token)
        row, hashes = await self.store.read(self.find_admin_key, digest)
        row_id = row.id if row is not None else None
        if row_id is None and hashes:
            row_id = await self._admin_hashes.verify(token, digest, hashes)
        if row_id is None:
            raise unauthorized("invalid admin key")
        self.stamps.stamp(row_id)

    # last_used_at.

    def flush_stamps(self, conn: Connection) -> None:
        """Write pending stamps (inside a store call)."""
        keys.stamp_last_used(conn, self.stamps.take())

    async def flush(self) -> None:
        if self.stamps.pending:
            await self.store.call(self.flush_stamps)

    def start(self) -> None:
        self._flusher = asyncio.create_task(self._flush_forever())

    async def stop(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            try:
                await self._flusher
            except asyncio.CancelledError:
                pass
        await self.flush()
        self._admin_hashes.close()

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(STAMP_FLUSH_INTERVAL)
            try:
                await self.flush()
            except Exception:
                log.exception("writing last_used_at stamps failed")


def _active_by_digest(conn: Connection, digest: str, role: str) -> KeyRecord | None:
    row = keys.by_digest(conn, digest)
    if row is None or row.role != role or row.deleted_at is not None:
        return None
    # The index found the row by digest; compare again in constant time anyway.
    return row if digests_equal(row.key_hash, digest) else None
