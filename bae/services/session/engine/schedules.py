"""The schedule ticker: every replica looks for due ticks each TICK_INTERVAL, and the store decides
which one fires each (docs/engine.md, "Schedules").

- Exactly once per tick. A tick fires only after its run row is inserted, and the runs table's
  UNIQUE(schedule_id, scheduled_for) lets one insert succeed: that replica fires it, the others
  find it taken. The run's session is created in the transaction that records it on the run
  (opening.open_session_then), so a run has one session or none, never two.
- Late ticks and downtime. A pass fires every tick since the schedule's `checked_through` (how
  far the passes have looked), then moves it to the pass's start. A gap longer than DOWNTIME_GAP
  means no replica was ticking: the ticks missed then are collapsed by `catch_up` ("latest": the
  most recent runs once; "none": none runs).
- A replica that stops mid-run. A run row names the replica driving it. A running run whose
  replica no longer beats (or this replica's own, after a restart, that it is not driving) is
  taken over by a compare-and-swap on that name, and resumed from what the log shows: no session
  yet, it is opened; the message not sent yet, it is sent; the turn ended, its outcome is read
  from the log; the turn cut off by the stop, the run failed (the turn is not run again, which
  could repeat its tool calls). Then the session is closed as `close_after` says. A session whose
  lease another replica holds goes with its run to that replica.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone

from bae.common.errors import BaeError
from bae.common.timefmt import format_time
from bae.services.session.engine.errors import EngineError
from bae.services.session.engine.fire import Fire, stranded, turn_outcome
from bae.services.session.engine.ownership import NotOwner, Ownership
from bae.services.session.engine.schedule_times import timing
from bae.services.session.engine.tasks import TaskOwner
from bae.services.session.store import schedules
from bae.services.session.store.records import ScheduleRecord, ScheduleRunRecord
from bae.services.session.store.schedules import Outcome
from bae.services.session.store.store import Store

log = logging.getLogger("bae.session.schedules")

TICK_INTERVAL = 1.0
TEST_TICK_INTERVAL = 0.2
# A schedule not looked at for longer than this was missed by every replica (downtime): its missed
# ticks follow `catch_up`. Shorter gaps (a busy or restarting replica) fire every tick they hold.
DOWNTIME_GAP = 60.0
TEST_DOWNTIME_GAP = 5.0
SCHEDULES_PER_READ = 200
RUNNING_PER_READ = 200
QUEUE_POLL = 0.5
# A run's detail is bounded: an error's text can be long.
MAX_DETAIL_CHARS = 1000


class ScheduleTicker:
    def __init__(self, *, store: Store, fire: Fire, ownership: Ownership, test_seconds: bool) -> None:
        self.store = store
        self.fire = fire
        self.ownership = ownership
        self.test_seconds = test_seconds
        self.interval = TEST_TICK_INTERVAL if test_seconds else TICK_INTERVAL
        self.downtime_gap = TEST_DOWNTIME_GAP if test_seconds else DOWNTIME_GAP
        self._tasks = TaskOwner("schedules")
        self._runs = TaskOwner("schedule-runs")
        self._driving: set[str] = set()  # run ids this replica drives now
        self._unreadable: set[str] = set()  # schedules whose expression no longer reads, warned about once

    def start(self) -> None:
        self._tasks.spawn(self._ticking(), name="ticker")

    async def stop(self) -> None:
        """Shutdown: no more passes; runs under way stop where they are and stay `running`, to be
        resumed by a replica that finds them (this one after a restart)."""
        await self._tasks.cancel()
        await self._runs.cancel()

    async def _ticking(self) -> None:
        while True:
            try:
                await self.tick(time.time())
            except Exception:  # the next pass tries again; a tick not claimed yet is still due
                log.exception("schedule pass failed")
            await asyncio.sleep(self.interval)

    async def tick(self, now: float) -> None:
        """One pass: resume runs left by stopped replicas, then claim the due ticks."""
        await self._take_over_stranded()
        after_seq = 0
        while True:
            page = await self.store.read(schedules.enabled, after_seq, SCHEDULES_PER_READ)
            for seq, schedule in page:
                after_seq = seq
                await self._tick_one(schedule, now)
            if len(page) < SCHEDULES_PER_READ:
                return

    async def _tick_one(self, schedule: ScheduleRecord, now: float) -> None:
        try:
            when = timing(schedule.cron, schedule.timezone, test_seconds=self.test_seconds)
        except BaeError as exc:  # validated when written: a six-field test expression, the test setting off
            if schedule.id not in self._unreadable:
                self._unreadable.add(schedule.id)
                log.warning("schedule %s cannot tick: %s", schedule.id, exc)
            return
        until = datetime.fromtimestamp(now, timezone.utc)
        due = when.between(datetime.fromtimestamp(schedule.checked_through, timezone.utc), until)
        fired = due
        if due and now - schedule.checked_through > self.downtime_gap:
            fired = due[-1:] if schedule.catch_up == "latest" else []
        for tick in fired:
            run = await self.store.write(schedules.claim_tick, schedule, format_time(tick), self.ownership.replica_id)
            if run is not None:
                self._drive(run)
        # Moved after each tick, and often enough that a running ticker never looks like downtime,
        # but not at every pass: a write per schedule per second would load the store for nothing.
        if due or now - schedule.checked_through > self.downtime_gap / 2:
            await self.store.write(schedules.advance, schedule.id, now)

    def _drive(self, run: ScheduleRunRecord) -> None:
        self._driving.add(run.id)  # before any await: the stranded-run check never takes it
        self._runs.spawn(self._run(run), name=f"run:{run.id}")

    async def _take_over_stranded(self) -> None:
        """Running runs whose replica stopped, or this replica's own it no longer drives (it restarted)."""
        running = await self.store.read(schedules.running, RUNNING_PER_READ)
        if not running:
            return
        live = {replica.id for replica in await self.ownership.replicas()}
        me = self.ownership.replica_id
        for run in stranded(running, live, me, self._driving):
            if await self.store.write(schedules.take_run, run.id, run.replica_id, me):
                log.info("resuming schedule run %s left by replica %s", run.id, run.replica_id)
                self._drive(run)

    async def _run(self, run: ScheduleRunRecord) -> None:
        try:
            outcome, detail = await self._outcome_of(run)
        except NotOwner as owner:
            # Its session's lease is still its stopped owner's (a later pass takes the run again), or a
            # live replica took the session over: the run goes to the lease's holder, which alone can
            # finish it (a replica's id is its address). Kept here, a live replica's session would
            # make every pass take the run again and fail to claim it.
            try:
                await self.store.write(schedules.take_run, run.id, self.ownership.replica_id, owner.address)
            finally:
                self._driving.discard(run.id)
            return
        except Exception:
            log.exception("schedule run %s failed", run.id)
            outcome, detail = Outcome.FAILED, "internal error"
        try:
            await self.store.write(schedules.finish, run.id, outcome, detail[:MAX_DETAIL_CHARS] if detail else None)
        finally:
            self._driving.discard(run.id)

    async def _outcome_of(self, run: ScheduleRunRecord) -> tuple[str, str | None]:
        schedule = await self.store.read(schedules.get, run.schedule_id)
        if schedule is None:
            return Outcome.FAILED, "the schedule was deleted"
        if schedule.overlap == "queue":
            await self._after_earlier_runs(schedule.id, run.scheduled_for)
        session_id = run.session_id
        sent: tuple[str, str | None] | None
        try:
            if session_id is None:
                key = await self.store.read(schedules.active_client_key, schedule.client_key_id)
                if key is None or key.profile_id != schedule.profile_id:
                    return Outcome.FAILED, f"client key {schedule.client_key_id} is not an active key of the profile"
                opened = await self.fire.open(key, f"schedule {schedule.id}", schedules.binder(run.id))
                session_id = opened.session_id
                sent = None
            else:
                await self.ownership.claim(session_id)  # NotOwner until its dead owner's lease lapses
                sent = await self.fire.logged_outcome(session_id)
            if sent is None:
                ended = await self.fire.drive(session_id, schedule.client_key_id, schedule.message)
                sent = turn_outcome(ended.end, "a schedule")
        except (BaeError, EngineError) as exc:
            sent = Outcome.FAILED, str(exc)
        if schedule.close_after and session_id is not None:
            try:
                await self.fire.close(session_id, schedule.client_key_id)
            except Exception:  # the outcome stands: it is what the log says of the turn
                log.exception("closing session %s of schedule run %s failed", session_id, run.id)
        return sent

    async def _after_earlier_runs(self, schedule_id: str, scheduled_for: str) -> None:
        """Overlap "queue": wait until no earlier run of the schedule runs. They may run on any
        replica, so only the store can tell: it is asked every QUEUE_POLL seconds."""
        while True:
            if await self.store.read(schedules.running_before, schedule_id, scheduled_for) is None:
                return
            await asyncio.sleep(QUEUE_POLL)
