"""Schedules: cron-driven sessions (engine/schedules.py) and their runs, one row per tick that fired
or was skipped. UNIQUE(schedule_id, scheduled_for) makes a tick fire once across replicas: the
replica whose insert of the run row succeeds fires it.

Revision ID: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("profile_id", sa.String(64), nullable=False),
        sa.Column("client_key_id", sa.String(64), nullable=False),
        sa.Column("cron", sa.Text, nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("overlap", sa.String(16), nullable=False),
        sa.Column("catch_up", sa.String(16), nullable=False),
        sa.Column("close_after", sa.Boolean, nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("checked_through", sa.Float, nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.String(32), nullable=False),
    )
    op.create_table(
        "schedule_runs",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("schedule_id", sa.String(64), nullable=False),
        sa.Column("scheduled_for", sa.String(32), nullable=False),
        sa.Column("fired_at", sa.String(32), nullable=False),
        sa.Column("session_id", sa.String(64)),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("replica_id", sa.String(64), nullable=False),
        sa.UniqueConstraint("schedule_id", "scheduled_for", name="schedule_runs_tick"),
    )
    op.create_index("schedule_runs_outcome", "schedule_runs", ["outcome"])
