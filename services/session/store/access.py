"""Transactions that authenticate a session key and act on its session in one store call."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from sqlalchemy import Connection

from services.session.store import keys
from services.session.store.records import Principal

T = TypeVar("T")


def as_session_key(
    conn: Connection, digest: str, session_id: str, fn: Callable[..., T] | None, args: tuple[Any, ...]
) -> tuple[Principal | None, T | None]:
    """The principal of a session key, and `fn(conn, *args)` run only when the key is valid."""
    principal = keys.session_principal(conn, digest, session_id)
    if principal is None or fn is None:
        return principal, None
    return principal, fn(conn, *args)
