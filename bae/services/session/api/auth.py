"""Request authentication for both ports (SERVER-SPEC §2.2, docs/keys.md).

A key row stores the SHA-256 hex digest of its plaintext, so a presented
token is found with one lookup on a unique index. Nothing about a key's
validity is cached: a revocation is visible to the very next request. The
one cache holds successful Argon2id verifications of pre-provisioned admin
hashes (digest -> row id); the row is still re-read on every request.
Those Argon2id checks run in `admin_hash`, off the store threads and throttled.
Lookups that only read run on the store's reader (`Store.read`); the lookups
themselves are store functions (store/keys.py, store/access.py).
The admin checks also take a web console session (its cookie's value, on the
admin port only), valid while it has not expired and the admin key it was
signed in with is still active (store/console.py, docs/console.md).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

from bae.common.errors import Unauthenticated
from bae.common.ids import token_digest
from bae.common.timefmt import now
from bae.services.session.api.admin_hash import AdminHashVerifier
from bae.services.session.api.calls import Credential
from bae.services.session.store import access, console, keys
from bae.services.session.store.console import ConsoleSessionRecord
from bae.services.session.store.records import KeyRecord, Principal, ProfileRecord, SessionRecord
from bae.services.session.store.store import Store

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
        self._flusher: asyncio.Task[None] | None = None

    # Async entry points.

    async def _as_session_key(
        self, credential: Credential, session_id: str, fn: Callable[..., T] | None, args: tuple[Any, ...],
        writes: bool,
    ) -> tuple[Principal, T | None]:
        digest = token_digest(credential.token())
        run = self.store.write if writes else self.store.read
        principal, result = await run(access.as_session_key, digest, session_id, fn, args)
        return self._accepted(principal), result

    def _accepted(self, principal: Principal | None) -> Principal:
        if principal is None:
            raise Unauthenticated("invalid session key")
        self.stamps.stamp(principal.key_id)
        return principal

    async def with_session_key(
        self, credential: Credential, session_id: str, fn: Callable[..., T], *args: Any, writes: bool = True
    ) -> T:
        """Authenticate a session key, then run the store function `fn(conn, *args)` in the same store
        call (on the store's reader when `fn` only reads)."""
        _, result = await self._as_session_key(credential, session_id, fn, args, writes)
        return result  # type: ignore[return-value]  # fn ran: the key was valid

    async def session_principal(self, credential: Credential, session_id: str) -> Principal:
        principal, _ = await self._as_session_key(credential, session_id, None, (), False)
        return principal

    async def session_principal_and_records(
        self, credential: Credential, session_id: str
    ) -> tuple[Principal, SessionRecord | None, ProfileRecord | None]:
        """The principal, the session's record and its live profile, read in one statement."""
        principal, session, profile = await self.store.read(
            access.session_key_and_records, token_digest(credential.token()), session_id
        )
        return self._accepted(principal), session, profile

    async def client_key(self, credential: Credential) -> KeyRecord:
        row = await self.store.read(keys.active_by_digest, token_digest(credential.token()), "client")
        if row is None:
            raise Unauthenticated("invalid client key")
        self.stamps.stamp(row.id)
        return row

    async def require_admin(self, credential: Credential) -> None:
        await self.admin_key_id(credential)

    async def admin_key_id(self, credential: Credential) -> str | None:
        """The id of the admin key `credential` is, or its console session was signed in with; None
        while admin auth is disabled (anything is accepted then). Unauthenticated otherwise."""
        if self.admin_auth_disabled:
            return None
        if credential.console_session is not None:
            return (await self.console_session(credential.console_session)).admin_key_id
        return await self.admin_key_of(credential.token())

    async def console_session(self, token: str) -> ConsoleSessionRecord:
        """The console session whose cookie holds `token`: not expired, its admin key still active.
        One signed in while admin auth was disabled is valid only while it still is."""
        record = await self.store.read(console.active_session, token_digest(token), datetime.now(timezone.utc))
        if record is None or (record.admin_key_id is None and not self.admin_auth_disabled):
            raise Unauthenticated("the console session ended; sign in again")
        if record.admin_key_id is not None:
            self.stamps.stamp(record.admin_key_id)
        return record

    async def admin_key_of(self, token: str) -> str | None:
        """The id of the active admin key `token` is; None while admin auth is disabled (any token is
        accepted then), else Unauthenticated."""
        if self.admin_auth_disabled:
            return None
        digest = token_digest(token)
        row, hashes, stale = await self.store.read(keys.admin_lookup, digest, self._admin_hashes.verified_row(digest))
        if stale:
            self._admin_hashes.forget(digest)
        row_id = row.id if row is not None else None
        if row_id is None and hashes:
            row_id = await self._admin_hashes.verify(token, digest, hashes)
        if row_id is None:
            raise Unauthenticated("invalid admin key")
        self.stamps.stamp(row_id)
        return row_id

    # last_used_at.

    async def flush(self) -> None:
        if self.stamps.pending:
            await self.store.write(keys.stamp_last_used, self.stamps.take())

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

