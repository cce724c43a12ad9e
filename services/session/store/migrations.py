"""Versioned schema migrations, applied in order at every start.

`schema_migrations` records each applied version. A new schema change is a
new function appended to MIGRATIONS; applied ones are never edited.
"""

from __future__ import annotations

import logging
from typing import Callable

from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, insert, select

from bae.timefmt import now
from services.session.store import schema

log = logging.getLogger("bae.session.store")

_bookkeeping = MetaData()
schema_migrations = Table(
    "schema_migrations",
    _bookkeeping,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("name", String(128), nullable=False),
    Column("applied_at", String(32), nullable=False),
)


def _initial_schema(conn: Connection) -> None:
    schema.metadata.create_all(conn)


MIGRATIONS: list[tuple[str, Callable[[Connection], None]]] = [
    ("initial_schema", _initial_schema),
]


def migrate(conn: Connection) -> list[str]:
    """Apply every pending migration, each in its own transaction; returns their names."""
    with conn.begin():
        _bookkeeping.create_all(conn)
        applied = set(conn.execute(select(schema_migrations.c.version)).scalars())
    ran = []
    for version, (name, apply) in enumerate(MIGRATIONS, start=1):
        if version in applied:
            continue
        with conn.begin():
            apply(conn)
            conn.execute(
                insert(schema_migrations).values(version=version, name=name, applied_at=now())
            )
        log.info("applied migration %d %s", version, name)
        ran.append(name)
    return ran
