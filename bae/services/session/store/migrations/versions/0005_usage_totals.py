"""Usage accounting: a session's provider usage per UTC day and acting client key.

Revision ID: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ID = sa.String(64)


def upgrade() -> None:
    op.create_table(
        "usage_totals",
        sa.Column("session_id", ID, primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("client_key_id", ID, primary_key=True),
        sa.Column("profile_id", ID, nullable=False),
        sa.Column("input_tokens", sa.BigInteger, nullable=False),
        sa.Column("output_tokens", sa.BigInteger, nullable=False),
        sa.Column("cache_read_input_tokens", sa.BigInteger, nullable=False),
        sa.Column("cache_creation_input_tokens", sa.BigInteger, nullable=False),
        sa.Column("provider_calls", sa.BigInteger, nullable=False),
        sa.Column("turns", sa.BigInteger, nullable=False),
        sa.Column("cost_nanousd", sa.BigInteger, nullable=True),
    )
    op.create_index("usage_totals_key_day", "usage_totals", ["client_key_id", "day"])
    op.create_index("usage_totals_profile_day", "usage_totals", ["profile_id", "day"])
    op.create_index("usage_totals_day", "usage_totals", ["day"])
