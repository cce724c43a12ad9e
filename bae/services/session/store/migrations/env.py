"""Alembic's environment: runs on the connection `migrate` passes in (see __init__.py)."""

from __future__ import annotations

from typing import Any, Collection, Mapping

from alembic import context
from alembic.runtime.migration import MigrationContext, MigrationInfo

_config = context.config
_applied: list[str] = _config.attributes["applied"]


def _record(ctx: MigrationContext, step: MigrationInfo, heads: Collection[Any], run_args: Mapping[str, Any]) -> None:
    if step.is_upgrade and step.up_revision_id is not None:
        _applied.append(step.up_revision_id)


context.configure(connection=_config.attributes["connection"], on_version_apply=_record)
with context.begin_transaction():
    context.run_migrations()
