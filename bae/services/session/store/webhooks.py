"""Webhook rows and their outbox of deliveries (docs/guides/webhooks.md).

Events owed to webhooks are queued by `events.append`, in its transaction (events.queue_deliveries):
an event and what it owes are committed together or not at all. A pass first makes those outbox rows
deliveries (`expand`, one row per event and webhook, in one transaction that deletes the outbox rows
it read, so two replicas never expand one twice), then claims due deliveries. A delivery names its
event, and its body is made from the stored event when it is claimed. The deliverer (engine/webhook_delivery.py) claims due rows by a
compare-and-swap on `next_attempt_at`, so any number of replicas may deliver without sending one
attempt twice at once, and a deliverer killed mid-attempt leaves its rows due again after the claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence, Unpack

from sqlalchemy import Connection, Row, and_, bindparam, delete, insert, select, update

from bae.common.ids import new_id
from bae.common.jsontext import dump
from bae.common.timefmt import now
from bae.common.webhooks import PREVIOUS_SECRET_SECONDS, new_secret
from bae.services.session.store import events
from bae.services.session.store.schema import webhook_deliveries, webhook_outbox, webhooks

# Outbox rows a claim expands first: a turn queues about 4, and a pass claims at most 50 deliveries.
EXPAND_BATCH = 500
# Due rows read per row a claim may take: room to pass over a busy webhook's rows to other webhooks'.
CANDIDATES = 4
PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"
# The error of a delivery whose event was deleted before it was sent.
EVENT_GONE = "the event no longer exists: its session was deleted before the delivery was sent"


@dataclass(frozen=True)
class WebhookRecord:
    """A webhook as the API shows it: never its secrets."""

    id: str
    url: str
    event_types: list[str]
    profile_id: str | None
    enabled: bool
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class DeliveryRecord:
    id: str
    webhook_id: str
    event_id: str
    event_type: str
    state: str
    attempts: int
    last_status: int | None
    last_error: str | None
    next_attempt_at: float | None
    created_at: str
    delivered_at: str | None


@dataclass(frozen=True)
class DueDelivery:
    """A claimed delivery with what its attempt needs: the body (made from its stored event), the URL and
    the secrets to sign with."""

    id: str
    webhook_id: str
    event_type: str
    payload: str
    attempts: int
    created_at: str
    url: str
    secrets: tuple[str, ...] = ()

    def __repr__(self) -> str:  # the secrets stay out of any log line that prints a delivery
        return f"DueDelivery(id={self.id!r}, webhook_id={self.webhook_id!r}, attempts={self.attempts})"


_PUBLIC = (
    webhooks.c.seq, webhooks.c.id, webhooks.c.url, webhooks.c.event_types, webhooks.c.profile_id,
    webhooks.c.enabled, webhooks.c.created_at, webhooks.c.updated_at,
)
_DELIVERY = (
    webhook_deliveries.c.seq, webhook_deliveries.c.id, webhook_deliveries.c.webhook_id,
    webhook_deliveries.c.event_id, webhook_deliveries.c.event_type, webhook_deliveries.c.state,
    webhook_deliveries.c.attempts, webhook_deliveries.c.last_status, webhook_deliveries.c.last_error,
    webhook_deliveries.c.next_attempt_at, webhook_deliveries.c.created_at, webhook_deliveries.c.delivered_at,
)
def record(row: Row[Any, Unpack[tuple[Any, ...]]]) -> WebhookRecord:
    return WebhookRecord(
        id=row.id, url=row.url, event_types=row.event_types, profile_id=row.profile_id, enabled=bool(row.enabled),
        created_at=row.created_at, updated_at=row.updated_at,
    )


def delivery_record(row: Row[Any, Unpack[tuple[Any, ...]]]) -> DeliveryRecord:
    return DeliveryRecord(
        id=row.id, webhook_id=row.webhook_id, event_id=row.event_id, event_type=row.event_type, state=row.state,
        attempts=row.attempts, last_status=row.last_status, last_error=row.last_error,
        next_attempt_at=row.next_attempt_at, created_at=row.created_at, delivered_at=row.delivered_at,
    )


def create(conn: Connection, fields: dict[str, Any]) -> tuple[WebhookRecord, str]:
    """A new webhook from validated fields (url, event_types, profile_id, enabled), and its secret."""
    stamp = now()
    secret = new_secret()
    row = {"id": new_id("wh_"), **fields, "secret": secret, "created_at": stamp, "updated_at": stamp}
    conn.execute(insert(webhooks), row)
    return WebhookRecord(
        id=row["id"], url=fields["url"], event_types=fields["event_types"], profile_id=fields["profile_id"],
        enabled=fields["enabled"], created_at=stamp, updated_at=stamp,
    ), secret


def get(conn: Connection, webhook_id: str) -> WebhookRecord | None:
    row = conn.execute(select(*_PUBLIC).where(webhooks.c.id == webhook_id)).first()
    return None if row is None else record(row)


def page(conn: Connection, after_seq: int, limit: int) -> list[tuple[int, WebhookRecord]]:
    rows = conn.execute(select(*_PUBLIC).where(webhooks.c.seq > after_seq).order_by(webhooks.c.seq).limit(limit))
    return [(row.seq, record(row)) for row in rows]


def replace(conn: Connection, webhook_id: str, fields: dict[str, Any]) -> WebhookRecord | None:
    """Replace a webhook's url, event_types, profile_id and enabled (its secrets stay); None: no such webhook."""
    changed = conn.execute(
        update(webhooks).where(webhooks.c.id == webhook_id).values(**fields, updated_at=now())
    ).rowcount
    return get(conn, webhook_id) if changed else None


