"""Requests per second per key on the client port: a token bucket per credential, in this process.

Each gateway process keeps its own buckets, so with N gateways behind a balancer a key may make up
to N times its rate in all (docs/configuration.md says so). The bucket is found by a digest of the
Authorization header as it came, before the session service checks it: a flood of requests is
refused without costing the session service anything, and a bogus credential only ever spends its
own bucket.

A new bucket starts with the `[limits]` defaults (`requests_per_second_per_key`, `burst`) and asks
the session service, in the background, for the key's own policy (its profile's `limits`); the
answer applies from then on, and is asked again after POLICY_TTL. So a profile's rate takes effect
within a request or two of a key's first one on each gateway, and a change within a minute.

A refused request answers 429 `rate_limited` with `Retry-After` and the IETF RateLimit headers
(draft-ietf-httpapi-ratelimit-headers: `RateLimit-Policy` and `RateLimit`, structured fields).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import OrderedDict
from typing import Awaitable, Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from bae.common.errors import RateLimited
from bae.common.limits import Limits
from bae.common.protos import session_pb2
from bae.services.gateway.problems import error_response

log = logging.getLogger("bae.gateway")

AUTHORIZATION = b"authorization"
# Buckets kept at most; the least recently used goes first (a bucket made again starts full).
MAX_BUCKETS = 100_000
# Seconds a key's policy is used before it is asked again; policy questions in flight at most.
POLICY_TTL = 60.0
MAX_ASKING = 16
POLICY_NAME = "per-key"

# Asks the session service for the policy of an Authorization header's credential.
AskPolicy = Callable[[str], Awaitable[session_pb2.RatePolicy]]


class Bucket:
    __slots__ = ("tokens", "stamp", "rate", "burst", "asked_at")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.tokens = float(burst)
        self.stamp = now
        self.rate = rate
        self.burst = burst
        self.asked_at = -math.inf  # never

    def take(self, now: float) -> float:
        """Spend a token: 0.0 when there was one, else the seconds until there is."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def apply(self, policy: session_pb2.RatePolicy) -> None:
        self.rate, self.burst = policy.requests_per_second, policy.burst
        self.tokens = min(self.tokens, float(self.burst))

    def headers(self, wait: float) -> dict[str, str]:
        """The answer's Retry-After and RateLimit headers, for a request refused for `wait` seconds."""
        window = max(1, math.ceil(self.burst / self.rate))
        seconds = max(1, math.ceil(wait))
        return {
            "retry-after": str(seconds),
            "ratelimit-policy": f'"{POLICY_NAME}";q={self.burst};w={window}',
            "ratelimit": f'"{POLICY_NAME}";r=0;t={seconds}',
        }


class RateLimit:
    """ASGI middleware: requests that carry an Authorization header spend their key's bucket."""

    def __init__(self, app: ASGIApp, limits: Limits, ask_policy: AskPolicy) -> None:
        self.app = app
        self.default_rate = limits.requests_per_second_per_key
        self.default_burst = limits.burst
        self.ask_policy = ask_policy
        self.buckets: OrderedDict[bytes, Bucket] = OrderedDict()
        self._asking: set[asyncio.Task[None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == AUTHORIZATION:
                    if await self._refused(value, scope, receive, send):
                        return
                    break
        await self.app(scope, receive, send)

    async def _refused(self, authorization: bytes, scope: Scope, receive: Receive, send: Send) -> bool:
        now = time.monotonic()
        bucket = self._bucket(authorization, now)
        wait = bucket.take(now)
        if not wait:
            return False
        error = RateLimited(
            "too many requests for this key; retry after the seconds in Retry-After",
            retry_after=max(1, math.ceil(wait)),
        )
        response = error_response(error)
        response.headers.update(bucket.headers(wait))
        await response(scope, receive, send)
        return True

    def _bucket(self, authorization: bytes, now: float) -> Bucket:
        digest = hashlib.blake2b(authorization, digest_size=16).digest()
        bucket = self.buckets.get(digest)
        if bucket is None:
            bucket = self.buckets[digest] = Bucket(self.default_rate, self.default_burst, now)
            if len(self.buckets) > MAX_BUCKETS:
                self.buckets.popitem(last=False)
        else:
            self.buckets.move_to_end(digest)
        if now - bucket.asked_at > POLICY_TTL and len(self._asking) < MAX_ASKING:
            bucket.asked_at = now
            task = asyncio.create_task(self._ask(bucket, authorization.decode("latin-1")))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)
        return bucket

    async def _ask(self, bucket: Bucket, authorization: str) -> None:
        try:
            bucket.apply(await self.ask_policy(authorization))
        except Exception as exc:  # the defaults stay; asked again after POLICY_TTL
            log.warning("could not read a key's rate limit from the session service: %s", exc)

    async def close(self) -> None:
        for task in list(self._asking):
            task.cancel()
        await asyncio.gather(*self._asking, return_exceptions=True)
