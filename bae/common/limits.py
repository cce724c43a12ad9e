"""Quotas, rate limits and budgets: the `[limits]` table of bae-config.toml and a profile's `limits`.

One set of keys, read the same from both places. The config table sets the defaults; a profile's
`limits` overrides some of them for the keys bound to it (a key it leaves out, or sets to null,
keeps the default). Quotas and the rate limit always have a value; a budget (the token and cost
keys) is unlimited unless one of the two sets it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

# Highest value a count or token budget takes (a bound on input, far above any real use).
MAX_COUNT = 10**12

QUOTAS = (
    "max_open_sessions_per_key",
    "max_sandboxes_per_key",
    "max_subscribers_per_session",
    "max_background_commands_per_sandbox",
)
RATE = ("requests_per_second_per_key", "burst")
BUDGETS = ("session_tokens", "session_cost_usd", "key_daily_tokens", "key_daily_cost_usd")
KEYS = QUOTAS + RATE + BUDGETS
# The keys whose value is a number of US dollars or a rate (a float); the others are counts.
FLOAT_KEYS = frozenset(("requests_per_second_per_key", "session_cost_usd", "key_daily_cost_usd"))


@dataclass(frozen=True)
class Limits:
    max_open_sessions_per_key: int = 100
    max_sandboxes_per_key: int = 10
    max_subscribers_per_session: int = 64
    max_background_commands_per_sandbox: int = 32
    requests_per_second_per_key: float = 50.0
    burst: int = 100
    # Budgets: None is unlimited.
    session_tokens: int | None = None
    session_cost_usd: float | None = None
    key_daily_tokens: int | None = None
    key_daily_cost_usd: float | None = None

    def overridden(self, overrides: Mapping[str, Any] | None) -> Limits:
        """These limits with a profile's `limits` applied (its null values keep these)."""
        if not overrides:
            return self
        given = {key: value for key, value in overrides.items() if key in KEYS and value is not None}
        return dataclasses.replace(self, **given) if given else self


DEFAULT_LIMITS = Limits()


class LimitsError(ValueError):
    """A `limits` value that does not read; the message names the key and what it takes."""


def read_limits(table: Mapping[str, Any], where: str) -> dict[str, int | float]:
    """The keys `table` sets, checked: counts are integers from 1 (0 for a budget), costs and the
    rate positive finite numbers. Null values are left out (they keep the default). Unknown keys
    are refused, so a misspelt limit never silently does nothing."""
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise LimitsError(f"{where}: unknown key `{unknown[0]}`; the keys are {', '.join(KEYS)}")
    read: dict[str, int | float] = {}
    for key in KEYS:
        value = table.get(key)
        if value is None:
            continue
        read[key] = _number(key, value, where)
    return read


def _number(key: str, value: Any, where: str) -> int | float:
    lowest = 0 if key in BUDGETS else 1
    if key in FLOAT_KEYS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise LimitsError(f"{where}.{key} must be a number")
        rate = key == "requests_per_second_per_key"  # a rate above 0; a cost budget from 0
        if (value <= 0 if rate else value < 0) or value > MAX_COUNT:
            raise LimitsError(f"{where}.{key} must be {'above 0' if rate else 'at least 0'}, at most {MAX_COUNT}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise LimitsError(f"{where}.{key} must be an integer")
    if not lowest <= value <= MAX_COUNT:
        raise LimitsError(f"{where}.{key} must be between {lowest} and {MAX_COUNT}")
    return value