def delete_one(conn: Connection, webhook_id: str) -> bool:
    """Delete a webhook and its delivery log (pending deliveries are dropped); False: no such webhook."""
    if not conn.execute(delete(webhooks).where(webhooks.c.id == webhook_id)).rowcount:
        return False
    conn.execute(delete(webhook_deliveries).where(webhook_deliveries.c.webhook_id == webhook_id))
    return True


def rotate_secret(conn: Connection, webhook_id: str, at: float) -> str | None:
    """A new secret for the webhook; the current one stays valid PREVIOUS_SECRET_SECONDS. None: no such webhook."""
    current = conn.execute(select(webhooks.c.secret).where(webhooks.c.id == webhook_id)).scalar()
    if current is None:
        return None
    secret = new_secret()
    conn.execute(
        update(webhooks).where(webhooks.c.id == webhook_id).values(
            secret=secret, previous_secret=current, previous_expires_at=at + PREVIOUS_SECRET_SECONDS, updated_at=now()
        )
    )
    return secret


def any_due(conn: Connection, at: float) -> bool:
    """Whether some event waits in the outbox, or some delivery of an enabled webhook is due (a read: an
    idle deliverer's poll writes nothing)."""
    if conn.execute(select(webhook_outbox.c.seq).limit(1)).first() is not None:
        return True
    due = (
        select(webhook_deliveries.c.seq)
        .select_from(webhook_deliveries.join(webhooks, webhooks.c.id == webhook_deliveries.c.webhook_id))
        .where(and_(webhook_deliveries.c.state == PENDING, webhook_deliveries.c.next_attempt_at <= at,
                    webhooks.c.enabled.is_(True)))
        .limit(1)
    )
    return conn.execute(due).first() is not None


def prune(conn: Connection, created_before: str, limit: int) -> int:
    """Delete up to `limit` delivered or failed deliveries queued before `created_before` (the log's
    retention); returns how many. Pending ones stay, whatever their age."""
    finished = and_(webhook_deliveries.c.state.in_((DELIVERED, FAILED)),
                    webhook_deliveries.c.created_at < created_before)
    chosen = select(webhook_deliveries.c.seq).where(finished).order_by(webhook_deliveries.c.seq).limit(limit)
    seqs = list(conn.execute(chosen).scalars())
    if seqs:
        conn.execute(delete(webhook_deliveries).where(webhook_deliveries.c.seq.in_(seqs)))
    return len(seqs)


