"""Token and cost budgets (bae.common.limits): checked before every provider call.

A budget is spent by what the store has counted (store/usage.py): the session's totals for
`session_tokens` and `session_cost_usd`, the acting client key's totals of the current UTC day
for `key_daily_tokens` and `key_daily_cost_usd`. A call is allowed while the amount used is
below the limit; the call that crosses it is the last one. With no budget set nothing is read.

What is spent is read from the store once and then followed in memory (`Spend`): the replica
adds each charge it records. A session's totals are exact that way, since the replica that owns
a session records every charge of it. A key's day spans sessions on every replica, so it is read
again once KEY_TOTALS_MAX_AGE old: with one replica it is exact, with several a key may go over
by what its sessions elsewhere used in the last second, besides the calls already under way.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterator

from bae.common.limits import Limits
from bae.services.session.engine.ports import EventStore
from bae.services.session.store.usage import Charge, Totals

# Seconds a key's day totals are used before they are read again (KeySpends).
KEY_TOTALS_MAX_AGE = 1.0
SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class Exhausted:
    """The budget a provider call would go over: which, what was used and the limit."""

    budget: str
    used: int | float
    limit: int | float

    @property
    def message(self) -> str:
        """The JSON-RPC error message (-32051)."""
        return f"budget_exhausted: {self.budget} {_number(self.used)}/{_number(self.limit)}"

    def payload(self) -> dict[str, object]:
        """The `session.error` event's payload when a turn stops on it."""
        return {"reason": "budget_exhausted", "budget": self.budget, "used": self.used, "limit": self.limit}


def _number(value: int | float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.6f}".rstrip("0").rstrip(".")


def has_budget(limits: Limits) -> bool:
    return any(
        value is not None
        for value in (limits.session_tokens, limits.session_cost_usd, limits.key_daily_tokens, limits.key_daily_cost_usd)
    )


class Spend:
    """Usage totals read from the store once, then kept up to date by the charges this replica
    records (`charging`); read again when older than `max_age` seconds (None: never).

    Totals read while a charged write was under way serve that check only: the read may or may
    not have seen the write, so adding its charge later could count it twice or not at all. A
    write that fails leaves it unknown whether its charge was recorded: the next check reads.
    """

    def __init__(self, max_age: float | None = None) -> None:
        self._max_age = max_age
        self._totals: Totals | None = None
        self._read_at = 0.0
        self._writing = 0  # charged writes under way
        self._started = 0  # charged writes ever started

    async def totals(self, read: Callable[[], Awaitable[Totals]]) -> Totals:
        if self._totals is not None and (self._max_age is None or time.monotonic() - self._read_at < self._max_age):
            return self._totals
        writing, started, read_at = self._writing, self._started, time.monotonic()
        totals = await read()
        if not writing and self._started == started:  # no charged write overlapped the read
            self._totals, self._read_at = totals, read_at
        return totals

    @contextlib.contextmanager
    def charging(self, charge: Charge | None) -> Iterator[None]:
        """Around the write that records `charge` (with its events)."""
        if charge is None:
            yield
            return
        self._writing += 1
        self._started += 1
        try:
            yield
        except BaseException:
            self._totals = None
            raise
        else:
            if self._totals is not None:
                self._totals = self._totals.plus(charge)
        finally:
            self._writing -= 1


class KeySpends:
    """Each client key's totals of the current UTC day, as this replica sees them: its own
    charges counted at once, the other replicas' when the key's day is read again, at most
    KEY_TOTALS_MAX_AGE later. A day's spends are dropped when the next day begins."""

    def __init__(self, max_age: float = KEY_TOTALS_MAX_AGE) -> None:
        self._max_age = max_age
        self._day = -1
        self._spends: dict[str, Spend] = {}

    def of(self, client_key_id: str) -> Spend:
        day = int(time.time() // SECONDS_PER_DAY)  # the UTC day, as a number
        if day != self._day:
            self._day, self._spends = day, {}
        spend = self._spends.get(client_key_id)
        if spend is None:
            spend = self._spends[client_key_id] = Spend(self._max_age)
        return spend

    def charging(self, charge: Charge | None) -> contextlib.AbstractContextManager[None]:
        """Around the write that records `charge`, for the key it is charged to."""
        return contextlib.nullcontext() if charge is None else self.of(charge.client_key_id).charging(charge)


async def exhausted(
    store: EventStore,
    limits: Limits,
    session_id: str,
    client_key_id: str,
    *,
    session_spend: Spend | None = None,
    key_spends: KeySpends | None = None,
) -> Exhausted | None:
    """The first budget already used up for a provider call of `client_key_id` in `session_id`, or
    None. `session_spend` and `key_spends` are the totals this replica follows; without them the
    store is read."""
    if not has_budget(limits):
        return None
    session = key = None
    if limits.session_tokens is not None or limits.session_cost_usd is not None:
        read_session = functools.partial(store.session_usage, session_id)
        session = await (session_spend.totals(read_session) if session_spend is not None else read_session())
    if limits.key_daily_tokens is not None or limits.key_daily_cost_usd is not None:
        read_key = functools.partial(store.key_usage_today, client_key_id)
        key = await (key_spends.of(client_key_id).totals(read_key) if key_spends is not None else read_key())
    checks = (
        ("session_tokens", limits.session_tokens, session.tokens if session else 0),
        ("session_cost_usd", limits.session_cost_usd, (session.cost_usd or 0.0) if session else 0.0),
        ("key_daily_tokens", limits.key_daily_tokens, key.tokens if key else 0),
        ("key_daily_cost_usd", limits.key_daily_cost_usd, (key.cost_usd or 0.0) if key else 0.0),
    )
    for budget, limit, used in checks:
        if limit is not None and used >= limit:
            return Exhausted(budget, used, limit)
    return None
