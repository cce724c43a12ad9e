"""Usage accounting: what provider responses used, added up per session, client key, profile and UTC day.

A session's responses are charged to one row per (session, UTC day, acting client key), which
also names the session's profile. A charge is added in the transaction that records its
`provider.response` events (`append_charged`, `append_compaction_charged`), so a response is
counted exactly when it is in the log: once, whatever fails, is retried or replayed later.

The counts, for each response recorded:
- `input_tokens`: the input the provider did not read from or write to its prompt cache.
  Anthropic's `usage.input_tokens`; OpenAI's `prompt_tokens` less `prompt_tokens_details.cached_tokens`.
- `cache_read_input_tokens`: Anthropic's `cache_read_input_tokens`; OpenAI's `cached_tokens`.
- `cache_creation_input_tokens`: Anthropic's `cache_creation_input_tokens`; 0 for OpenAI.
- `output_tokens`: Anthropic's `output_tokens`; OpenAI's `completion_tokens`.
- `provider_calls`: every attempt with a `provider.response`, failed ones included; a failed
  attempt adds no tokens (its event has no usage).
- `turns`: each `session.sendMessage` turn once, with its first provider response.
- `cost_usd`: at the prices of the registry entry that answered, cache tokens at its input
  price; a response from an entry without prices adds none. Kept in billionths of a dollar.

Reads sum the rows: a session's totals and a key's day are one indexed read each (what budgets
are spent against: engine/budgets.py); the admin's groups are one grouped read per page.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, and_, bindparam, func, insert, select, update

from bae.common.jsontext import JsonObject, RawJson
from bae.common.timefmt import now
from bae.services.session.store import events
from bae.services.session.store.events import EventView
from bae.services.session.store.requests import PreviousRequests
from bae.services.session.store.schema import usage_totals as table

NANOS_PER_USD = 1_000_000_000

# What each group of GET /admin/v1/usage is keyed by.
GROUP_COLUMNS = {"key": table.c.client_key_id, "profile": table.c.profile_id, "day": table.c.day}
COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "provider_calls",
    "turns",
)

NewEvent = tuple[str | None, str, JsonObject | RawJson]


@dataclass(frozen=True)
class Charge:
    """What some recorded provider responses add: to the acting client key, on the session's profile."""

    client_key_id: str
    profile_id: str
    input_tokens: int = 0  # not read from or written to the cache
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    provider_calls: int = 0
    turns: int = 0
    cost_usd: float | None = None  # None: no response charged had a price

    def plus(self, other: Charge | None) -> Charge:
        """Both charges as one (they are for the same key and profile: one turn's)."""
        if other is None:
            return self
        costs = [cost for cost in (self.cost_usd, other.cost_usd) if cost is not None]
        return replace(
            self,
            **{name: getattr(self, name) + getattr(other, name) for name in COUNTS},
            cost_usd=sum(costs) if costs else None,
        )


@dataclass(frozen=True)
class Totals:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    provider_calls: int = 0
    turns: int = 0
    cost_usd: float | None = None  # None: no response counted had a price

    @property
    def tokens(self) -> int:
        """Every token counted: input (cached or not) and output."""
        return self.input_tokens + self.output_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    def as_dict(self) -> dict[str, Any]:
        return {field.name: getattr(self, field.name) for field in fields(self)}

    def plus(self, charge: Charge) -> Totals:
        """These totals with `charge` added, as the store adds it (its cost in whole billionths)."""
        cost = self.cost_usd
        if charge.cost_usd is not None:
            nanos = round((cost or 0.0) * NANOS_PER_USD) + round(charge.cost_usd * NANOS_PER_USD)
            cost = nanos / NANOS_PER_USD
        return replace(self, **{name: getattr(self, name) + getattr(charge, name) for name in COUNTS}, cost_usd=cost)


# -- writing -----------------------------------------------------------------------------------

# (An UPDATE's parameters may not be named after its table's columns.)
_KEY = and_(
    table.c.session_id == bindparam("row_session_id"),
    table.c.day == bindparam("row_day"),
    table.c.client_key_id == bindparam("row_client_key_id"),
)
_ADDED: dict[str, Any] = {name: table.c[name] + bindparam(f"add_{name}") for name in COUNTS}
_ADD = update(table).where(_KEY).values(**_ADDED)
_ADD_PRICED = (
    update(table).where(_KEY).values(**_ADDED, cost_nanousd=func.coalesce(table.c.cost_nanousd, 0) + bindparam("add_cost"))
)
_INSERT = insert(table)


