"""Per-session event order in the database: session_events.session_seq, unique per session.

Existing events are numbered 1, 2, … per session in their global `seq` order.
The column starts nullable, is filled, then made NOT NULL (SQLite rebuilds the
table for that: Alembic's batch mode).

Revision ID: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("session_events", sa.Column("session_seq", sa.Integer, nullable=True))
    # UPDATE … FROM and window functions: SQLite ≥ 3.33 and PostgreSQL alike.
    op.execute(
        "UPDATE session_events SET session_seq = numbered.n FROM ("
        " SELECT seq, ROW_NUMBER() OVER (PARTITION BY session_id ORDER BY seq) AS n FROM session_events"
        ") AS numbered WHERE session_events.seq = numbered.seq"
    )
    with op.batch_alter_table("session_events") as batch:
        batch.alter_column("session_seq", existing_type=sa.Integer, nullable=False)
    op.create_index("session_events_session_order", "session_events", ["session_id", "session_seq"], unique=True)
