"""Duty leases: periodic work one replica at a time runs for all (the sandbox reconciliation, the
retention sweep).

Revision ID: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "duty_leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("replica_id", sa.String(64), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
