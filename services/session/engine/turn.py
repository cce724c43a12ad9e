"""The turn loop (SERVER-SPEC §7.6): provider step, tool dispatch, pause.

One `Turn` is one `session.sendMessage` call that holds the gate. It builds
the provider history from the cached effective history plus this call's
in-memory extensions, asks the runner for one step at a time, records every
event before it is broadcast, and dispatches server-side tools itself.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import grpc

from bae.jsontext import RawJson, dump
from bae.protos import runner_pb2
from services.session.engine.feed import Watcher
from services.session.engine.gate import ParkedTurn
from services.session.engine.runtime import LiveSession, SessionRuntime
from services.session.engine import tools as toolset

log = logging.getLogger("bae.session.turn")

MAX_ITERATIONS = 8
# A step may walk several providers, each bounded by the runner's own per-attempt timeout.
STEP_DEADLINE = 900.0
UNAVAILABLE_MESSAGE = {
    "role": "assistant",
    "content": [{"type": "text", "text": "The provider is currently unavailable."}],
}


class TurnFailed(Exception):
    """The loop could not run (runner unreachable, store failure): -32000 `session loop failed`."""


@dataclass
class Outcome:
    message: dict
    parked: ParkedTurn | None = None


@dataclass
class Turn:
    runtime: SessionRuntime
    live: LiveSession
    actor: str
    watcher: Watcher
    runner: object  # RunnerClient
    events: list[dict] = field(default_factory=list)
    # A successful provider.response, held back to be written in one store call
    # with the events that follow it (it arrives together with the step's result).
    carried: list[tuple[str, str, RawJson]] = field(default_factory=list)

    @property
    def session_id(self) -> str:
        return self.live.session_id

    async def emit(
        self,
        items: list[tuple[str, dict]],
        *,
        echo: bool = False,
        new_state: str | None = None,
        attribute_to: str | None = None,
        in_result: bool = True,
    ) -> list[dict]:
        """Persist (after any carried event), then broadcast. `echo` marks the caller's own input."""
        carried, self.carried = self.carried, []
        views = await self.runtime.store.append_events(
            self.session_id,
            carried + [(attribute_to or self.actor, kind, payload) for kind, payload in items],
            new_state=new_state,
        )
        own = views[len(carried):]
        if echo:  # before publishing, so the caller's own stream never sees them
            self.watcher.echo_ids.update(view["id"] for view in own)
        self.events.extend(views if in_result else views[: len(carried)])
        await self.runtime.publish(self.session_id, views)
        return own

    async def run(self, session, profile) -> Outcome:
        try:
            return await self._loop(session, profile)
        finally:
            if self.carried:  # the turn ended without writing anything after its last step
                await self.emit([])

    async def _loop(self, session, profile) -> Outcome:
        extensions: list[dict] = []
        for iteration in range(MAX_ITERATIONS):
            if iteration:  # re-read: updateClientTools applies from the next provider call
                session = await self.runtime.store.get_session(self.session_id) or session
            mcp = await self.runtime.ensure_mcp(self.live, profile)
            declared = toolset.ActingTools.of(session, self.actor, mcp)
            result = await self._provider_step(
                profile, self.live.history.messages_json(extensions), declared.advertised()
            )
            if result is None:
                return Outcome(UNAVAILABLE_MESSAGE)
            assistant = json.loads(result.message_json)
            content = assistant.get("content") or []
            tool_uses = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
            if not tool_uses:
                message = {"role": "assistant", "content": content}
                await self.emit([("server.message.send", message)])
                return Outcome(message)

            # One kind per block, by position: a model may reuse an id, and each block is
            # classified by its own name (the duplicate is refused when the turn resumes).
            kinds = [declared.classify(block["name"]) for block in tool_uses]
            await self.emit(
                [
                    (
                        "tool.call",
                        {
                            "id": block["id"],
                            "name": block["name"],
                            "input": block.get("input", {}),
                            "dispatch": kind,
                            "server_name": declared.mcp_server_for(block["name"]) if kind == "mcp" else None,
                        },
                    )
                    for block, kind in zip(tool_uses, kinds)
                ]
            )
            server_calls = [(block, kind) for block, kind in zip(tool_uses, kinds) if kind != "client"]
            results = await toolset.dispatch_server_tools(self, server_calls, declared)

            if "client" in kinds:
                kind_of = iter(kinds)
                tagged = [
                    {**block, "dispatch": next(kind_of)}
                    if isinstance(block, dict) and block.get("type") == "tool_use"
                    else block
                    for block in content
                ]
                message = {"role": "assistant", "content": tagged}
                await self.emit([("server.message.send", message)])
                parked = ParkedTurn(
                    owner=self.actor,
                    deadline=time.monotonic() + self.runtime.settings.turn_timeout,
                    tool_uses=[b for b in tagged if b.get("type") == "tool_use"],
                    server_results={r["tool_use_id"]: r for r in results},
                )
                return Outcome(message, parked=parked)
            extensions += [{"role": "assistant", "content": content}, {"role": "user", "content": results}]

        await self.emit(
            [("session.error", {"reason": "loop_limit", "max_iterations": MAX_ITERATIONS})], new_state="error"
        )
        return Outcome(UNAVAILABLE_MESSAGE)

    async def _provider_step(self, profile, messages_json: str, tools: list[dict]):
        """One runner call; records its events as they stream. None when the turn ends unavailable."""
        request = runner_pb2.StepRequest(
            session_id=self.session_id,
            primary_provider=profile.primary_provider,
            fallback_providers=list(profile.fallback_providers),
            messages_json=messages_json,
            tools_json=dump(tools),
        )
        result = None
        try:
            async for update in self.runner.RunStep(request, timeout=STEP_DEADLINE):
                if update.HasField("event"):
                    # Stored and sent as the runner wrote it: never re-serialized here.
                    event = (update.event.event_type, RawJson(update.event.payload_json))
                    if event[0] == "provider.response":
                        self.carried.append((self.actor, *event))  # written with what follows
                    else:
                        await self.emit([event])
                else:
                    result = update.result
        except grpc.aio.AioRpcError as exc:
            log.error("runner call for session %s failed: %s %s", self.session_id, exc.code().name, exc.details())
            raise TurnFailed(f"runner unavailable ({exc.code().name})") from exc
        if result is None:
            raise TurnFailed("runner ended the step without a result")
        if result.outcome == runner_pb2.StepResult.OK:
            return result
        if result.outcome == runner_pb2.StepResult.PROVIDER_CONFIG:
            payload = {"reason": "provider_config", "detail": result.detail}
        else:
            payload = {"reason": "all_providers_failed", "attempts": result.attempts}
        await self.emit([("session.error", payload)], new_state="error")
        return None
