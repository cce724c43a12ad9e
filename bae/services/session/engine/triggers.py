"""HTTP trigger runs (docs/engine.md, "HTTP triggers"): a call's session is opened on the replica
that took the call, which owns it from then on, and its one turn runs there in the background
(engine/fire.py, as a schedule's run), closing the session afterwards when `close_after` says so.

A caller that waits watches the turn as a session.sendMessage caller would; one that goes away
stops watching only: the turn, the close and the run's outcome go on without it.

A replica that stops mid-run. A run row names the replica driving it (set in the transaction that
records the call). Every RESUME_INTERVAL seconds each replica looks for running runs whose replica
no longer beats (or its own, after a restart, that it does not drive), takes each by a
compare-and-swap on that name, claims the run's session once the stopped owner's lease has lapsed,
and finishes the run from what the session's log shows: the message not sent yet (the replica
stopped between the call's answer and the turn), it is sent as the call would have; the turn ended,
its outcome is read from the log; the turn cut off by the stop, the run failed (the turn is not run
again, which could repeat its tool calls). Then the session is closed as `close_after` says.
"""

from __future__ import annotations

import asyncio
import logging

from bae.common.errors import BaeError
from bae.services.session.engine.domain import TurnOutcome
from bae.services.session.engine.errors import EngineError
from bae.services.session.engine.feed import Watcher
from bae.services.session.engine.fire import Fire, ServerDeclarations, stranded, turn_outcome
from bae.services.session.engine.ownership import NotOwner, Ownership
from bae.services.session.engine.tasks import TaskOwner
from bae.services.session.store import triggers
from bae.services.session.store.opening import Refused
from bae.services.session.store.records import KeyRecord, TriggerRecord, TriggerRunRecord
from bae.services.session.store.store import Store
from bae.services.session.store.fired import Outcome
from bae.services.session.store.triggers import Call, Repeated, Started

log = logging.getLogger("bae.session.triggers")

# How often a replica looks for runs left by a stopped one: a few seconds, as the lease it waits for.
RESUME_INTERVAL = 3.0
RUNNING_PER_READ = 200
# A run's detail is bounded: an error's text can be long.
MAX_DETAIL_CHARS = 1000
OPENER = "a trigger's call"  # who cannot answer client tools


