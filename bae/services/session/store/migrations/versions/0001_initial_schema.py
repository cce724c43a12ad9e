"""The schema of the store before Alembic (commit 0e5055c): keys, profiles, sessions, session_events.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID = sa.String(64)
STAMP = sa.String(32)


def upgrade() -> None:
    op.create_table(
        "keys",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", ID, nullable=False, unique=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("key_hash", sa.Text, nullable=False, unique=True),
        sa.Column("key_prefix", sa.String(32), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("profile_id", ID),
        sa.Column("client_id", ID),
        sa.Column("created_at", STAMP, nullable=False),
        sa.Column("last_used_at", STAMP),
        sa.Column("deleted_at", STAMP),
    )
    op.create_index("keys_role_name", "keys", ["role", "name"])
    op.create_index("keys_client_id", "keys", ["client_id"])
    op.create_index("keys_profile_id", "keys", ["profile_id"])

    op.create_table(
        "profiles",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", ID, nullable=False, unique=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("primary_provider", sa.Text, nullable=False),
        sa.Column("fallback_providers", sa.Text, nullable=False),
        sa.Column("mcp_servers", sa.Text, nullable=False),
        sa.Column("allowed_tools", sa.Text, nullable=False),
        sa.Column("available_sandboxes", sa.Text, nullable=False),
        sa.Column("created_at", STAMP, nullable=False),
        sa.Column("updated_at", STAMP, nullable=False),
        sa.Column("deleted_at", STAMP),
    )

    op.create_table(
        "sessions",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", ID, nullable=False, unique=True),
        sa.Column("client_key_id", ID, nullable=False),
        sa.Column("profile_id", ID, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("client_version", sa.Text),
        sa.Column("client_tools", sa.Text, nullable=False),
        sa.Column("sandbox_tools", sa.Text, nullable=False),
        sa.Column("subagent_tools", sa.Text, nullable=False),
        sa.Column("compaction", sa.Text),
        sa.Column("created_at", STAMP, nullable=False),
        sa.Column("closed_at", STAMP),
    )
    op.create_index("sessions_state_seq", "sessions", ["state", "seq"])

    op.create_table(
        "session_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", ID, nullable=False, unique=True),
        sa.Column("session_id", ID, nullable=False),
        sa.Column("client_key_id", ID),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("created_at", STAMP, nullable=False),
    )
    op.create_index("session_events_session_seq", "session_events", ["session_id", "seq"])