def expand(conn: Connection, limit: int) -> int:
    """Make up to `limit` outbox rows, oldest first, their deliveries (one per event and webhook that
    still exists), due when the event was queued; returns how many outbox rows were taken. The rows are
    deleted by the statement that reads them, so no two expansions (replicas, on PostgreSQL) take one."""
    # SKIP LOCKED (PostgreSQL; SQLite's writes are serialized): rows another expansion holds are left to
    # it, so concurrent passes take different rows instead of waiting for the same ones.
    oldest = (
        select(webhook_outbox.c.seq).order_by(webhook_outbox.c.seq).limit(limit)
        .with_for_update(skip_locked=True).scalar_subquery()
    )
    taken = conn.execute(
        delete(webhook_outbox).where(webhook_outbox.c.seq.in_(oldest)).returning(
            webhook_outbox.c.event_id, webhook_outbox.c.event_type, webhook_outbox.c.webhook_ids,
            webhook_outbox.c.queued_at,
        )
    ).all()
    if not taken:
        return 0
    named = {webhook_id for row in taken for webhook_id in row.webhook_ids.split(",")}
    existing = set(conn.execute(select(webhooks.c.id).where(webhooks.c.id.in_(named))).scalars())
    stamp = now()
    rows = [
        {
            "id": new_id("msg_"), "webhook_id": webhook_id, "event_id": row.event_id, "event_type": row.event_type,
            "state": PENDING, "attempts": 0, "next_attempt_at": row.queued_at, "created_at": stamp,
        }
        for row in taken
        for webhook_id in row.webhook_ids.split(",")
        if webhook_id in existing  # a webhook deleted since: nothing to deliver
    ]
    if rows:
        conn.execute(insert(webhook_deliveries), rows)
    return len(taken)


def claim_due(
    conn: Connection, holder: str, at: float, until: float, limit: int, room: Callable[[str], int]
) -> list[DueDelivery]:
    """Claim up to `limit` due deliveries of enabled webhooks for replica `holder` until `until`, oldest due
    first, and at most `room(webhook_id)` of each webhook (what its concurrency bound leaves free), so the
    rows of a slow receiver are never claimed to wait in line while their claims run out.

    The claim is one compare-and-swap: a chosen row is taken only if it is still pending and due, so a
    row another deliverer claimed between the read and the update (its `next_attempt_at` moved past
    `at`) is skipped. The outbox is expanded first (EXPAND_BATCH rows), in the same transaction."""
    expand(conn, EXPAND_BATCH)
    rows = conn.execute(
        select(
            webhook_deliveries.c.id, webhook_deliveries.c.webhook_id, webhook_deliveries.c.event_id,
            webhook_deliveries.c.attempts, webhook_deliveries.c.created_at, webhooks.c.url, webhooks.c.secret,
            webhooks.c.previous_secret, webhooks.c.previous_expires_at,
        )
        .select_from(webhook_deliveries.join(webhooks, webhooks.c.id == webhook_deliveries.c.webhook_id))
        .where(and_(
            webhook_deliveries.c.state == PENDING,
            webhook_deliveries.c.next_attempt_at <= at,
            webhooks.c.enabled.is_(True),
        ))
        .order_by(webhook_deliveries.c.next_attempt_at)
        .limit(limit * CANDIDATES)
    ).all()
    chosen: list[Row[Any, Unpack[tuple[Any, ...]]]] = []
    left: dict[str, int] = {}
    for row in rows:
        if len(chosen) == limit:
            break
        if left.setdefault(row.webhook_id, room(row.webhook_id)) > 0:
            left[row.webhook_id] -= 1
            chosen.append(row)
    if not chosen:
        return []
    taken = set(conn.execute(
        update(webhook_deliveries)
        .where(and_(
            webhook_deliveries.c.id.in_([row.id for row in chosen]),
            webhook_deliveries.c.state == PENDING,
            webhook_deliveries.c.next_attempt_at <= at,
        ))
        .values(next_attempt_at=until, claimed_by=holder)
        .returning(webhook_deliveries.c.id)
    ).scalars())
    mine = [row for row in chosen if row.id in taken]
    bodies = events.wire_texts(conn, list({row.event_id for row in mine}))
    claimed: list[DueDelivery] = []
    orphans: list[str] = []
    for row in mine:
        if row.event_id not in bodies:
            orphans.append(row.id)
            continue
        event_type, created_at, text = bodies[row.event_id]
        in_use: tuple[str, ...] = (row.secret,)
        if row.previous_secret is not None and row.previous_expires_at is not None and row.previous_expires_at > at:
            in_use += (row.previous_secret,)
        claimed.append(DueDelivery(
            id=row.id, webhook_id=row.webhook_id, event_type=event_type,
            payload='{"type":' + dump(event_type) + ',"timestamp":' + dump(created_at) + ',"data":' + text + "}",
            attempts=row.attempts, created_at=row.created_at, url=row.url, secrets=in_use,
        ))
    if orphans:  # the session was deleted (or its events pruned) before they were sent: nothing to send
        conn.execute(
            update(webhook_deliveries).where(webhook_deliveries.c.id.in_(orphans)).values(
                state=FAILED, next_attempt_at=None, claimed_by=None, last_error=EVENT_GONE,
            )
        )
    return claimed


