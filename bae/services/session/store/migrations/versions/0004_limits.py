"""Limits: a profile's overrides of the [limits] defaults, the sandboxes each client key holds,
and the index that counts a key's open sessions.

Revision ID: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

ID = sa.String(64)


def upgrade() -> None:
    with op.batch_alter_table("profiles") as batch:
        batch.add_column(sa.Column("limits", sa.Text, nullable=True))
    op.create_table(
        "sandbox_slots",
        sa.Column("session_id", ID, primary_key=True),
        sa.Column("client_key_id", ID, nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
    )
    op.create_index("sandbox_slots_key", "sandbox_slots", ["client_key_id"])
    op.create_index("sessions_key_state", "sessions", ["client_key_id", "state"])
