"""Argon2id checks of pre-provisioned admin key hashes (docs/keys.md).

A check costs tens of milliseconds of CPU and memory by design, so it runs on
a thread of its own, one at a time, never on a store thread: guessing admin
keys cannot stall the database. After a few failures in a row, further
checks of unknown tokens are refused with 429 and Retry-After for a delay
that doubles with each failure (up to a minute); a success resets it.
Tokens that passed once are remembered by digest and skip Argon2 (and the
throttle) afterwards; their row is still re-read on every request.
"""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from bae.common.errors import TooManyRequests

FREE_FAILURES = 3
FIRST_DELAY = 1.0
MAX_DELAY = 60.0


class AdminHashVerifier:
    def __init__(self) -> None:
        self._hasher = PasswordHasher()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bae-argon2")
        self._verified: dict[str, str] = {}  # sha256(token) -> admin row id
        self._failures = 0
        self._blocked_until = 0.0

    def verified_row(self, digest: str) -> str | None:
        return self._verified.get(digest)

    def forget(self, digest: str) -> None:
        self._verified.pop(digest, None)

    async def verify(self, token: str, digest: str, hashes: list[tuple[str, str]]) -> str | None:
        """The id of the (row id, PHC hash) pair `token` matches, or None; 429 while throttled."""
        wait = self._blocked_until - time.monotonic()
        if wait > 0:
            raise TooManyRequests("too many failed admin key attempts; retry later", retry_after=math.ceil(wait))
        matched = await asyncio.get_running_loop().run_in_executor(self._thread, self._match, token, hashes)
        if matched is None:
            self._failures += 1
            if self._failures >= FREE_FAILURES:
                delay = min(FIRST_DELAY * 2 ** (self._failures - FREE_FAILURES), MAX_DELAY)
                self._blocked_until = time.monotonic() + delay
            return None
        self._failures = 0
        self._blocked_until = 0.0
        self._verified[digest] = matched
        return matched

    def _match(self, token: str, hashes: list[tuple[str, str]]) -> str | None:
        for row_id, key_hash in hashes:
            try:
                self._hasher.verify(key_hash, token)
            except (VerifyMismatchError, VerificationError, InvalidHashError):
                continue  # an unparseable stored hash is a non-match, never a 500
            return row_id
        return None

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
