"""The Runner gRPC service: provider steps, each one walk, multiplexed on a caller's stream."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable

import grpc

from bae.common import propagation
from bae.common.call_tasks import CallTasks, serve_until_done
from bae.common.config import Config
from bae.common.errors import InvalidInput
from bae.common.jsontext import RawJson, dump, load
from bae.common.protos import client_api_pb2, runner_pb2, runner_pb2_grpc
from bae.common.redact import register_config
from bae.services.runner.canonical import DeltaKind, History
from bae.services.runner.clients import ProviderClients
from bae.services.runner.walk import StepDelta, StepEvent, StepOutcome, StepSpec, run_step

log = logging.getLogger("bae.runner")

SERVICE_NAME = runner_pb2.DESCRIPTOR.services_by_name["Runner"].full_name
SHUTTING_DOWN = "the runner is shutting down"

_DELTA_KINDS = {
    DeltaKind.TEXT: client_api_pb2.DELTA_TEXT,
    DeltaKind.THINKING: client_api_pb2.DELTA_THINKING,
    DeltaKind.TOOL_INPUT: client_api_pb2.DELTA_TOOL_INPUT,
    DeltaKind.RESET: client_api_pb2.DELTA_RESET,
}
_OUTCOMES = {
    "ok": runner_pb2.StepResult.OK,
    "all_failed": runner_pb2.StepResult.ALL_FAILED,
    "provider_config": runner_pb2.StepResult.PROVIDER_CONFIG,
}


class RunnerService(runner_pb2_grpc.RunnerServicer):
    def __init__(self, config: Config, clients: ProviderClients, retry_after_limit: float) -> None:
        self.config = config
        register_config(config)  # a provider's error text may echo a piece of its token
        self.clients = clients
        # The longest `Retry-After` a walk waits for before trying an entry again (BAE_RPC_TIMEOUT).
        self.retry_after_limit = retry_after_limit
        self._draining = asyncio.Event()

    # Answers with context.write() (bae.common.call_tasks), not as a generator.
    async def RunSteps(  # type: ignore[override]
        self, calls: AsyncIterator[runner_pb2.StepCalls], context: grpc.aio.ServicerContext
    ) -> None:
        """Serve one caller's steps until it stops writing and they are done, or, once draining, until they are done."""
        async with CallTasks(context.write, runner_pb2.StepReplies) as steps:
            await serve_until_done(_StepStream(self, steps).read(calls), steps, self._draining)

    async def drain(self, budget: float) -> None:
        """Shutdown: refuse new steps; each stream ends once its running steps are done."""
        self._draining.set()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    async def walk(self, request: runner_pb2.StepRequest, history: History) -> AsyncIterator[runner_pb2.StepUpdate]:
        """One step's updates: one when the walk starts waiting for a provider or a `Retry-After`, one per
        delta of a streamed call, one with the result."""
        spec = step_spec(request, history)
        held = request.hold_history
        events: list[runner_pb2.StepEvent] = []
        async for item in run_step(spec, self.config, self.clients, self.retry_after_limit):
            if isinstance(item, StepDelta):
                # At once: the stream's writer packs what queues while a write is under way.
                delta = client_api_pb2.Delta(seq=item.seq, index=item.index, kind=_DELTA_KINDS[item.kind], text=item.text)
                yield runner_pb2.StepUpdate(deltas=[delta], history_held=held)
            elif isinstance(item, StepEvent):
                events.append(
                    runner_pb2.StepEvent(
                        event_type=item.event_type,
                        payload_json=dump(item.payload),
                        messages_as_sent=item.messages_as_sent,
                    )
                )
                if item.then_waits:
                    yield runner_pb2.StepUpdate(events=events, history_held=held)
                    events = []
            else:
                yield runner_pb2.StepUpdate(events=events, result=step_result(item), history_held=held)


