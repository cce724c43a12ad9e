"""Cursor pagination shared by every list endpoint (SERVER-SPEC §4.1).

The cursor is the `seq` of the last row returned, as a decimal string. A
page query fetches `limit + 1` rows: the extra one only says more exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from bae.common.errors import bad_request, echo
from bae.common.jsontext import dump

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
# A decimal integer; group 1 holds a positive one's digits without leading zeros.
_INTEGER = re.compile(r"\+?0*([1-9][0-9]*)|[+-]?0+|-[0-9]+")
_CURSOR = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class PageRequest:
    after_seq: int
    limit: int

    @property
    def fetch(self) -> int:
        return self.limit + 1


def page_request(query: Mapping[str, str]) -> PageRequest:
    """Parse `?cursor=&limit=`; bad values raise a 400 Problem."""
    raw_limit = query.get("limit", "")
    if raw_limit == "":
        limit = DEFAULT_LIMIT
    else:
        match = _INTEGER.fullmatch(raw_limit)
        digits = match.group(1) if match else None
        if digits is None:
            raise bad_request("limit must be a positive integer")
        # Any larger limit clamps, however many digits it has (no int() of a huge string).
        limit = MAX_LIMIT if len(digits) > 3 else min(int(digits), MAX_LIMIT)
    cursor = query.get("cursor", "")
    if cursor == "":
        return PageRequest(0, limit)
    if not _CURSOR.fullmatch(cursor):
        raise bad_request(f'invalid cursor: "{echo(cursor)}"')
    return PageRequest(int(cursor), limit)


def page_json(rows: list[tuple[int, str]], request: PageRequest) -> str:
    """`{"items":[…],"next_cursor":…}` from up to `limit + 1` (seq, item JSON text) rows."""
    shown = rows[: request.limit]
    more = len(rows) > request.limit
    next_cursor = str(shown[-1][0]) if more and shown else None
    return '{"items":[' + ",".join(item for _, item in shown) + '],"next_cursor":' + dump(next_cursor) + "}"

