"""The web console's sign-in (docs/console.md): its sessions and its one-time sign-in links.

Each row is known by the SHA-256 digest of its token (the `bae_console` cookie's value, or the
link's), never the token itself. `admin_key_id` names the admin key the session was signed in
with (NULL while admin auth is disabled): a session or link is valid only while that key is
active, so rotating the admin key ends them all. Rows past `expires_at` are deleted at the next
sign-in or link (store/console.py).

Revision ID: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("admin_key_id", sa.String(64)),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("expires_at", sa.String(32), nullable=False),
    )
    op.create_index("console_sessions_expires", "console_sessions", ["expires_at"])
    op.create_table(
        "console_links",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("admin_key_id", sa.String(64)),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("expires_at", sa.String(32), nullable=False),
        sa.Column("used_at", sa.String(32)),
    )
    op.create_index("console_links_expires", "console_links", ["expires_at"])
