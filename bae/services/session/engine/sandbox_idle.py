"""The idle lifetime of remote sandboxes (BAE_SANDBOX_IDLE_TIMEOUT, docs/configuration.md).

A sandbox counts as used while a command runs in it; it is idle from its start
or from the end of its last command. Once it has been idle for `timeout`
seconds, `on_idle(session_id, handle)` is called, and the session stops it
with the usual stop events and reason `idle_timeout`. A timeout of 0 never
stops anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterator

from bae.services.session.engine.ports import SandboxHandle

log = logging.getLogger("bae.session.sandboxes")

# How often the watch looks at most, so a stop lands at most this late.
MAX_CHECK_INTERVAL = 1.0

OnIdle = Callable[[str, SandboxHandle], Awaitable[None]]


@dataclass
class _Use:
    session_id: str
    handle: SandboxHandle
    last_used: float
    running: int = 0  # commands in flight


class IdleWatch:
    def __init__(self, timeout: float = 0.0, on_idle: OnIdle | None = None) -> None:
        self._timeout = timeout
        self._on_idle = on_idle if timeout > 0 else None
        self._uses: dict[str, _Use] = {}
        self._task: asyncio.Task[None] | None = None

    def started(self, session_id: str, handle: SandboxHandle) -> None:
        if self._on_idle is None:
            return
        loop = asyncio.get_running_loop()
        self._uses[handle.sandbox_id] = _Use(session_id, handle, loop.time())
        if self._task is None:
            self._task = loop.create_task(self._run(self._on_idle))

    def forget(self, handle: SandboxHandle) -> None:
        self._uses.pop(handle.sandbox_id, None)

    @contextlib.contextmanager
    def using(self, handle: SandboxHandle) -> Iterator[None]:
        """Around a command: the sandbox is in use until it returns."""
        use = self._uses.get(handle.sandbox_id)
        if use is not None:
            use.running += 1
        try:
            yield
        finally:
            if use is not None:
                use.running -= 1
                use.last_used = asyncio.get_running_loop().time()

    async def _run(self, on_idle: OnIdle) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(self._timeout / 4, MAX_CHECK_INTERVAL))
            now = loop.time()
            idle = [use for use in self._uses.values() if not use.running and now - use.last_used >= self._timeout]
            for use in idle:
                self._uses.pop(use.handle.sandbox_id, None)
                log.info("sandbox %s of %s unused for %ss: stopping it", use.handle.sandbox_id[:12],
                         use.session_id, self._timeout)
                try:
                    await on_idle(use.session_id, use.handle)
                except Exception:  # keeps the watch alive for the other sandboxes
                    log.exception("stopping the idle sandbox of %s failed", use.session_id)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
