"""The session service's observable gauges (TELEMETRY §4, §10.4).

Gauges are read by the metric reader on its own thread. The five database gauges share one
count query per collection (cached 250 ms), run on the store's thread through this process's
event loop; the in-memory gauges count this replica's live sessions.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable

from bae.common import telemetry
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.store import Store
from bae.services.session.store.stats import activity_counts

log = logging.getLogger("bae.session.telemetry")

COUNTS_CACHE_SECONDS = 0.25
COUNT_QUERY_TIMEOUT = 5.0


class ActivityCounts:
    """The five database gauges' values: one query per collection, or none when it fails."""

    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._loop = loop
        self._lock = threading.Lock()
        self._at = 0.0
        self._values: tuple[int, ...] | None = None

    def _refresh(self) -> None:
        try:
            future = asyncio.run_coroutine_threadsafe(self._store.write(activity_counts), self._loop)
            self._values = future.result(COUNT_QUERY_TIMEOUT)
        except Exception as exc:  # no data point this collection, never a false zero
            self._values = None
            log.warning("telemetry activity gauges skipped: count query failed: %s", exc)
        self._at = time.monotonic()

    def value(self, index: int) -> int | None:
        with self._lock:
            if time.monotonic() - self._at > COUNTS_CACHE_SECONDS:
                self._refresh()
            return None if self._values is None else self._values[index]


def register_gauges(registry: SessionRegistry, store: Store) -> None:
    """The session service's ten gauges (each only when metrics are on and it is not disabled)."""
    counts = ActivityCounts(store, asyncio.get_running_loop())
    def db_count(index: int) -> Callable[[], int | None]:
        return lambda: counts.value(index)

    for index, name in enumerate(telemetry.STORE_GAUGES):
        telemetry.observe(name, db_count(index))

    def live_count(measure: Callable[..., int]) -> Callable[[], int]:
        # A copy of the values: the loop thread may add or drop sessions meanwhile.
        return lambda: sum(measure(live) for live in registry.all())

    telemetry.observe("bae.mcp.sessions.live", live_count(lambda live: live.mcp is not None))
    telemetry.observe("bae.turns.pending", live_count(lambda live: live.gate.parked is not None))
    telemetry.observe("bae.sandboxes.live", live_count(lambda live: live.sandbox is not None))
    telemetry.observe("bae.drivers.registered", live_count(lambda live: len(live.drivers)))
    telemetry.observe("bae.subagents.active", live_count(lambda live: len(live.subagents.running())))
