"""The session service's connection to the runner: every step on one long-lived stream.

A call per step cost about as much CPU as the step's own work here (a call's setup
and teardown on both ends, against one message each way on an open stream), so
the steps of all sessions share one `RunSteps` stream, told apart by step id. The
stream is opened on first use and again after it ended; a step that was running
when it broke fails as a runner call used to fail when the runner went away.

A session's history went to the runner whole with every step and came back whole
in its `provider.request`: at 2,000 events that was two 60 KB messages per step,
built and read on both ends. Now the runner keeps, per stream, each session's
history as its last step had it; a step sends only the messages after the part
that stayed the same, and a `provider.request` that sends the history as it came
leaves it out for this end to add. This end decides what the runner keeps: it
drops the sessions stepped least recently beyond HELD_HISTORY_BYTES and names them
in its next step. Until the runner has said it holds histories, every step is
sent whole: one from before this protocol would ignore `kept_messages`.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
from collections import OrderedDict
from typing import AsyncGenerator, NamedTuple, Sequence

import grpc

from bae.common import grpcutil, propagation
from bae.common.internal import InternalPlane
from bae.common.jsontext import RawJson
from bae.common.protos import client_api_pb2, runner_pb2, runner_pb2_grpc
from bae.common.stream_writer import StreamWriter
from bae.services.session.engine.domain import Usage
from bae.services.session.store.requests import RequestJson
from bae.services.session.engine.ports import (
    Delta,
    DeltaKind,
    StepEvent,
    StepFailed,
    StepMessages,
    StepOutcome,
    StepRequest,
    StepResult,
    StepUpdate,
)

log = logging.getLogger("bae.session.runner")

# A step's replies, then None in place of the next one when the stream ended under it.
StepReplies = asyncio.Queue[runner_pb2.StepReply | None]
# A larger history would fail the shared stream, not just its step (the first step of a
# session on a stream sends it whole); the margin leaves room for the rest of the request and
# for a `provider.request` that carries the history changed (normalized, routing fields dropped).
MAX_STEP_REQUEST_BYTES = grpcutil.MAX_MESSAGE_BYTES - 1024 * 1024
# What the runner may hold of one stream's histories: message text in characters, plus
# HELD_MESSAGE_OVERHEAD per message for the objects that hold it.
HELD_HISTORY_BYTES = 128 * 1024 * 1024
HELD_MESSAGE_OVERHEAD = 128


_DELTA_KINDS = {
    client_api_pb2.DELTA_TEXT: DeltaKind.TEXT,
    client_api_pb2.DELTA_THINKING: DeltaKind.THINKING,
    client_api_pb2.DELTA_TOOL_INPUT: DeltaKind.TOOL_INPUT,
    client_api_pb2.DELTA_RESET: DeltaKind.RESET,
}
_OUTCOMES = {
    runner_pb2.StepResult.OK: StepOutcome.OK,
    runner_pb2.StepResult.ALL_FAILED: StepOutcome.ALL_FAILED,
    runner_pb2.StepResult.PROVIDER_CONFIG: StepOutcome.PROVIDER_CONFIG,
}


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

    async def run_step(
        self, request: StepRequest, messages: StepMessages, *, timeout: float
    ) -> AsyncGenerator[StepUpdate, None]:
        """The step's updates, the last one with its result. Each `provider.request` has its
        messages. A consumer that stops early stops the step."""
        if len(messages.texts) != len(messages.roles):
            raise ValueError(f"{len(messages.texts)} messages but {len(messages.roles)} roles")
        stream = await self._open()
        step_id = next(self._step_ids)
        replies = stream.expect(step_id)
        context: list[tuple[str, str | bytes]] = []
        propagation.add_outgoing(context)
        start = runner_pb2.StepStart(request=_step_request(request), context={k: str(v) for k, v in context})
        messages_json: str | None = None  # the history as one JSON array, made when first needed
        ended = False
        # Only the waits are bounded: the consumer's own work between updates is not cut short.
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            stream.send_start(step_id, start, messages)
            while not ended:
                try:
                    async with asyncio.timeout_at(deadline):
                        reply = await replies.get()
                except TimeoutError:
                    raise StepFailed(f"the step took longer than {timeout:g} s") from None
                if reply is None:
                    raise StepFailed(stream.ending or "the runner ended the stream")
                if reply.WhichOneof("kind") == "refused":
                    ended = True
                    stream.histories.drop(request.session_id)
                    raise StepFailed(f"the runner refused the step: {reply.refused}")
                update = reply.update
                events = []
                for event in update.events:
                    payload: RawJson = RawJson(event.payload_json)
                    if event.messages_as_sent:
                        messages_json = messages_json or "[" + ",".join(messages.texts) + "]"
                        payload = _with_messages(event.payload_json, messages_json, messages.texts)
                    events.append(StepEvent(event.event_type, payload))
                ended = update.HasField("result")
                deltas = [
                    Delta("", delta.seq, delta.index, _DELTA_KINDS.get(delta.kind, DeltaKind.TEXT), delta.text)
                    for delta in update.deltas
                ]
                yield StepUpdate(events, _step_result(update.result) if ended else None, deltas)
        finally:
            stream.forget(step_id)
            if not ended:
                stream.cancel_step(step_id)

    def runner_holds_histories(self) -> bool:
        """Whether steps on the open stream send only what changed of their histories."""
        return self._stream is not None and self._stream.histories.runner_holds

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
            return self._stream


def _step_request(request: StepRequest) -> runner_pb2.StepRequest:
    """The wire request, without its history (HeldHistories.step adds what the runner needs)."""
    return runner_pb2.StepRequest(
        session_id=request.session_id,
        primary_provider=request.primary_provider,
        fallback_providers=request.fallback_providers,
        tools_json=request.tools_json,
        purpose=request.purpose,
        min_max_tokens=request.min_max_tokens,
        stream_deltas=request.stream_deltas,
    )


def _step_result(result: runner_pb2.StepResult) -> StepResult:
    return StepResult(
        outcome=_OUTCOMES.get(result.outcome, StepOutcome.ALL_FAILED),
        message_json=result.message_json,
        usage=Usage(
            result.input_tokens, result.output_tokens, result.cache_read_input_tokens, result.cache_creation_input_tokens
        )
        if result.has_usage
        else None,
        cost_usd=result.cost_usd if result.HasField("cost_usd") else None,
        attempts=result.attempts,
        detail=result.detail,
        truncated=result.truncated,
    )


def _utf8_size(texts: list[str], chars: int) -> int:
    """The size in UTF-8 of texts of `chars` characters: counted only when it could exceed the bound."""
    if chars * 4 > MAX_STEP_REQUEST_BYTES:
        return sum(len(text.encode()) for text in texts)
    return chars


def _with_messages(payload_json: str, messages_json: str, texts: Sequence[str]) -> RequestJson:
    """A JSON object's text with a `messages` member added last (`messages_json`, the `texts` joined),
    as the store keeps it apart (store/requests.py)."""
    head = payload_json[:-1] + ("" if payload_json == "{}" else ",") + '"messages":'
    return RequestJson(head + messages_json + "}", messages=tuple(texts), at=len(head))


class _HeldHistory(NamedTuple):
    texts: list[str]
    chars: int  # of all the texts, counted once

    @property
    def cost(self) -> int:
        """What it counts for against the budget."""
        return self.chars + HELD_MESSAGE_OVERHEAD * len(self.texts)


class HeldHistories:
    """What the runner holds of one stream's histories, as this end sent them: per session, the
    whole history of its last step. Both ends change it in the order the steps go out."""

    def __init__(self, budget: int = HELD_HISTORY_BYTES) -> None:
        self.budget = budget
        # Whether the runner said it holds histories; until then every step keeps nothing.
        self.runner_holds = False
        self._held: OrderedDict[str, _HeldHistory] = OrderedDict()  # least recently stepped first
        self._size = 0
        self._dropped: list[str] = []  # for the runner to drop too, named in the next step

    def step(self, request: runner_pb2.StepRequest, messages: StepMessages) -> None:
        """Fill in the request's history: the messages after the part the runner keeps. A history
        too large for the stream raises StepFailed, and nothing changes."""
        texts = list(messages.texts)
        previous = self._held.get(request.session_id)
        if previous is None:
            shared, chars = 0, sum(map(len, texts))
        else:  # only what changed is counted
            shared = _shared(previous.texts, texts)
            chars = previous.chars - sum(map(len, previous.texts[shared:])) + sum(map(len, texts[shared:]))
        size = _utf8_size(texts, chars) + request.ByteSize()
        if size > MAX_STEP_REQUEST_BYTES:
            raise StepFailed(f"the step's request is {size} bytes, over the {MAX_STEP_REQUEST_BYTES} a step may send")
        kept = shared if self.runner_holds else 0
        request.hold_history = True
        request.kept_messages = kept
        request.messages.extend(texts[kept:])
        request.roles.extend(messages.roles[kept:])
        request.forget_sessions.extend(self._dropped)
        self._dropped = []
        held = self._held[request.session_id] = _HeldHistory(texts, chars)
        self._held.move_to_end(request.session_id)
        self._size += held.cost - (previous.cost if previous is not None else 0)
        while self._size > self.budget and len(self._held) > 1:
            self.drop(next(iter(self._held)))

    def drop(self, session_id: str) -> None:
        """Forget a session's history here, and have the runner forget it with the next step."""
        held = self._held.pop(session_id, None)
        if held is not None:
            self._size -= held.cost
            self._dropped.append(session_id)


