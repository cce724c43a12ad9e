"""Ownership of background tasks: nothing is started without an owner that
awaits or cancels it, and a failure in one is logged, never lost."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Coroutine, TypeVar

from bae.services.session.engine.errors import EngineError

log = logging.getLogger("bae.session.tasks")

T = TypeVar("T")


class TaskOwner:
    """A set of tasks that ends together: `drain` waits for them, `cancel` stops them.

    Unlike `asyncio.TaskGroup`, one task's failure does not cancel the others:
    each turn or connection attempt stands alone.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._empty = asyncio.Event()
        self._empty.set()
        self._ended = asyncio.Event()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)
        self._empty.clear()
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._ended.set()
        if not self._tasks:
            self._empty.set()
        # An EngineError is an answer for whoever awaits the task, not a failure.
        if not task.cancelled() and not isinstance(task.exception(), (EngineError, type(None))):
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def empty(self) -> None:
        """Wait until no task is left (at once when none is)."""
        await self._empty.wait()

    async def next_end(self) -> None:
        """Wait until a task ends (for one waiter at a time)."""
        self._ended.clear()
        await self._ended.wait()

    async def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every task; True when none is left."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        return not self._tasks

    async def cancel(self) -> None:
        """Cancel every task and wait until each has finished its cleanup."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
