"""Token and cost budgets (bae.common.limits): checked before every provider call.

A budget is spent by what the store has counted (store/usage.py): the session's totals for
`session_tokens` and `session_cost_usd`, the acting client key's totals of the current UTC day
for `key_daily_tokens` and `key_daily_cost_usd`. A call is allowed while the amount used is
below the limit; the call that crosses it is the last one. With no budget set nothing is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from bae.common.limits import Limits
from services.session.engine.ports import EventStore


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


async def exhausted(store: EventStore, limits: Limits, session_id: str, client_key_id: str) -> Exhausted | None:
    """The first budget already used up for a provider call of `client_key_id` in `session_id`, or None."""
    if not has_budget(limits):
        return None
    by_session = limits.session_tokens is not None or limits.session_cost_usd is not None
    by_key = limits.key_daily_tokens is not None or limits.key_daily_cost_usd is not None
    session, key = await store.budget_usage(session_id, client_key_id, session=by_session, key=by_key)
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
