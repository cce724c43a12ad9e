"""Retention: a profile's override of [retention], and the index the sweep finds ended sessions by.

Revision ID: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("profiles") as batch:
        batch.add_column(sa.Column("retention", sa.Text, nullable=True))
    op.create_index("sessions_state_closed_at", "sessions", ["state", "closed_at"])
