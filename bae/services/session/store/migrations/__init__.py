"""Schema migrations: Alembic revisions in versions/, applied at every start and by `bae migrate`.

Alembic is driven from code (no alembic.ini): `migrate(conn)` upgrades the
database behind `conn` to the newest revision in one transaction and returns
the revisions it applied. A revision, once released, is never edited; a schema
change is a new revision that says it step by step (no `metadata.create_all`),
so fresh installs and upgrades end with the same schema.

A database made before Alembic carries `schema_migrations` (version 1,
"initial_schema"): its tables are revision 0001, so it is stamped 0001, its
old bookkeeping table is dropped, and it upgrades from there.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, text

log = logging.getLogger("bae.session.store")
# Alembic says "Context impl …" and "Will assume transactional DDL" at every start; the revisions
# applied are logged here, once each.
logging.getLogger("alembic").setLevel(logging.WARNING)

HERE = Path(__file__).parent
LEGACY_TABLE = "schema_migrations"
# Held for the migrating transaction on PostgreSQL, so replicas starting together migrate one at a time.
_PG_MIGRATION_LOCK = 0x6261655F6D6967  # "bae_mig"


def _config(conn: Connection, applied: list[str]) -> Config:
    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.attributes["connection"] = conn
    config.attributes["applied"] = applied
    return config


def _legacy_initial_schema(conn: Connection) -> bool:
    """True for a database whose schema was made by the code before Alembic (its version 1)."""
    tables = inspect(conn).get_table_names()
    if LEGACY_TABLE not in tables or "alembic_version" in tables:
        return False
    versions = set(conn.execute(text(f"SELECT version FROM {LEGACY_TABLE}")).scalars())
    return versions == {1}


def migrate(conn: Connection, target: str = "head") -> list[str]:
    """Upgrade to `target` (the newest revision) in one transaction; returns the revisions applied,
    oldest first."""
    applied: list[str] = []
    with conn.begin():
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        if _legacy_initial_schema(conn):
            command.stamp(_config(conn, []), "0001")
            conn.execute(text(f"DROP TABLE {LEGACY_TABLE}"))
            log.info("database made before Alembic: stamped revision 0001")
        command.upgrade(_config(conn, applied), target)
    for revision in applied:
        log.info("applied migration %s", revision)
    return applied


def current(conn: Connection) -> str | None:
    """The revision the database is at (None before the first migration)."""
    return MigrationContext.configure(conn).get_current_revision()
