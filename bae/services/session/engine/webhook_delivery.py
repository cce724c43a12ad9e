"""The webhook deliverer: a background part of every session replica that sends the outbox's due
deliveries (store/webhooks.py) to their receivers, as Standard Webhooks requests.

- Turns never wait for it: events only queue rows, in their own transaction; this loop reads them.
- Claim-based, so replicas share the work: a claim moves a row's `next_attempt_at` past its attempt
  (CLAIM_SECONDS), and a replica killed mid-attempt leaves the row due again when the claim runs out,
  or at once when it starts again (its claims carry its id, which a restart keeps).
  Delivery is at least once; the `webhook-id` (the row's id) is the same on every attempt.
- A pass claims what may start now, sends it all at once and records every outcome in one
  transaction when its last attempt ends (within the transport's timeout, well inside the claim):
  a store write per pass, not per delivery, since each costs the turns' writer as much as a send.
- 2xx: delivered. 410: the webhook is disabled. Anything else (or no answer): retried after
  bae.common.webhooks.retry_delay, until BAE_WEBHOOK_MAX_AGE after the delivery was queued; then failed.
- The URL's host is resolved and every address checked again before each attempt (its DNS may have
  changed since the webhook was created); the attempt connects to the checked address.
- Turns first: a pass that is not catching up on a backlog waits for this replica to have no turn
  running (TURNS_FIRST_SECONDS at most), and for the last one's answer to leave, since its sends
  take CPU the turn's loop would want. A replica always busy still sends every TURNS_FIRST_SECONDS,
  and a backlog is sent back to back.
  While webhooks have had work lately (ACTIVE_SECONDS), a turn's end starts a pass too: what it
  queued goes out right after it, before the next turn, instead of piling up to the next poll.
- At most PER_WEBHOOK attempts run at once per webhook (per replica), and TOTAL in all: a webhook's rows
  past its bound are not claimed, so one slow receiver neither takes every slot nor holds claims it
  cannot start on.
- The delivery log keeps delivered and failed deliveries LOG_DAYS after they were queued; each replica
  prunes older ones about hourly, a batch per transaction, so the outbox does not grow without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import nullcontext, suppress
from typing import Any, Protocol
from datetime import datetime, timezone

from opentelemetry.trace import SpanKind, Status, StatusCode

from bae.common import telemetry
from bae.common.timefmt import format_time
from bae.common.webhooks import RefusedAddress, WebhookSettings, check_addresses, parse_url, retry_delay, \
    signature_header
from bae.services.session.engine.ports import WebhookAnswer, WebhookTransport
from bae.services.session.engine.tasks import TaskOwner
from bae.services.session.store import webhooks
from bae.services.session.store.store import Store
from bae.services.session.store.webhooks import DueDelivery

log = logging.getLogger("bae.session.webhooks")

DELIVERIES = "bae.webhook.deliveries"
LATENCY = "bae.webhook.latency"
# Longer than an attempt may take (the transport's timeout), so a claim never runs out mid-attempt.
CLAIM_SECONDS = 60.0
BATCH = 50
PER_WEBHOOK = 4
TOTAL = 32
LOG_DAYS = 7
PRUNE_SECONDS = 3600.0
PRUNE_BATCH = 500
# The longest a pass waits for the turns running on this replica to end.
TURNS_FIRST_SECONDS = 0.5
# Seconds a pass waits after the turns ended, for the last one's answer to leave.
SETTLE_SECONDS = 0.01
# Seconds after the last work found that a turn's end still starts a pass (then only polls do).
ACTIVE_SECONDS = 60.0


class Turns(Protocol):
    """The turns of this replica, as the deliverer defers to them (TurnEngine)."""

    def busy(self) -> bool:
        """Whether a turn or a compaction runs now."""
        ...

    async def quiet(self) -> None:
        """Return once no turn or compaction runs."""
        ...

    async def next_end(self) -> None:
        """Return when a turn or a compaction ends."""
        ...


class WebhookDeliverer:
    def __init__(
        self, store: Store, transport: WebhookTransport, settings: WebhookSettings, *, holder: str, max_age: float,
        backoff_scale: float, poll_interval: float, turns: Turns | None = None,
    ) -> None:
        self.store = store
        self.turns = turns
        self.holder = holder  # this replica's id: its claims carry it
        self.transport = transport
        self.settings = settings
        self.max_age = max_age
        self.backoff_scale = backoff_scale  # test-only (BAE_WEBHOOK_BACKOFF_SCALE): 1 in production
        self.poll_interval = poll_interval
        self._tasks = TaskOwner("webhooks")
        self._passes = TaskOwner("webhook-pass")
        self._in_flight: dict[str, int] = {}  # attempts started and not ended, by webhook
        self._backlog = False  # the last pass claimed all it could: more may be due
        self._turn_ended = False  # what woke the loop last was a turn's end
        self._active_at = -ACTIVE_SECONDS  # time.monotonic() when work was last found
        self._wake = asyncio.Event()

    def start(self) -> None:
        self._tasks.spawn(self._run(), name="deliver")

    @property
    def _sending(self) -> int:
        """Attempts started and not ended, in all."""
        return sum(self._in_flight.values())

    def wake(self) -> None:
        """Look for due deliveries now instead of at the next poll (after a retry asked for one)."""
        self._wake.set()

    async def stop(self) -> None:
        """Shutdown: attempts under way are cancelled; their rows are due again when this replica starts
        again, or when their claims run out."""
        await self._tasks.cancel()
        await self._passes.cancel()

    async def _run(self) -> None:
        # A replica keeps its id across restarts (its address): what it held when it died is due again now.
        try:
            released = await self.store.write(webhooks.release_claims, self.holder, time.time())
        except Exception:  # the store is not there yet: those claims run out by themselves
            log.exception("releasing this replica's earlier webhook claims failed")
            released = 0
        if released:
            log.info("sending again %d webhook delivery(ies) under way when this replica stopped", released)
        pruned_at = 0.0
        while True:
            if time.monotonic() - pruned_at > PRUNE_SECONDS:
                pruned_at = time.monotonic()
                await self._prune()
            if not self._backlog:
                await self._turns_first()
            try:
                claimed = await self.deliver_due()
            except Exception:  # the next poll tries again; a claimed row is due again after its claim
                log.exception("webhook delivery pass failed")
                claimed = 0
            if claimed < BATCH:  # caught up (or every slot busy): wait for a poll, a retry or a free slot
                await self._wait_for_work()
                self._wake.clear()

    async def deliver_due(self) -> int:
        """Claim a batch of due deliveries and start their pass; returns how many were claimed."""
        # Claim no more than can start now: the rest stay due, for another replica or the next pass.
        free = min(BATCH, TOTAL - self._sending)
        if free <= 0:
            return 0
        at = time.time()
        # An idle deliverer's poll only reads; a busy one's next pass claims at once.
        if not self._sending and not await self.store.read(webhooks.any_due, at):
            return 0
        due = await self.store.write(webhooks.claim_due, self.holder, at, at + CLAIM_SECONDS, free, self._room)
        self._backlog = len(due) == free
        if due:
            self._active_at = time.monotonic()
            for delivery in due:
                self._in_flight[delivery.webhook_id] = self._in_flight.get(delivery.webhook_id, 0) + 1
            self._passes.spawn(self.deliver(due, counted=True), name=due[0].id)
        return len(due)

    async def _wait_for_work(self) -> None:
        """Until the next poll, a wake (a retry, a free slot), or, while webhooks have had work lately,
        the end of a turn."""
        waiting: list[asyncio.Task[Any]] = [asyncio.create_task(self._wake.wait())]
        ended: asyncio.Task[None] | None = None
        if self.turns is not None and time.monotonic() - self._active_at < ACTIVE_SECONDS:
            ended = asyncio.create_task(self.turns.next_end())
            waiting.append(ended)
        try:
            await asyncio.wait(waiting, timeout=self.poll_interval, return_when=asyncio.FIRST_COMPLETED)
            self._turn_ended = ended is not None and ended.done()
        finally:
            for waiter in waiting:
                waiter.cancel()

    async def _turns_first(self) -> None:
        """Wait until no turn runs on this replica (TURNS_FIRST_SECONDS at most), then, if one ran or just
        ended, SETTLE_SECONDS more for its answer to leave."""
        if self.turns is None or not (self._turn_ended or self.turns.busy()):
            return
        with suppress(TimeoutError):
            await asyncio.wait_for(self.turns.quiet(), TURNS_FIRST_SECONDS)
            await asyncio.sleep(SETTLE_SECONDS)

    def _room(self, webhook_id: str) -> int:
        return PER_WEBHOOK - self._in_flight.get(webhook_id, 0)

    async def _prune(self) -> None:
        before = format_time(datetime.fromtimestamp(time.time() - LOG_DAYS * 86400, timezone.utc))
        try:
            while True:
                if await self.store.write(webhooks.prune, before, PRUNE_BATCH) < PRUNE_BATCH:
                    return
                await asyncio.sleep(0.01)  # between batches: turns' writes go first
        except Exception:  # pruning is housekeeping: the next hour tries again
            log.exception("pruning the webhook delivery log failed")

    async def deliver(self, due: list[DueDelivery], *, counted: bool = False) -> list[str]:
        """Send every claimed delivery at once, then record their outcomes in one transaction; returns the
        outcomes (the metric's `outcome`), in order. `counted`: they hold slots of this deliverer's bounds,
        each freed when its attempt ends. A failed record leaves the rows claimed: sent again when the
        claims run out (at least once)."""
        ended = await asyncio.gather(*(self._attempt(delivery, counted) for delivery in due))
        await self.store.write(webhooks.record_attempts, [result for result, _ in ended])
        return [outcome for _, outcome in ended]

    async def _attempt(self, delivery: DueDelivery, counted: bool) -> tuple[webhooks.AttemptResult, str]:
        try:
            return await self._attempt_once(delivery)
        finally:
            if counted:
                self._free_slot(delivery.webhook_id)

    def _free_slot(self, webhook_id: str) -> None:
        left = self._in_flight[webhook_id] - 1
        if left:
            self._in_flight[webhook_id] = left
        else:
            del self._in_flight[webhook_id]
        self._wake.set()

    async def _attempt_once(self, delivery: DueDelivery) -> tuple[webhooks.AttemptResult, str]:
        started = time.perf_counter()
        span = None
        if telemetry.tracer is not None:
            # The URL and the secrets stay out of the span: ids and the outcome are enough to find a delivery.
            span = telemetry.tracer.start_span("bae.webhook.delivery", kind=SpanKind.CLIENT, attributes={
                "bae.webhook.id": delivery.webhook_id, "bae.webhook.delivery.id": delivery.id,
                "bae.webhook.event_type": delivery.event_type, "bae.webhook.attempt": delivery.attempts + 1,
            })
        with span if span is not None else nullcontext():
            answer = await self._send(delivery)
            result, outcome = self._judge(delivery, answer)
            if span is not None:
                span.set_attribute("bae.webhook.outcome", outcome)
                if answer.status is not None:
                    span.set_attribute("http.response.status_code", answer.status)
                if outcome != "delivered":
                    span.set_status(Status(StatusCode.ERROR, f"webhook delivery {outcome}"))
        telemetry.count(DELIVERIES, {"outcome": outcome})
        telemetry.record(LATENCY, (time.perf_counter() - started) * 1000, {"outcome": outcome})
        return result, outcome

    async def _send(self, delivery: DueDelivery) -> WebhookAnswer:
        try:
            target = parse_url(delivery.url)
            addresses = await self.transport.resolve(target.host, target.port)
            check_addresses(target, addresses, self.settings)
        except RefusedAddress as refused:
            return WebhookAnswer(None, f"refused: {refused}", refused=True)
        body = delivery.payload.encode()
        stamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "webhook-id": delivery.id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": signature_header(delivery.secrets, delivery.id, stamp, body),
        }
        return await self.transport.post(delivery.url, addresses[0], headers, body)

    def _judge(self, delivery: DueDelivery, answer: WebhookAnswer) -> tuple[webhooks.AttemptResult, str]:
        """What an answer means for its delivery: the row's next state, and the outcome's name."""
        status = answer.status
        delivered = status is not None and 200 <= status < 300
        gone = status == 410
        next_at: float | None = None
        if not delivered and not gone:
            at = time.time() + retry_delay(delivery.attempts + 1, self.backoff_scale)
            if at - _epoch(delivery.created_at) <= self.max_age:
                next_at = at
        result = webhooks.AttemptResult(
            delivery_id=delivery.id, webhook_id=delivery.webhook_id, status=status, error=answer.error,
            next_attempt_at=next_at, delivered=delivered, gone=gone,
        )
        if delivered:
            return result, "delivered"
        if gone:
            log.warning("webhook %s answered 410 Gone: disabled", delivery.webhook_id)
            return result, "gone"
        if next_at is None:
            log.warning("webhook delivery %s failed for good after %d attempt(s)", delivery.id, delivery.attempts + 1)
            return result, "failed"
        return result, "refused" if answer.refused else "retry"


def _epoch(stamp: str) -> float:
    """The epoch seconds of a store time (RFC 3339, Z)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()
