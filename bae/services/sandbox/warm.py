"""Warm sandboxes: per allowed image, BAE_SANDBOX_WARM started containers that no session holds yet.

Starting a container costs a few hundred milliseconds; a session's Start takes a
spare of its image instead when one is ready, and the pool makes a new one in
the background. A spare is made by the driver exactly as any sandbox (limits,
capabilities, network, init, read-only root, and a resident shell waiting for
its first command) and never runs a command before a session takes it, so a
taken spare is as fresh as a container started for that session.

Docker cannot relabel a container, so a spare carries the spare label where a
sandbox started for a session carries that session's id. Which session holds a
spare it took is kept here, in the host's memory, and List reports it from
there; a spare no session holds is left out of List, so the session service's
reconciliation never adopts (or stops) one. That memory lives exactly as long as
the containers it describes: a (re)started host removes every container of its
host id, spares and taken ones alike, and so does a clean shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any


from bae.common.errors import BaeError, Unprocessable
from bae.services.sandbox.driver import Driver

log = logging.getLogger("bae.sandbox")

# After a Docker failure, how long before the pool tries that image again.
RETRY_PAUSE = 2.0
# How long a shutdown waits for spares being started to exist, so that the removal that follows sees them.
SETTLE_TIMEOUT = 10.0


class WarmPool:
    def __init__(self, driver: Driver, size: int) -> None:
        self._driver = driver
        self._size = size
        self._images: frozenset[str] = frozenset()
        # Images whose spares cannot be started (e.g. not present): skipped until EnsureImage succeeds.
        self._unstartable: set[str] = set()
        self._spares: dict[str, deque[str]] = {}
        self._making: dict[str, int] = {}
        # Spares a session took: sandbox id -> session id.
        self._holders: dict[str, str] = {}
        self._wake = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._work: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self._size > 0

    def allow(self, images: frozenset[str]) -> None:
        """The allowed images changed: keep spares of these, and remove those of any other."""
        if not self.enabled:
            return
        self._images = images
        for image in [image for image in self._spares if image not in images]:
            for sandbox_id in self._spares.pop(image):
                self._spawn(self._discard(sandbox_id))
        self._refill()

    def ensured(self, image: str) -> None:
        """The image is present on this host now: spares of it can be started."""
        if self.enabled and image in self._unstartable:
            self._unstartable.discard(image)
            self._refill()

    def has_spare(self, image: str) -> bool:
        return bool(self._spares.get(image))

    async def take(self, session_id: str, image: str) -> str | None:
        """A running spare of `image`, now held by `session_id`; None when there is none."""
        spares = self._spares.get(image)
        while spares:
            # Taken from the deque before any await: no other Start can be given the same one.
            sandbox_id = spares.popleft()
            self._refill()
            try:
                running = await self._driver.running(sandbox_id)
            except BaseException:  # the Docker daemon failed, or the caller left: nobody will hold it
                self._spawn(self._discard(sandbox_id))
                raise
            if running:
                self._holders[sandbox_id] = session_id
                log.info("started sandbox %s (image %s, warm) for session %s", sandbox_id[:12], image, session_id)
                return sandbox_id
            log.warning("warm spare %s of %s is no longer running; discarded", sandbox_id[:12], image)
        return None

    def holder(self, sandbox_id: str) -> str | None:
        """The session holding a spare it took; None for a spare no session holds (or no spare)."""
        return self._holders.get(sandbox_id)

    def released(self, sandbox_id: str) -> None:
        """The sandbox was stopped."""
        self._holders.pop(sandbox_id, None)

    def _refill(self) -> None:
        if self._filler is None and not self._closed:
            self._filler = asyncio.get_running_loop().create_task(self._fill_forever())
        self._wake.set()

    async def _fill_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            for image in sorted(self._images - self._unstartable):
                missing = self._size - len(self._spares.get(image, ())) - self._making.get(image, 0)
                for _ in range(missing):
                    self._spawn(self._make(image))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    async def _make(self, image: str) -> None:
        self._making[image] = self._making.get(image, 0) + 1
        try:
            try:
                sandbox_id = await self._driver.start_spare(image)
            except BaeError as failure:
                # The image cannot be started here until it is ensured again (missing, invalid) or never.
                if isinstance(failure, Unprocessable):
                    self._unstartable.add(image)
                    log.info("no warm spares of %s for now: %s", image, failure.detail)
                    return
                log.warning("could not start a warm spare of %s: %s", image, failure.detail)
                await asyncio.sleep(RETRY_PAUSE)  # still counted as in the making: no retry before then
                return
            except Exception:  # a Docker error no driver path expected: retried after the pause
                log.exception("could not start a warm spare of %s", image)
                await asyncio.sleep(RETRY_PAUSE)
                return
            if self._closed or image not in self._images:
                await self._discard(sandbox_id)
            else:
                self._spares.setdefault(image, deque()).append(sandbox_id)
        finally:
            self._making[image] -= 1
            if not self._closed:
                self._refill()

    async def _discard(self, sandbox_id: str) -> None:
        try:
            await self._driver.stop(sandbox_id)
        except Exception as exc:  # removed with the host's others at shutdown or at the next start
            log.warning("could not remove warm spare %s: %s", sandbox_id[:12], exc)

    async def close(self) -> None:
        """Stop refilling and let spares being started exist, so that removing the host's containers
        after this removes them too."""
        self._closed = True
        if self._filler is not None:
            self._filler.cancel()
            await asyncio.gather(self._filler, return_exceptions=True)
        # Includes a pause after a failure (RETRY_PAUSE, shorter than the timeout) and removals of spares.
        if self._work:
            await asyncio.wait(self._work, timeout=SETTLE_TIMEOUT)
