"""Provider requests stored by reference (store/requests.py): each message text of a session's
requests once in `request_messages`, and each `provider.request` row without its `messages` array.

The conversion walks every session's requests in order, as the writer does: a request stores the
messages after the prefix it shares with the session's previous request. A request whose text would
not come back byte for byte (or that has no `messages` array) stays whole. It runs in the migration's
one transaction, and logs its progress every PROGRESS_EVERY sessions.

Revision ID: 0006
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

from bae.common.jsontext import RawJson, dump
from bae.services.session.store.requests import common_prefix, runs, split

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

ID = sa.String(64)
PROGRESS_EVERY = 1000
log = logging.getLogger("bae.session.store")

# The tables as this revision leaves them (later revisions do not change what this one wrote).
_events = sa.table(
    "session_events",
    sa.column("seq", sa.Integer),
    sa.column("session_id", ID),
    sa.column("event_type", sa.String),
    sa.column("payload", sa.Text),
    sa.column("messages_at", sa.Integer),
    sa.column("messages_runs", sa.Text),
)
_messages = sa.table(
    "request_messages", sa.column("session_id", ID), sa.column("ordinal", sa.Integer), sa.column("text", sa.Text)
)


def upgrade() -> None:
    op.create_table(
        "request_messages",
        sa.Column("session_id", ID, primary_key=True),
        sa.Column("ordinal", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("text", sa.Text, nullable=False),
    )
    with op.batch_alter_table("session_events") as batch:
        batch.add_column(sa.Column("messages_at", sa.Integer, nullable=True))
        batch.add_column(sa.Column("messages_runs", sa.Text, nullable=True))
    _convert(op.get_bind())


def _convert(conn: sa.Connection) -> None:
    session_ids = list(
        conn.execute(sa.select(_events.c.session_id).where(_events.c.event_type == "provider.request").distinct()).scalars()
    )
    for done, session_id in enumerate(session_ids, 1):
        _convert_session(conn, session_id)
        if done % PROGRESS_EVERY == 0:
            log.info("storing provider requests by reference: %d of %d sessions", done, len(session_ids))


def _convert_session(conn: sa.Connection, session_id: str) -> None:
    requests = conn.execute(
        sa.select(_events.c.seq, _events.c.payload)
        .where(sa.and_(_events.c.session_id == session_id, _events.c.event_type == "provider.request"))
        .order_by(_events.c.seq)
    ).all()
    texts: list[str] = []
    ordinals: list[int] = []
    last = 0
    for seq, payload in requests:
        parts = split(RawJson(payload), payload)
        if parts is None:
            continue
        shared = common_prefix(texts, parts.texts)
        new = parts.texts[shared:]
        if new:
            conn.execute(
                sa.insert(_messages),
                [{"session_id": session_id, "ordinal": last + 1 + i, "text": text} for i, text in enumerate(new)],
            )
        texts, ordinals = parts.texts, ordinals[:shared] + list(range(last + 1, last + 1 + len(new)))
        last += len(new)
        conn.execute(
            sa.update(_events)
            .where(_events.c.seq == seq)
            .values(payload=parts.head + parts.tail, messages_at=len(parts.head), messages_runs=dump(runs(ordinals)))
        )
