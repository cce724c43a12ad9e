"""Webhooks: the endpoints, their signing secrets, the outbox of events owed to them, and the deliveries.

Revision ID: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("event_types", sa.Text, nullable=False),
        sa.Column("profile_id", sa.String(64)),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("secret", sa.Text, nullable=False),
        sa.Column("previous_secret", sa.Text),
        sa.Column("previous_expires_at", sa.Float),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.String(32), nullable=False),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("webhook_id", sa.String(64), nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_status", sa.Integer),
        sa.Column("last_error", sa.Text),
        sa.Column("next_attempt_at", sa.Float),
        sa.Column("claimed_by", sa.String(64)),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("delivered_at", sa.String(32)),
    )
    op.create_index("webhook_deliveries_due", "webhook_deliveries", ["state", "next_attempt_at"])
    op.create_index("webhook_deliveries_webhook", "webhook_deliveries", ["webhook_id", "seq"])
    op.create_table(
        "webhook_outbox",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("webhook_ids", sa.Text, nullable=False),
        sa.Column("queued_at", sa.Float, nullable=False),
    )
