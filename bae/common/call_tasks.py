"""The server side of a stream that carries many calls, told apart by id.

A call of its own costs more CPU on both ends than much of the work it asks for,
so the runner takes its caller's steps on one long-lived stream (`RunSteps`). On
such a stream each call runs in a task of its own; replies go out through one writer
(bae.common.stream_writer). This module holds the tasks, and when the stream's
handler may return.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Coroutine

from google.protobuf.message import Message

from bae.common.stream_writer import StreamWriter

log = logging.getLogger("bae")


class CallTasks:
    """The calls running on one stream, by id, and the writer of their replies.

    As an async context manager it owns its tasks: the calls still running when the
    stream ends are cancelled, as a call of its own is when its caller goes away.
    """

    def __init__(self, write: Callable[[Any], Awaitable[object]], wrapper: type[Message]) -> None:
        self._writer: StreamWriter[Any] = StreamWriter(
            write, lambda exc: log.debug("a stream of calls ended: %s", exc), wrapper
        )
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._none_running = asyncio.Event()
        self._none_running.set()

    async def __aenter__(self) -> "CallTasks":
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if exc_type is None:  # the stream ends in order: what the calls answered goes out first
            await self._writer.flush()
        await self._writer.close()

    def send(self, reply: Any) -> None:
        """Queue a reply; replies go out in the order they were sent."""
        self._writer.send(reply)

    def __contains__(self, call_id: int) -> bool:
        return call_id in self._tasks

    def start(self, call_id: int, work: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks[call_id] = task
        self._none_running.clear()
        task.add_done_callback(lambda _: self._ended(call_id))

    def cancel(self, call_id: int) -> None:
        """The caller stopped waiting for the call (a no-op once it ended)."""
        if (task := self._tasks.get(call_id)) is not None:
            task.cancel()

    async def idle(self) -> None:
        await self._none_running.wait()

    def _ended(self, call_id: int) -> None:
        self._tasks.pop(call_id, None)
        if not self._tasks:
            self._none_running.set()


async def serve_until_done(read: Awaitable[None], tasks: CallTasks, draining: asyncio.Event) -> None:
    """Wait until the stream's caller stopped writing and its calls are answered, or, once the
    service drains, until the calls it took are answered (it takes no new ones then).

    A caller that only half-closes still gets its running calls answered; a stream that broke
    ends with its error (its calls are then cancelled by `tasks`).
    """
    reading = asyncio.ensure_future(read)
    drained = asyncio.ensure_future(_drained(tasks, draining))
    try:
        await asyncio.wait((reading, drained), return_when=asyncio.FIRST_COMPLETED)
        if reading.done():
            reading.result()
            await tasks.idle()
    finally:
        reading.cancel()
        drained.cancel()


async def _drained(tasks: CallTasks, draining: asyncio.Event) -> None:
    await draining.wait()
    await tasks.idle()