def add(conn: Connection, session_id: str, charge: Charge) -> None:
    """Add `charge` to the session's row of today (UTC) for its key, made if it is the first."""
    key = {"session_id": session_id, "day": now()[:10], "client_key_id": charge.client_key_id}
    cost = None if charge.cost_usd is None else round(charge.cost_usd * NANOS_PER_USD)
    added: dict[str, Any] = {f"row_{name}": value for name, value in key.items()}
    added.update({f"add_{name}": getattr(charge, name) for name in COUNTS})
    if cost is not None:
        added["add_cost"] = cost
    if conn.execute(_ADD if cost is None else _ADD_PRICED, added).rowcount:
        return
    # The session's appends are serialized (store.py, locks.py), so no other writer makes this row meanwhile.
    conn.execute(
        _INSERT,
        {**key, "profile_id": charge.profile_id, **{name: getattr(charge, name) for name in COUNTS}, "cost_nanousd": cost},
    )


def append_charged(
    conn: Connection,
    session_id: str,
    items: list[NewEvent],
    new_state: str | None,
    charge: Charge,
    previous: PreviousRequests | None = None,
) -> list[EventView]:
    """`events.append`, and the charge of the provider responses among the events, in one transaction."""
    views = events.append(conn, session_id, items, new_state, previous)
    add(conn, session_id, charge)
    return views


def append_compaction_charged(
    conn: Connection,
    session_id: str,
    client_key_id: str | None,
    leading: list[NewEvent],
    preamble: JsonObject,
    summary: JsonObject,
    completed: JsonObject,
    charge: Charge,
    previous: PreviousRequests | None = None,
) -> list[EventView]:
    """`events.append_compaction`, and the charge of the responses among `leading`, in one transaction."""
    views = events.append_compaction(conn, session_id, client_key_id, leading, preamble, summary, completed, previous)
    add(conn, session_id, charge)
    return views


# -- reading -----------------------------------------------------------------------------------

_SUMS = (*(func.sum(table.c[name]) for name in COUNTS), func.sum(table.c.cost_nanousd))
_OF_SESSION = select(*_SUMS).where(table.c.session_id == bindparam("session_id"))
_OF_KEY_DAY = select(*_SUMS).where(
    and_(table.c.client_key_id == bindparam("client_key_id"), table.c.day == bindparam("day"))
)


def _totals(sums: Row[Any] | tuple[Any, ...]) -> Totals:
    *counts, nanos = sums
    return Totals(
        **{name: int(count or 0) for name, count in zip(COUNTS, counts)},  # PostgreSQL sums BIGINTs as NUMERIC
        cost_usd=None if nanos is None else int(nanos) / NANOS_PER_USD,
    )


def session_totals(conn: Connection, session_id: str) -> Totals:
    """A session's totals, over every day and key."""
    return _totals(conn.execute(_OF_SESSION, {"session_id": session_id}).one())


def key_day_totals(conn: Connection, client_key_id: str, day: str | None = None) -> Totals:
    """A client key's totals of one UTC day (YYYY-MM-DD; today by default), over all its sessions."""
    return _totals(conn.execute(_OF_KEY_DAY, {"client_key_id": client_key_id, "day": day or now()[:10]}).one())


def grouped(
    conn: Connection, group_by: str, since: str | None, until: str | None, after: str | None, limit: int
) -> list[tuple[str, Totals]]:
    """Totals per group (key, profile or day) over the days from `since` to `until` (both
    included, either open), in the group's order, the first `limit` groups after `after`."""
    column = GROUP_COLUMNS[group_by]
    where: list[ColumnElement[bool]] = []
    if since is not None:
        where.append(table.c.day >= since)
    if until is not None:
        where.append(table.c.day <= until)
    if after is not None:
        where.append(column > after)
    query = select(column, *_SUMS).where(*where).group_by(column).order_by(column).limit(limit)
    return [(row[0], _totals(row[1:])) for row in conn.execute(query)]
