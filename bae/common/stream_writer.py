"""Writing to a gRPC stream that several tasks share.

grpc.aio allows one write in flight per call, and a write whose awaiting task is
cancelled cancels the whole call: on a stream that carries many sessions' steps,
one turn being cancelled would break the others' steps. So the senders only
queue their messages, and a task of the writer's own writes them, in order.

A write costs both ends more CPU than packing several messages into one, and
under load messages queue while a write is in flight (at 64 concurrent sessions
most writes found more waiting). So what queued goes out as one message of the
stream's wrapper type (a message whose one field repeats the stream's message), up
to PACK_BYTES; a message larger than that goes alone, as before.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from typing import Awaitable, Callable, Generic, TypeVar

from google.protobuf.message import Message

# What one write packs beyond its first message, in serialized bytes: small messages gain, a large
# one costs the same alone, and a pack never grows past a lone message's own bound.
PACK_BYTES = 1024 * 1024

M = TypeVar("M", bound=Message)


class StreamWriter(Generic[M]):
    """Queues messages for `write` and writes what queued, packed, from its own task.

    When a write fails, `on_failure` gets the error and nothing more is written. `close()`
    stops the task; the owner calls it when the stream ends.
    """

    def __init__(
        self,
        write: Callable[[object], Awaitable[object]],
        on_failure: Callable[[Exception], None],
        wrapper: type[Message],
    ) -> None:
        self._write = write
        self._on_failure = on_failure
        self._wrapper = wrapper
        (field,) = wrapper.DESCRIPTOR.fields  # the repeated field a pack's messages go in
        self._field = field.name
        self._queued: deque[M] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # nothing queued or being written
        self._idle.set()
        # Started outside the caller's context: it writes for every sender, not the one that made it.
        self._task = asyncio.get_running_loop().create_task(self._run(), context=contextvars.Context())

    def send(self, message: M) -> None:
        self._queued.append(message)
        self._idle.clear()
        self._wake.set()

    async def flush(self) -> None:
        """Wait until every message sent so far is written (or writing failed)."""
        written = asyncio.ensure_future(self._idle.wait())
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
            await self._wake.wait()
            messages = self._take()
            if not self._queued:
                self._wake.clear()
            try:
                await self._write(self._wrapper(**{self._field: messages}))
            except Exception as exc:  # the call ended under the write (gRPC raises one of several)
                self._on_failure(exc)
                return
            if not self._queued:
                self._idle.set()

    def _take(self) -> list[M]:
        """The first queued message, and those after it that fit in PACK_BYTES with it."""
        queued = self._queued
        first = queued.popleft()
        messages = [first]
        size = first.ByteSize()
        while queued and (grown := size + queued[0].ByteSize()) <= PACK_BYTES:
            messages.append(queued.popleft())
            size = grown
        return messages
