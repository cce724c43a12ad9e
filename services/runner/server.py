"""The Runner gRPC service: one RunStep = one provider walk, streamed."""

from __future__ import annotations

from typing import AsyncIterator

import grpc

from bae.config import Config
from bae.errors import bad_request
from bae.jsontext import RawJson, dump, load
from bae.protos import runner_pb2, runner_pb2_grpc
from services.runner.canonical import History
from services.runner.clients import ProviderClients
from services.runner.walk import PROVIDER_REQUEST, StepEvent, StepOutcome, StepSpec, run_step

SERVICE_NAME = runner_pb2.DESCRIPTOR.services_by_name["Runner"].full_name

_OUTCOMES = {
    "ok": runner_pb2.StepResult.OK,
    "all_failed": runner_pb2.StepResult.ALL_FAILED,
    "provider_config": runner_pb2.StepResult.PROVIDER_CONFIG,
}


class RunnerService(runner_pb2_grpc.RunnerServicer):
    def __init__(self, config: Config, clients: ProviderClients) -> None:
        self.config = config
        self.clients = clients

    async def RunStep(
        self, request: runner_pb2.StepRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[runner_pb2.StepUpdate]:
        spec = step_spec(request)
        events: list[runner_pb2.StepEvent] = []
        async for item in run_step(spec, self.config, self.clients):
            if isinstance(item, StepEvent):
                events.append(runner_pb2.StepEvent(event_type=item.event_type, payload_json=dump(item.payload)))
                if item.event_type == PROVIDER_REQUEST:  # the walk now waits for the provider: send it at once
                    yield runner_pb2.StepUpdate(events=events)
                    events = []
            else:
                yield runner_pb2.StepUpdate(events=events, result=step_result(item))


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
