"""Writing to a gRPC stream that several tasks share.

grpc.aio allows one write in flight per call, and a write whose awaiting task is
cancelled cancels the whole call: on a stream that carries many sessions' steps,
one turn being cancelled would break the others' steps. So the senders only
queue their messages, and a task of the writer's own writes them, in order.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, Awaitable, Callable


class StreamWriter:
    """Queues messages for `write` and writes them one at a time from its own task.

    When a write fails, `on_failure` gets the error and nothing more is written. `close()`
    stops the task; the owner calls it when the stream ends.
    """

    def __init__(self, write: Callable[[Any], Awaitable[object]], on_failure: Callable[[Exception], None]) -> None:
        self._write = write
        self._on_failure = on_failure
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        # Started outside the caller's context: it writes for every sender, not the one that made it.
        self._task = asyncio.get_running_loop().create_task(self._run(), context=contextvars.Context())

    def send(self, message: Any) -> None:
        self._queue.put_nowait(message)

    async def flush(self) -> None:
        """Wait until every message sent so far is written (or writing failed)."""
        written = asyncio.ensure_future(self._queue.join())
        try:
            await asyncio.wait((written, self._task), return_when=asyncio.FIRST_COMPLETED)
        finally:
            written.cancel()

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _run(self) -> None:
        while True:
            message = await self._queue.get()
            try:
                await self._write(message)
            except Exception as exc:  # the call ended under the write (gRPC raises one of several)
                self._on_failure(exc)
                return
            self._queue.task_done()
