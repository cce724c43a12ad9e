"""The session service's connection to the runner: every step on one long-lived stream.

A call per step cost about as much CPU as the step's own work here (a call's setup
and teardown on both ends, against one message each way on an open stream), so
the steps of all sessions share one `RunSteps` stream, told apart by step id. The
stream is opened on first use and again after it ended; a step that was running
when it broke fails as a runner call used to fail when the runner went away.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
from typing import AsyncGenerator

import grpc

from bae import callcontext, grpcutil
from bae.internal import InternalPlane
from bae.protos import runner_pb2, runner_pb2_grpc
from bae.stream_writer import StreamWriter

log = logging.getLogger("bae.session.runner")

# What a step waits for a reply that is the stream's end, not the runner's.
_ENDED = object()
# A larger request would fail the shared stream, not just its step; the margin leaves room for
# the runner's `provider.request` event, which carries the same history.
MAX_STEP_REQUEST_BYTES = grpcutil.MAX_MESSAGE_BYTES - 1024 * 1024


class RunnerUnreachable(Exception):
    """The step produced no result for a reason of the runner's, not a provider's: it is
    down or restarting, it refused the step, or the step overran its deadline."""


class RunnerClient:
    """Steps on the runner. Before opening a stream it waits (up to `connect_timeout`) for the channel:
    after the runner restarts, the channel sits in reconnect backoff for a moment and would
    fail at once; a runner that stays down still fails the step."""

    def __init__(self, address: str, connect_timeout: float, plane: InternalPlane) -> None:
        self.channel = grpcutil.channel(address, plane)
        self.stub = runner_pb2_grpc.RunnerStub(self.channel)
        self.connect_timeout = connect_timeout
        self._stream: _StepStream | None = None
        self._opening = asyncio.Lock()
        self._step_ids = itertools.count(1)
        # How many streams this client opened: one, unless the runner went away or restarted.
        self.opened_streams = 0

    async def run_step(
        self, request: runner_pb2.StepRequest, *, timeout: float
    ) -> AsyncGenerator[runner_pb2.StepUpdate, None]:
        """The step's updates, the last one with its result. A consumer that stops early stops the step."""
        if (size := request.ByteSize()) > MAX_STEP_REQUEST_BYTES:
            raise RunnerUnreachable(f"the step's request is {size} bytes, over the {MAX_STEP_REQUEST_BYTES} a step may send")
        stream = await self._open()
        step_id = next(self._step_ids)
        replies = stream.expect(step_id)
        context: list[tuple[str, str | bytes]] = []
        callcontext.add_outgoing(context)
        start = runner_pb2.StepStart(request=request, context={k: str(v) for k, v in context})
        ended = False
        # Only the waits are bounded: the consumer's own work between updates is not cut short.
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            stream.send(runner_pb2.StepCall(step_id=step_id, start=start))
            while not ended:
                try:
                    async with asyncio.timeout_at(deadline):
                        reply = await replies.get()
                except TimeoutError:
                    raise RunnerUnreachable(f"the step took longer than {timeout:g} s") from None
                if reply is _ENDED:
                    raise RunnerUnreachable(stream.ending or "the runner ended the stream")
                if reply.WhichOneof("kind") == "refused":
                    ended = True
                    raise RunnerUnreachable(f"the runner refused the step: {reply.refused}")
                ended = reply.update.HasField("result")
                yield reply.update
        finally:
            stream.forget(step_id)
            if not ended:
                stream.cancel_step(step_id)

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.close()
        await self.channel.close()

    async def _open(self) -> "_StepStream":
        async with self._opening:
            if self._stream is not None and self._stream.ending is None:
                return self._stream
            if self.channel.get_state(try_to_connect=True) != grpc.ChannelConnectivity.READY:
                try:
                    await asyncio.wait_for(self.channel.channel_ready(), self.connect_timeout)
                except TimeoutError:
                    pass  # the stream below fails fast with UNAVAILABLE
            # Opened outside any turn's context: each step sends its own request id and trace.
            # Long-lived, so no deadline: keepalive finds a runner that went away.
            call = contextvars.Context().run(self.stub.RunSteps)
            self._stream = _StepStream(call)
            self.opened_streams += 1
            return self._stream


class _StepStream:
    """One open `RunSteps` call: a reader task hands each reply to the step it belongs to."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self._call = call
        self._waiting: dict[int, asyncio.Queue] = {}
        self._writer: StreamWriter[runner_pb2.StepCall] = StreamWriter(
            call.write,
            lambda exc: self._end(f"writing to the runner failed: {exc}"),
            runner_pb2.StepCalls,
        )
        # Why the stream ended (it takes no new step then); None while it is open.
        self.ending: str | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read(), context=contextvars.Context())

    def expect(self, step_id: int) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()
        self._waiting[step_id] = queue
        return queue

    def forget(self, step_id: int) -> None:
        self._waiting.pop(step_id, None)

    def send(self, call: runner_pb2.StepCall) -> None:
        if self.ending is not None:
            raise RunnerUnreachable(self.ending)
        self._writer.send(call)

    def cancel_step(self, step_id: int) -> None:
        """Tell the runner to stop a step whose caller stopped waiting."""
        if self.ending is None:
            self._writer.send(runner_pb2.StepCall(step_id=step_id, cancel=True))

    async def close(self) -> None:
        self._end("the session service is shutting down")
        self._call.cancel()
        await self._writer.close()

    async def _read(self) -> None:
        try:
            async for pack in self._call:
                for reply in pack.replies:
                    queue = self._waiting.get(reply.step_id)
                    if queue is not None:  # else its caller stopped waiting
                        queue.put_nowait(reply)
            self._end("the runner ended the stream (it is shutting down)")
        except grpc.aio.AioRpcError as exc:
            log.warning("the runner stream broke: %s %s", exc.code().name, exc.details())
            self._end(f"the runner stream broke: {exc.code().name}")
        finally:
            self._end("the stream was closed")
            await self._writer.close()

    def _end(self, reason: str) -> None:
        if self.ending is None:
            self.ending = reason
        for queue in self._waiting.values():
            queue.put_nowait(_ENDED)
