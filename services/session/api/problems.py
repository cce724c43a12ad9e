"""The HTTP problem the gateway answers for an error kind raised below the API (the store's, a
port's): the gateway reads a refusal from the `bae-problem` trailer, so a kind is turned into
its problem at this service's edge, once (`problems()` around a call)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from bae.common import errors
from bae.common.errors import BaeError, Problem

STATUS: dict[type[BaeError], int] = {
    errors.InvalidInput: 400,
    errors.Unauthenticated: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.TooLarge: 413,
    errors.Unprocessable: 422,
    errors.TooManyRequests: 429,
    errors.Internal: 500,
    errors.Unavailable: 503,
    errors.DeadlineExceeded: 504,
}


def as_problem(error: BaeError) -> Problem:
    if isinstance(error, Problem):
        return error
    status = next((STATUS[kind] for kind in type(error).__mro__ if kind in STATUS), 500)
    return Problem(status, error.reason, error.detail, retry_after=error.retry_after)


@contextlib.contextmanager
def problems() -> Iterator[None]:
    """An error kind raised inside the block leaves it as its HTTP problem."""
    try:
        yield
    except BaeError as error:
        if isinstance(error, Problem):
            raise
        raise as_problem(error) from None