class TriggerRuns:
    def __init__(self, *, store: Store, fire: Fire, ownership: Ownership, interval: float = RESUME_INTERVAL) -> None:
        self.store = store
        self.fire = fire
        self.ownership = ownership
        self.interval = interval
        self._passes = TaskOwner("trigger-takeover")
        self._runs = TaskOwner("trigger-runs")
        self._driving: set[str] = set()  # run ids this replica drives now

    def start(self) -> None:
        """Look for runs left by stopped replicas, every `interval` seconds."""
        self._passes.spawn(self._taking_over(), name="passes")

    async def drain(self) -> None:
        """No more takeovers; turns under way go on."""
        await self._passes.cancel()

    async def stop(self) -> None:
        """Shutdown: turns under way stop where they are; their runs stay `running`, to be finished
        by a replica that finds them (this one after a restart)."""
        await self._passes.cancel()
        await self._runs.cancel()

    async def open(self, trigger: TriggerRecord, key: KeyRecord, call: Call) -> Started | Repeated:
        """The call's run and session, opened on this replica in one transaction; or the earlier
        run of a repeated Idempotency-Key. A refused open raises its error (profile or provider
        unavailable, quota exceeded), KeyReused a key used with another body."""
        run_id = triggers.new_run_id()
        self._driving.add(run_id)  # before the commit: a takeover pass never takes the run from its call
        try:
            outcome = await self.store.write(
                triggers.start_run, call, run_id, self.ownership.replica_id, key,
                ServerDeclarations(client_version=f"trigger {trigger.id}"), self.fire.vetting,
            )
            if isinstance(outcome, Refused):
                raise outcome.error
            if isinstance(outcome, Started):
                await self.fire.opened(key, outcome.opened)
        except BaseException:
            # A run that committed all the same (the call went away meanwhile) is not driven here:
            # a takeover pass sends its message.
            self._driving.discard(run_id)
            raise
        if not isinstance(outcome, Started):
            self._driving.discard(run_id)
        return outcome

    def run(
        self, trigger: TriggerRecord, run: TriggerRunRecord, key_id: str, watcher: Watcher | None
    ) -> asyncio.Task[TurnOutcome]:
        """Run the session's turn with the run's message in the background (`run` is what `open`
        started); the task ends with the turn's outcome (or its error), after the close and the
        run's outcome are recorded."""
        assert run.session_id is not None and run.message is not None  # a started run has both
        return self._runs.spawn(
            self._run(trigger, run.id, run.session_id, key_id, run.message, watcher), name=f"trigger-run:{run.id}"
        )

    async def _run(
        self, trigger: TriggerRecord, run_id: str, session_id: str, key_id: str, message: str, watcher: Watcher | None
    ) -> TurnOutcome:
        try:
            try:
                ended = await self.fire.drive(session_id, key_id, message, watcher)
            except asyncio.CancelledError:
                raise  # shutdown: the run stays `running`
            except (BaeError, EngineError) as exc:
                await self._end(trigger, run_id, session_id, key_id, Outcome.FAILED, str(exc))
                raise
            except Exception:
                log.exception("trigger run %s failed", run_id)
                await self._end(trigger, run_id, session_id, key_id, Outcome.FAILED, "internal error")
                raise
            await self._end(trigger, run_id, session_id, key_id, *turn_outcome(ended.end, OPENER))
            return ended
        finally:
            self._driving.discard(run_id)

    async def _end(
        self, trigger: TriggerRecord, run_id: str, session_id: str, key_id: str, outcome: str, detail: str | None
    ) -> None:
        if trigger.close_after:
            try:
                await self.fire.close(session_id, key_id)
            except Exception:  # the outcome stands: it is what the turn did
                log.exception("closing session %s of trigger run %s failed", session_id, run_id)
        await self._finish(run_id, outcome, detail)

    async def _finish(self, run_id: str, outcome: str, detail: str | None) -> None:
        await self.store.write(triggers.finish, run_id, outcome, detail[:MAX_DETAIL_CHARS] if detail else None)

    async def _taking_over(self) -> None:
        while True:
            try:
                await self.take_over()
            except Exception:  # the next pass tries again: a run not taken is still there
                log.exception("trigger run takeover pass failed")
            await asyncio.sleep(self.interval)

    async def take_over(self) -> None:
        """One pass: take the running runs no replica drives (their replica stopped, or this one
        restarted) and finish each in the background."""
        me = self.ownership.replica_id
        live: set[str] | None = None
        after_seq = 0
        while True:
            page = await self.store.read(triggers.running, after_seq, RUNNING_PER_READ)
            if not page:
                return
            after_seq = page[-1][0]
            if live is None:
                live = {replica.id for replica in await self.ownership.replicas()}
            for run in stranded([run for _, run in page], live, me, self._driving):
                if await self.store.write(triggers.take_run, run.id, run.replica_id, me):
                    log.info("finishing trigger run %s left by replica %s", run.id, run.replica_id)
                    self._driving.add(run.id)
                    self._runs.spawn(self._resume(run), name=f"trigger-resume:{run.id}")
            if len(page) < RUNNING_PER_READ:
                return

    async def _resume(self, run: TriggerRunRecord) -> None:
        try:
            try:
                await self._resumed(run)
            except NotOwner as owner:
                # The session's lease is still its stopped owner's (a later pass takes the run again),
                # or a live replica took the session over: the run goes to the lease's holder, which
                # alone can finish it (a replica's id is its address).
                await self.store.write(triggers.take_run, run.id, self.ownership.replica_id, owner.address)
            except asyncio.CancelledError:
                raise  # shutdown: the run stays `running`
            except Exception:
                log.exception("trigger run %s failed", run.id)
                await self._finish(run.id, Outcome.FAILED, "internal error")
        finally:
            self._driving.discard(run.id)

    async def _resumed(self, run: TriggerRunRecord) -> None:
        """Finish a run taken over from a stopped replica, from what its session's log says."""
        trigger = await self.store.read(triggers.get, run.trigger_id)
        if trigger is None:
            return await self._finish(run.id, Outcome.FAILED, "the trigger was deleted")
        session = await self.store.get_session(run.session_id) if run.session_id is not None else None
        if session is None:
            return await self._finish(run.id, Outcome.FAILED, "the session was deleted")
        await self.ownership.claim(session.id)  # NotOwner until its stopped owner's lease lapses
        try:
            sent = await self.fire.logged_outcome(session.id)
            if sent is None:
                assert run.message is not None  # a running run keeps its message
                ended = await self.fire.drive(session.id, session.client_key_id, run.message)
                sent = turn_outcome(ended.end, OPENER)
        except (BaeError, EngineError) as exc:
            sent = Outcome.FAILED, str(exc)
        await self._end(trigger, run.id, session.id, session.client_key_id, *sent)