@dataclass(frozen=True)
class AttemptResult:
    """What one attempt ended with: delivered, due again at `next_attempt_at`, or failed (neither).
    `gone` (a 410) also disables the delivery's webhook."""

    delivery_id: str
    webhook_id: str
    status: int | None
    error: str | None
    next_attempt_at: float | None
    delivered: bool
    gone: bool


def record_attempts(conn: Connection, results: Sequence[AttemptResult]) -> None:
    """The outcomes of a pass's attempts, in one statement (and one more when a receiver answered 410:
    its webhook is disabled, which stops its other deliveries being claimed)."""
    if not results:
        return
    stamp = now()
    conn.execute(
        update(webhook_deliveries)
        .where(webhook_deliveries.c.id == bindparam("b_id"))
        .values(
            state=bindparam("b_state"), attempts=webhook_deliveries.c.attempts + 1, last_status=bindparam("b_status"),
            last_error=bindparam("b_error"), next_attempt_at=bindparam("b_next"), claimed_by=None,
            delivered_at=bindparam("b_delivered_at"),
        ),
        [
            {
                "b_id": result.delivery_id,
                "b_state": DELIVERED if result.delivered else PENDING if result.next_attempt_at is not None else FAILED,
                "b_status": result.status, "b_error": result.error, "b_next": result.next_attempt_at,
                "b_delivered_at": stamp if result.delivered else None,
            }
            for result in results
        ],
    )
    gone = {result.webhook_id for result in results if result.gone}
    if gone:
        conn.execute(update(webhooks).where(webhooks.c.id.in_(gone)).values(enabled=False, updated_at=stamp))


def release_claims(conn: Connection, holder: str, at: float) -> int:
    """Make the deliveries replica `holder` had claimed due now (its previous process died mid-attempt:
    they may or may not have reached their receiver, so they are sent again); returns how many."""
    return int(conn.execute(
        update(webhook_deliveries)
        .where(and_(webhook_deliveries.c.claimed_by == holder, webhook_deliveries.c.state == PENDING))
        .values(next_attempt_at=at, claimed_by=None)
    ).rowcount)


def deliveries_page(
    conn: Connection, webhook_id: str, after_seq: int, limit: int
) -> list[tuple[int, DeliveryRecord]] | None:
    """A page of a webhook's delivery log, oldest first; None: no such webhook."""
    if get(conn, webhook_id) is None:
        return None
    rows = conn.execute(
        select(*_DELIVERY)
        .where(and_(webhook_deliveries.c.webhook_id == webhook_id, webhook_deliveries.c.seq > after_seq))
        .order_by(webhook_deliveries.c.seq)
        .limit(limit)
    )
    return [(row.seq, delivery_record(row)) for row in rows]


def retry(conn: Connection, webhook_id: str, delivery_id: str, at: float) -> DeliveryRecord | None:
    """Make a delivery due now again, whatever its state (same webhook-id); None: no such delivery."""
    which = and_(webhook_deliveries.c.id == delivery_id, webhook_deliveries.c.webhook_id == webhook_id)
    retried = update(webhook_deliveries).where(which).values(state=PENDING, next_attempt_at=at, claimed_by=None)
    if not conn.execute(retried).rowcount:
        return None
    row = conn.execute(select(*_DELIVERY).where(which)).first()
    assert row is not None  # updated just now, in this transaction
    return delivery_record(row)
