"""The admin session list's filters (GET /admin/v1/sessions): the indexes that find a profile's or a
client key's sessions in the list's order (seq), and those created in a range of times.

Revision ID: 0013
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("sessions_profile_seq", "sessions", ["profile_id", "seq"])
    op.create_index("sessions_key_seq", "sessions", ["client_key_id", "seq"])
    op.create_index("sessions_created_at", "sessions", ["created_at"])
