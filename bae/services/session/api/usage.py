"""The usage reads: `GET /api/v1/sessions/{id}/usage` and `GET /admin/v1/usage` (store/usage.py).

The admin's groups page as every list does (`limit`, `cursor`, `next_cursor`), but a group has
no row number: its cursor is the last group's key (a client key id, a profile id or a day), and
the next page starts after it in the same order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

from bae.common.errors import InvalidInput, echo
from bae.common.protos import admin_api_pb2, client_api_pb2
from bae.services.session.api.pagination import page_request
from bae.services.session.store.usage import Totals

# The field that names a group's key in its item, by `group_by`.
GROUP_FIELDS = {"key": "client_key_id", "profile": "profile_id", "day": "day"}
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_GROUP_CURSOR = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class UsageQuery:
    group_by: str
    since: str | None
    until: str | None
    after: str | None
    limit: int


def usage_query(request: admin_api_pb2.ListUsageRequest) -> UsageQuery:
    """The query's values, checked; a bad one raises InvalidInput (400)."""
    group_by = request.group_by
    if group_by not in GROUP_FIELDS:
        shown = f'"{echo(group_by)}"' if group_by else "missing"
        raise InvalidInput(f"invalid group_by ({shown}); expected one of key, profile, day")
    since, until = _day("since", request.since), _day("until", request.until)
    if since is not None and until is not None and since > until:
        raise InvalidInput(f"since ({since}) is after until ({until})")
    cursor = request.cursor
    if cursor and not _GROUP_CURSOR.fullmatch(cursor):
        raise InvalidInput(f'invalid cursor: "{echo(cursor)}"')
    limit = page_request("", request.limit).limit
    return UsageQuery(group_by, since, until, cursor or None, limit)


def _day(name: str, value: str) -> str | None:
    if value == "":
        return None
    try:
        if not _DAY.fullmatch(value):
            raise ValueError
        date.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f'invalid {name} "{echo(value)}"; expected a UTC day, YYYY-MM-DD') from None
    return value


def session_usage(session_id: str, totals: Totals) -> client_api_pb2.SessionUsage:
    return client_api_pb2.SessionUsage(session_id=session_id, **totals.as_dict())


def usage_page(query: UsageQuery, groups: list[tuple[str, Totals]]) -> admin_api_pb2.UsagePage:
    """A page of at most `query.limit` groups from up to one more (which says more exist)."""
    shown = groups[: query.limit]
    more = len(groups) > query.limit
    field = GROUP_FIELDS[query.group_by]
    page = admin_api_pb2.UsagePage(next_cursor=shown[-1][0] if more and shown else None)
    for key, totals in shown:
        setattr(page.items.add(**totals.as_dict()), field, key)
    return page
