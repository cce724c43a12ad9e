"""Cursor pagination shared by every list endpoint (SERVER-SPEC §4.1).

`cursor` and `limit` arrive as the query gave them. The cursor is the `seq` of the last row
returned, as a decimal string. A page query fetches `limit + 1` rows: the extra one only says
more exist.

A page of events also stops before the event that would take its payload text over
PAGE_PAYLOAD_CHARS (it holds at least one), so it may hold fewer than `limit` events while
`next_cursor` says more follow: however large the log's events, every page is read in one go.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from bae.common.errors import InvalidInput, echo

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
# Payload text of a page of events, in characters, as stored (no payload is parsed to count it).
PAGE_PAYLOAD_CHARS = 4 * 1024 * 1024
# A decimal integer; group 1 holds a positive one's digits without leading zeros.
_INTEGER = re.compile(r"\+?0*([1-9][0-9]*)|[+-]?0+|-[0-9]+")
_CURSOR = re.compile(r"[0-9]{1,18}")

T = TypeVar("T")


@dataclass(frozen=True)
class PageRequest:
    after_seq: int
    limit: int

    @property
    def fetch(self) -> int:
        return self.limit + 1

    def page(
        self, rows: Sequence[tuple[int, T]], size: Callable[[T], int] | None = None
    ) -> tuple[list[T], str | None]:
        """The items of up to `limit + 1` (seq, item) rows, and the next page's cursor (None on the
        last). With `size`, the items also stop within PAGE_PAYLOAD_CHARS (`fitting`)."""
        shown = rows[: self.limit]
        if size is not None:
            shown = shown[: fitting([item for _, item in shown], size)]
        more = len(rows) > len(shown)
        return [item for _, item in shown], str(shown[-1][0]) if more and shown else None


def fitting(items: Sequence[T], size: Callable[[T], int], budget: int = PAGE_PAYLOAD_CHARS) -> int:
    """How many of the first `items` a page holds: those whose sizes add up to at most `budget`,
    and always the first."""
    total = 0
    for count, item in enumerate(items):
        total += size(item)
        if total > budget and count:
            return count
    return len(items)


def page_request(cursor: str, limit: str) -> PageRequest:
    """Parse `?cursor=&limit=` ("" when absent); bad values raise InvalidInput."""
    if limit == "":
        size = DEFAULT_LIMIT
    else:
        match = _INTEGER.fullmatch(limit)
        digits = match.group(1) if match else None
        if digits is None:
            raise InvalidInput("limit must be a positive integer")
        # Any larger limit clamps, however many digits it has (no int() of a huge string).
        size = MAX_LIMIT if len(digits) > 3 else min(int(digits), MAX_LIMIT)
    if cursor == "":
        return PageRequest(0, size)
    if not _CURSOR.fullmatch(cursor):
        raise InvalidInput(f'invalid cursor: "{echo(cursor)}"')
    return PageRequest(int(cursor), size)
