"""HTTP trigger runs (docs/engine.md, "HTTP triggers"): a call's session is opened on the replica
that took the call, which owns it from then on, and its one turn runs there in the background
(engine/fire.py, as a schedule's run), closing the session afterwards when `close_after` says so.

A caller that waits watches the turn as a session.sendMessage caller would; one that goes away
stops watching only: the turn, the close and the run's outcome go on without it.

A replica that stops mid-turn leaves its runs `running`: unlike a schedule's runs they are not
resumed (the caller already has its answer, and running the turn again could repeat its tool calls).
"""

from __future__ import annotations

import asyncio
import logging

from bae.common.errors import BaeError
from services.session.engine.domain import TurnEnd, TurnOutcome
from services.session.engine.errors import EngineError
from services.session.engine.feed import Watcher
from services.session.engine.fire import Fire, ServerDeclarations
from services.session.engine.tasks import TaskOwner
from services.session.store import triggers
from services.session.store.opening import Refused
from services.session.store.records import KeyRecord, TriggerRecord, TriggerRunRecord
from services.session.store.store import Store
from services.session.store.triggers import Call, Outcome, Repeated, Started

log = logging.getLogger("bae.session.triggers")

# A run's detail is bounded: an error's text can be long.
MAX_DETAIL_CHARS = 1000


class TriggerRuns:
    def __init__(self, *, store: Store, fire: Fire) -> None:
        self.store = store
        self.fire = fire
        self._runs = TaskOwner("trigger-runs")

    async def stop(self) -> None:
        """Shutdown: turns under way stop where they are; their runs stay `running`."""
        await self._runs.cancel()

    async def start(self, trigger: TriggerRecord, key: KeyRecord, call: Call) -> Started | Repeated:
        """The call's run and session, opened on this replica in one transaction; or the earlier
        run of a repeated Idempotency-Key. A refused open raises its error (profile or provider
        unavailable, quota exceeded), KeyReused a key used with another body."""
        outcome = await self.store.write(
            triggers.start_run, call, key, ServerDeclarations(client_version=f"trigger {trigger.id}"), self.fire.vetting
        )
        if isinstance(outcome, Refused):
            raise outcome.error
        if isinstance(outcome, Started):
            await self.fire.opened(key, outcome.opened)
        return outcome

    def run(
        self, trigger: TriggerRecord, run: TriggerRunRecord, key_id: str, message: str, watcher: Watcher | None
    ) -> asyncio.Task[TurnOutcome]:
        """Run the session's turn in the background; the task ends with the turn's outcome (or its
        error), after the close and the run's outcome are recorded."""
        assert run.session_id is not None  # a started run has its session
        return self._runs.spawn(
            self._run(trigger, run.id, run.session_id, key_id, message, watcher), name=f"trigger-run:{run.id}"
        )

    async def _run(
        self, trigger: TriggerRecord, run_id: str, session_id: str, key_id: str, message: str, watcher: Watcher | None
    ) -> TurnOutcome:
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
        await self._end(trigger, run_id, session_id, key_id, *turn_outcome(ended.end))
        return ended

    async def _end(
        self, trigger: TriggerRecord, run_id: str, session_id: str, key_id: str, outcome: str, detail: str | None
    ) -> None:
        if trigger.close_after:
            try:
                await self.fire.close(session_id, key_id)
            except Exception:  # the outcome stands: it is what the turn did
                log.exception("closing session %s of trigger run %s failed", session_id, run_id)
        await self.store.write(triggers.finish, run_id, outcome, detail[:MAX_DETAIL_CHARS] if detail else None)


def turn_outcome(end: TurnEnd) -> tuple[str, str | None]:
    if end == TurnEnd.COMPLETED:
        return Outcome.COMPLETED, None
    if end == TurnEnd.PAUSED:
        return Outcome.FAILED, "the turn paused for client tools, which a trigger's call cannot answer"
    return Outcome.FAILED, "the provider is currently unavailable; the session is in error"
