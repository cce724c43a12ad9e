"""Cancelling a running turn (`session.cancelTurn`): asked for from outside, honoured inside.

The turn is not cancelled as a task: a store write cut short could leave an event written but
not published, or a history that misses it. Instead the turn waits for outside work (a provider
step, a sandbox command, an MCP call) through `interruptible`, and only that work is stopped:
the turn then records its cancellation itself, between two writes, and ends with TurnCancelled.

Exactly one outcome: a cancel asked for while the turn's provider loop runs is honoured at the
loop's next wait for outside work; once the loop has ended on its own, it is answered False.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from bae.services.session.engine.errors import TurnCancelled

T = TypeVar("T")


class TurnCancel:
    """One running turn's cancellation: who asked, and whether the turn honoured it."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self._requested: asyncio.Future[None] = loop.create_future()
        # True once the turn recorded its cancellation, False when its loop ended first.
        self._outcome: asyncio.Future[bool] = loop.create_future()
        self.by: str | None = None

    def request(self, actor: str) -> asyncio.Future[bool]:
        """Ask the turn to stop; the future says whether it did. A second request shares the first's answer."""
        if not self._requested.done() and not self._outcome.done():
            self.by = actor
            self._requested.set_result(None)
        return self._outcome

    async def interruptible(self, work: Awaitable[T]) -> T:
        """`work`'s result, unless the turn is cancelled first: then `work` is cancelled and awaited
        until it has stopped (a runner step told to stop, a sandbox call ended), and TurnCancelled raised.
        Work that finished as the cancel came is kept: the next wait honours the cancel."""
        if self._outcome.done():  # the loop ended: nothing interrupts the turn any more
            return await work
        task = asyncio.ensure_future(work)
        if not self._requested.done():
            try:
                await asyncio.wait((task, self._requested), return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # the turn's own task was cancelled (shutdown): its work goes too
                task.cancel()
                raise
            if task.done():
                return task.result()
        task.cancel()
        await asyncio.wait((task,))
        raise TurnCancelled()

    def honoured(self) -> None:
        """The turn recorded its cancellation."""
        if not self._outcome.done():
            self._outcome.set_result(True)

    def failed(self, error: BaseException) -> None:
        """Recording the cancellation failed: the requester hears why."""
        if not self._outcome.done() and self.by is not None:
            self._outcome.set_exception(error)

    def close(self) -> None:
        """The turn's loop ended without honouring a cancel: any request is answered False."""
        if not self._outcome.done():
            self._outcome.set_result(False)
