"""HTTP triggers (api/triggers.py) and their runs, one row per accepted call.

UNIQUE(trigger_id, idempotency_key) makes a call's Idempotency-Key start one run: the run row is
inserted in the transaction that opens its session, so of concurrent calls with one key one
insert succeeds and the others answer its run (store/triggers.py). A key is held for 24 hours;
a call after that releases the old row's hold (`idempotency_key` to NULL, the key kept in
`released_idempotency_key` for the runs listing). NULLs never collide, so calls without a key
are unconstrained.

A run row names the replica driving it (`replica_id`) and keeps the call's rendered `message` until
it ends: a running run whose replica stopped is taken over by another, which sends the message if
the session's log shows it was never sent (engine/triggers.py).

Revision ID: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "triggers",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("name", sa.String(100), nullable=False, unique=True),
        sa.Column("profile_id", sa.String(64), nullable=False),
        sa.Column("input_schema", sa.Text, nullable=False),
        sa.Column("message_template", sa.Text, nullable=False),
        sa.Column("close_after", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.String(32), nullable=False),
    )
    op.create_table(
        "trigger_runs",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("trigger_id", sa.String(64), nullable=False),
        sa.Column("fired_at", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("session_id", sa.String(64)),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("idempotency_key", sa.String(200)),
        sa.Column("released_idempotency_key", sa.String(200)),
        sa.Column("input_sha256", sa.String(64), nullable=False),
        sa.Column("replica_id", sa.String(64), nullable=False),
        sa.Column("message", sa.Text),
        sa.UniqueConstraint("trigger_id", "idempotency_key", name="trigger_runs_idempotency"),
    )
    op.create_index("trigger_runs_trigger", "trigger_runs", ["trigger_id", "seq"])
    op.create_index("trigger_runs_outcome", "trigger_runs", ["outcome", "seq"])
