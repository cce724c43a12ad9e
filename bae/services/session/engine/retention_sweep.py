"""The retention sweep: every BAE_RETENTION_INTERVAL, delete the closed and error sessions past their
retention ([retention] closed_session_days, or their profile's `retention`), archiving each first
when [retention] archive = "ndjson".

- One replica at a time: the sweep holds the store's lease `retention-sweep` (store/retention.py),
  renewed inside every deleting transaction, so a replica that lost it deletes nothing more.
- Turns do not notice: each transaction deletes at most DELETE_STEP events, and after each the
  sweep rests DUTY times as long as it took (at least MIN_PAUSE), so it has at most a fifth of
  the store's writer.
- An archive is `<archive_dir>/<session id>.ndjson`, the export's text, written to a temporary
  file, fsynced and renamed (the directory fsynced too) before the session's first row is deleted.
- SQLite then gives the freed pages back in steps (incremental vacuum); PostgreSQL's autovacuum
  reuses them by itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import TextIO

from bae.common.retention import Retention
from bae.services.session.engine.session_files import DELETE_STEP, count_deleted, cutoff, export_text
from bae.services.session.engine.tasks import TaskOwner
from bae.services.session.store import leases, retention
from bae.services.session.store.store import Store

log = logging.getLogger("bae.session.retention")

# Sessions listed per store read; the sweep lists again when it has deleted them.
BATCH = 50
DUTY = 4.0
MIN_PAUSE = 0.01
# Free pages given back per transaction (4 MiB of 4 KiB pages).
RECLAIM_PAGES = 1024


class RetentionSweep:
    def __init__(self, store: Store, retention: Retention, holder: str, interval: float, lease_seconds: float) -> None:
        self.store = store
        self.retention = retention
        self.holder = holder  # this replica's id
        self.interval = interval
        # Longer than any one step takes, so the holder keeps it while it works.
        self.lease_seconds = max(lease_seconds, 30.0)
        self._tasks = TaskOwner("retention")

    def start(self) -> None:
        self._tasks.spawn(self._run(), name="sweep")

    async def stop(self) -> None:
        """Shutdown: a sweep under way stops between two transactions and gives its lease back."""
        await self._tasks.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sweep()
            except Exception:  # the next interval tries again; nothing half-deleted stays hidden
                log.exception("retention sweep failed")

    async def sweep(self) -> int:
        """One sweep; returns how many sessions it deleted (0 when another replica holds the lease)."""
        overrides = await self.store.read(retention.retention_overrides)
        if self.retention.closed_session_days is None and not overrides:
            return 0
        if not await self.store.write(leases.take_duty, retention.SWEEP_LEASE, self.holder, time.time(),
                                      self.lease_seconds):
            return 0
        deleted = 0
        try:
            at = time.time()
            default = self.retention.closed_session_days
            default_before = None if default is None else cutoff(default, at)
            profile_before = {pid: cutoff(days, at) for pid, days in overrides.items()}
            while True:
                ids = await self.store.read(retention.expired, default_before, profile_before, BATCH)
                if not ids:
                    break
                for session_id in ids:
                    if not await self._sweep_one(session_id):
                        return deleted
                    deleted += 1
            if deleted:
                await self._reclaim()
        finally:
            await self.store.write(leases.release_duty, retention.SWEEP_LEASE, self.holder)
        if deleted:
            log.info("retention sweep deleted %d session(s)", deleted)
        return deleted

    async def _sweep_one(self, session_id: str) -> bool:
        """Archive (when asked) and delete one session; False when the lease was lost."""
        if self.retention.archive == "ndjson":
            assert self.retention.archive_dir is not None  # required with it ([retention] reading)
            # Renewed first: a long archive must not outlast the lease another replica could then take.
            if not await self.store.write(leases.take_duty, retention.SWEEP_LEASE, self.holder, time.time(),
                                          self.lease_seconds):
                return False
            await self._archive(session_id, Path(self.retention.archive_dir))
        size = 0
        while True:
            started = time.monotonic()
            step = await self.store.write(
                retention.sweep_step, self.holder, time.time(), self.lease_seconds, session_id, DELETE_STEP
            )
            await asyncio.sleep(max(MIN_PAUSE, DUTY * (time.monotonic() - started)))
            if step is False:
                log.warning("retention sweep stopped: another replica holds its lease")
                return False
            if step is None:
                return True  # deleted meanwhile (DELETE, purge)
            size += step.bytes
            if step.done:
                count_deleted(size, "sweep")
                return True

    async def _archive(self, session_id: str, directory: Path) -> None:
        pieces = await export_text(self.store, session_id)
        if pieces is None:
            return
        loop = asyncio.get_running_loop()
        partial = directory / f".{session_id}.ndjson.partial"
        file = await loop.run_in_executor(None, _open_partial, directory, partial)
        try:
            async for piece in pieces:
                await loop.run_in_executor(None, file.write, piece)
            await loop.run_in_executor(None, _keep, file, partial, directory / f"{session_id}.ndjson")
        finally:
            file.close()

    async def _reclaim(self) -> None:
        before: int | None = None
        while True:
            started = time.monotonic()
            left = await self.store.write(retention.reclaim, RECLAIM_PAGES)
            if not left or (before is not None and left >= before):
                return
            before = left
            await asyncio.sleep(max(MIN_PAUSE, DUTY * (time.monotonic() - started)))


def _open_partial(directory: Path, partial: Path) -> TextIO:
    directory.mkdir(parents=True, exist_ok=True)
    return open(partial, "w", encoding="utf-8")


def _keep(file: TextIO, partial: Path, final: Path) -> None:
    """The archive durable under its final name: its bytes fsynced, renamed, the rename fsynced."""
    file.flush()
    os.fsync(file.fileno())
    os.replace(partial, final)
    handle = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