def _shared(held: list[str], texts: list[str]) -> int:
    """How many leading messages of `held` the history `texts` starts with."""
    if texts[: len(held)] == held:  # the usual step: the history only grew
        return len(held)
    return next((i for i, (old, new) in enumerate(zip(held, texts)) if old != new), min(len(held), len(texts)))


class _StepStream:
    """One open `RunSteps` call: a reader task hands each reply to the step it belongs to."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self._call = call
        self.histories = HeldHistories()
        self._waiting: dict[int, StepReplies] = {}
        self._writer: StreamWriter[runner_pb2.StepCall] = StreamWriter(
            call.write,
            lambda exc: self._end(f"writing to the runner failed: {exc}"),
            runner_pb2.StepCalls,
        )
        # Why the stream ended (it takes no new step then); None while it is open.
        self.ending: str | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read(), context=contextvars.Context())

    def expect(self, step_id: int) -> StepReplies:
        queue: StepReplies = asyncio.Queue()
        self._waiting[step_id] = queue
        return queue

    def forget(self, step_id: int) -> None:
        self._waiting.pop(step_id, None)

    def send_start(self, step_id: int, start: runner_pb2.StepStart, messages: StepMessages) -> None:
        """Send a step with the part of its history the runner does not hold."""
        if self.ending is not None:
            raise StepFailed(self.ending)
        # No await from here on: the runner takes the starts in the order they are written.
        self.histories.step(start.request, messages)
        self._writer.send(runner_pb2.StepCall(step_id=step_id, start=start))

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
                    if reply.update.history_held:
                        self.histories.runner_holds = True
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
            queue.put_nowait(None)
