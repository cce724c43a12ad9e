"""The Runner gRPC service: provider steps, each one walk, multiplexed on a caller's stream."""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

import grpc

from bae import callcontext
from bae.config import Config
from bae.errors import Problem, bad_request
from bae.jsontext import RawJson, dump, load
from bae.protos import runner_pb2, runner_pb2_grpc
from bae.stream_writer import StreamWriter
from services.runner.canonical import History
from services.runner.clients import ProviderClients
from services.runner.walk import PROVIDER_REQUEST, StepEvent, StepOutcome, StepSpec, run_step

log = logging.getLogger("bae.runner")

SERVICE_NAME = runner_pb2.DESCRIPTOR.services_by_name["Runner"].full_name
SHUTTING_DOWN = "the runner is shutting down"

_OUTCOMES = {
    "ok": runner_pb2.StepResult.OK,
    "all_failed": runner_pb2.StepResult.ALL_FAILED,
    "provider_config": runner_pb2.StepResult.PROVIDER_CONFIG,
}


class RunnerService(runner_pb2_grpc.RunnerServicer):
    def __init__(self, config: Config, clients: ProviderClients) -> None:
        self.config = config
        self.clients = clients
        self._draining = asyncio.Event()

    async def RunSteps(
        self, calls: AsyncIterator[runner_pb2.StepCall], context: grpc.aio.ServicerContext
    ) -> None:
        """Serve one caller's steps until it stops writing and they are done, or, once draining, until they are done."""
        async with _StepStream(self, context) as stream:
            reading = asyncio.ensure_future(stream.read(calls))
            drained = asyncio.ensure_future(self._drained(stream))
            try:
                await asyncio.wait((reading, drained), return_when=asyncio.FIRST_COMPLETED)
                if reading.done():
                    reading.result()  # a stream that broke ends the call with its error
                    await stream.idle()  # the caller only stopped writing: its running steps finish
            finally:
                reading.cancel()
                drained.cancel()

    async def drain(self, budget: float) -> None:
        """Shutdown: refuse new steps; each stream ends once its running steps are done."""
        self._draining.set()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    async def _drained(self, stream: "_StepStream") -> None:
        await self._draining.wait()
        await stream.idle()

    async def walk(self, step: runner_pb2.StepStart) -> AsyncIterator[runner_pb2.StepUpdate]:
        """One step's updates: an update as each provider call starts, and one with the result."""
        spec = step_spec(step.request)
        events: list[runner_pb2.StepEvent] = []
        async for item in run_step(spec, self.config, self.clients):
            if isinstance(item, StepEvent):
                events.append(runner_pb2.StepEvent(event_type=item.event_type, payload_json=dump(item.payload)))
                if item.event_type == PROVIDER_REQUEST:  # the walk now waits for the provider: send it at once
                    yield runner_pb2.StepUpdate(events=events)
                    events = []
            else:
                yield runner_pb2.StepUpdate(events=events, result=step_result(item))


class _StepStream:
    """One caller's stream: a task per running step, and a writer that sends their replies in turn.

    As an async context manager it owns its tasks: the steps still running are cancelled
    when the stream ends, as a step's call used to be when its caller went away.
    """

    def __init__(self, service: RunnerService, context: grpc.aio.ServicerContext) -> None:
        self._service = service
        self._writer = StreamWriter(context.write, lambda exc: log.debug("a step stream ended: %s", exc))
        self._steps: dict[int, asyncio.Task[None]] = {}
        self._none_running = asyncio.Event()
        self._none_running.set()

    async def __aenter__(self) -> "_StepStream":
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        steps = list(self._steps.values())
        for task in steps:
            task.cancel()
        await asyncio.gather(*steps, return_exceptions=True)
        if exc_type is None:  # the stream ends in order: what the steps answered goes out first
            await self._writer.flush()
        await self._writer.close()

    async def read(self, calls: AsyncIterator[runner_pb2.StepCall]) -> None:
        async for call in calls:
            kind = call.WhichOneof("kind")
            if kind == "start":
                self._start(call.step_id, call.start)
            elif kind == "cancel" and (task := self._steps.get(call.step_id)) is not None:
                task.cancel()

    async def idle(self) -> None:
        await self._none_running.wait()

    def _start(self, step_id: int, start: runner_pb2.StepStart) -> None:
        if self._service.draining:
            self._writer.send(runner_pb2.StepReply(step_id=step_id, refused=SHUTTING_DOWN))
            return
        if step_id in self._steps:
            self._writer.send(runner_pb2.StepReply(step_id=step_id, refused=f"step {step_id} is already running"))
            return
        task = asyncio.ensure_future(self._run(step_id, start))
        self._steps[step_id] = task
        self._none_running.clear()
        task.add_done_callback(lambda _: self._ended(step_id))

    def _ended(self, step_id: int) -> None:
        self._steps.pop(step_id, None)
        if not self._steps:
            self._none_running.set()

    async def _run(self, step_id: int, start: runner_pb2.StepStart) -> None:
        callcontext.bind_incoming(list(start.context.items()))  # this task's own request id and trace
        try:
            async for update in self._service.walk(start):
                self._writer.send(runner_pb2.StepReply(step_id=step_id, update=update))
        except Problem as problem:  # an invalid request: the step fails, not the stream
            self._writer.send(runner_pb2.StepReply(step_id=step_id, refused=problem.detail))
        except Exception:
            log.exception("step %d failed", step_id)
            self._writer.send(runner_pb2.StepReply(step_id=step_id, refused="the runner failed the step (see its log)"))


def step_spec(request: runner_pb2.StepRequest) -> StepSpec:
    return StepSpec(
        session_id=request.session_id,
        primary=request.primary_provider,
        fallbacks=list(request.fallback_providers),
        history=_history(request),
        tools=_json_array(request.tools_json, "tools_json"),
        tools_json=RawJson(request.tools_json or "[]"),
        purpose=request.purpose,
        min_max_tokens=request.min_max_tokens,
    )


def _history(request: runner_pb2.StepRequest) -> History:
    texts, roles = list(request.messages), list(request.roles)
    if len(texts) != len(roles):
        raise bad_request(f"{len(texts)} messages but {len(roles)} roles")
    return History(texts, roles)


def _json_array(text: str, field: str) -> list:
    if not text:
        return []
    try:
        value = load(text)
    except ValueError as exc:
        raise bad_request(f"{field} is not valid JSON: {exc}") from None
    if not isinstance(value, list):
        raise bad_request(f"{field} must be a JSON array")
    return value


def step_result(outcome: StepOutcome) -> runner_pb2.StepResult:
    result = runner_pb2.StepResult(
        outcome=_OUTCOMES[outcome.outcome],
        attempts=outcome.attempts,
        detail=outcome.detail,
        truncated=outcome.truncated,
    )
    if outcome.message is not None:
        result.message_json = dump(outcome.message)
    if outcome.usage is not None:
        result.has_usage = True
        result.input_tokens = outcome.usage.input_tokens
        result.output_tokens = outcome.usage.output_tokens
    return result


def registrar(service: RunnerService):
    def register(server: grpc.aio.Server) -> list[str]:
        runner_pb2_grpc.add_RunnerServicer_to_server(service, server)
        return [SERVICE_NAME]

    return register
