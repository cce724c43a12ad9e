"""Session ownership across replicas: the replicas' heartbeats and the session leases.

Revision ID: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ID = sa.String(64)


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("id", ID, primary_key=True),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("started_at", sa.String(32), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_table(
        "session_leases",
        sa.Column("session_id", ID, primary_key=True),
        sa.Column("replica_id", ID, nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
    )
    op.create_index("session_leases_replica", "session_leases", ["replica_id"])