class _StepStream:
    """One caller's stream: a task per running step; replies of different steps interleave.

    It holds each session's history as the stream's last step of the session had it, so that
    a step sends only what changed (`StepRequest.kept_messages`). Starts are taken in the order
    they came, which is the order the caller sent them in: both ends agree on what is held.
    """

    def __init__(self, service: RunnerService, steps: CallTasks) -> None:
        self._service = service
        self.steps = steps
        self._histories: dict[str, History] = {}

    async def read(self, packs: AsyncIterator[runner_pb2.StepCalls]) -> None:
        async for pack in packs:
            for call in pack.calls:
                kind = call.WhichOneof("kind")
                if kind == "start":
                    self._start(call.step_id, call.start)
                elif kind == "cancel":
                    self.steps.cancel(call.step_id)

    def _start(self, step_id: int, start: runner_pb2.StepStart) -> None:
        request = start.request
        for session_id in request.forget_sessions:
            self._histories.pop(session_id, None)
        if self._service.draining:
            self._refuse(step_id, request, SHUTTING_DOWN)
        elif step_id in self.steps:
            self._refuse(step_id, request, f"step {step_id} is already running")
        else:
            try:
                history = self._history(request)
            except InvalidInput as refusal:
                self._refuse(step_id, request, refusal.detail)
                return
            if request.hold_history:
                self._histories[request.session_id] = history
            else:
                self._histories.pop(request.session_id, None)
            self.steps.start(step_id, self._run(step_id, start, history))

    def _refuse(self, step_id: int, request: runner_pb2.StepRequest, reason: str) -> None:
        self._histories.pop(request.session_id, None)  # as the caller does on a refusal
        self.steps.send(runner_pb2.StepReply(step_id=step_id, refused=reason))

    def _history(self, request: runner_pb2.StepRequest) -> History:
        """The step's whole history: the kept part of the one held, then the messages sent."""
        texts, roles = list(request.messages), list(request.roles)
        if len(texts) != len(roles):
            raise InvalidInput(f"{len(texts)} messages but {len(roles)} roles")
        kept = request.kept_messages
        if not kept:
            return History(texts, roles)
        held = self._histories.get(request.session_id)
        if held is None or len(held.texts) < kept:
            holds = len(held.texts) if held is not None else 0
            raise InvalidInput(f"the step keeps {kept} messages of the session's history; the runner holds {holds}")
        if kept == len(held.texts):  # the usual step: the history only grew
            return held.extended(texts, roles)
        return History(held.texts[:kept] + texts, held.roles[:kept] + roles)

    async def _run(self, step_id: int, start: runner_pb2.StepStart, history: History) -> None:
        propagation.bind_incoming(list(start.context.items()))  # this task's own request id and trace
        try:
            async for update in self._service.walk(start.request, history):
                self.steps.send(runner_pb2.StepReply(step_id=step_id, update=update))
        except InvalidInput as refusal:  # an invalid request: the step fails, not the stream
            self.steps.send(runner_pb2.StepReply(step_id=step_id, refused=refusal.detail))
        except Exception:
            log.exception("step %d failed", step_id)
            self.steps.send(runner_pb2.StepReply(step_id=step_id, refused="the runner failed the step (see its log)"))


def step_spec(request: runner_pb2.StepRequest, history: History) -> StepSpec:
    return StepSpec(
        session_id=request.session_id,
        primary=request.primary_provider,
        fallbacks=list(request.fallback_providers),
        history=history,
        tools=_json_array(request.tools_json, "tools_json"),
        tools_json=RawJson(request.tools_json or "[]"),
        purpose=request.purpose,
        min_max_tokens=request.min_max_tokens,
        stream_deltas=request.stream_deltas,
    )


def _json_array(text: str, field: str) -> list[Any]:
    if not text:
        return []
    try:
        value = load(text)
    except ValueError as exc:
        raise InvalidInput(f"{field} is not valid JSON: {exc}") from None
    if not isinstance(value, list):
        raise InvalidInput(f"{field} must be a JSON array")
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
        result.cache_read_input_tokens = outcome.usage.cache_read_input_tokens
        result.cache_creation_input_tokens = outcome.usage.cache_creation_input_tokens
    if outcome.cost_usd is not None:
        result.cost_usd = outcome.cost_usd
    return result


def registrar(service: RunnerService) -> Callable[[grpc.aio.Server], list[str]]:
    def register(server: grpc.aio.Server) -> list[str]:
        runner_pb2_grpc.add_RunnerServicer_to_server(service, server)
        return [SERVICE_NAME]

    return register
