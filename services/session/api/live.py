"""The live JSON-RPC methods of `POST /api/v1/sessions/{id}/rpc` (SERVER-SPEC §6, §7):
registration, client tools, subscriptions and turns. The sandbox methods are
in `sandbox_methods`.

Each method authenticates the session key, then runs its checks in the
spec's order. Live methods stream `RpcFrame`s: `accepted` first, then
events, then the terminal frame. A `sendMessage` turn runs in its own task:
a client that disconnects stops only the delivery, never the turn.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

from bae import serde
from bae.jsontext import RawJson, dump
from bae.protos import session_pb2
from services.session.engine.feed import Lagged, Watcher
from services.session.engine.gate import Claim, ParkedTurn
from services.session.engine.history import History
from services.session.api.jsonrpc import (
    ACCEPTED,
    PROFILE_GONE,
    InvalidParams,
    RpcError,
    error_frame,
    error_reply,
    gate,
    not_open,
    parse_message,
    parse_params,
    result_reply,
)
from services.session.engine.merge import (
    MergeInvalid,
    has_tool_result,
    is_continuation,
    merge_abandonment,
    merge_continuation,
)
from services.session.remote.runner import RunnerClient
from services.session.engine.sandbox_calls import available_images
from services.session.engine.turn import Outcome, Turn, TurnFailed

log = logging.getLogger("bae.session.live")

ORPHAN_RESULT = (
    "tool result merge invalid: no paused turn is awaiting tool results "
    "(it may have timed out and been retired)"
)


class LiveApi:
    def __init__(self, *, store, auth, runtime, settings) -> None:
        self.store = store
        self.auth = auth
        self.runtime = runtime
        self.runner = RunnerClient(settings.runner_grpc_addr, settings.rpc_timeout)

    async def _principal(self, request):
        return await self.auth.session_principal(
            request.authorization, request.has_authorization, request.session_id
        )

    # -- registration and tools -------------------------------------------------

    async def register_driver(self, request, context) -> session_pb2.RpcReply:
        principal, session, profile = await self.auth.session_principal_and_records(
            request.authorization, request.has_authorization, request.session_id
        )
        if problem := not_open(session):
            return error_reply(-32000, problem)
        live = self.runtime.get(request.session_id)
        actor = principal.client_key_id
        async with live.lock:
            if actor in live.drivers:
                return result_reply({"registered": True})
            items = [("session.driver.register", {})]
            if profile is not None and profile.available_sandboxes:
                images = available_images(self.runtime.sandboxes, profile)
                items.append(("session.sandbox.available", {"images": images}))
            try:
                await self.runtime.append(request.session_id, actor, items)
            except Exception:
                log.exception("registering a driver on %s failed", request.session_id)
                return error_reply(-32603, "Internal error")
            live.drivers.add(actor)
        return result_reply({"registered": True})

    async def update_client_tools(self, request, context) -> session_pb2.RpcReply:
        actor, _, profile, refusal = await gate(self.auth, self.runtime, request, "session.updateClientTools", needs_open=True)
        if refusal:
            return error_reply(*refusal)
        try:
            params = parse_params(request)
            if "tools" not in params:
                raise InvalidParams('Invalid params: missing "tools"')
            tools = params["tools"]
            if not isinstance(tools, list):
                raise InvalidParams(f"Invalid params: {serde.invalid_type(tools, 'a sequence')}")
            normalized = []
            for tool in tools:
                if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"].strip():
                    raise InvalidParams('Invalid params: every tool requires a non-empty "name"')
                normalized.append(
                    {
                        "name": tool["name"],
                        "description": tool.get("description"),
                        "input_schema": tool.get("input_schema") if tool.get("input_schema") is not None else {},
                    }
                )
        except InvalidParams as exc:
            return error_reply(-32602, str(exc))
        if profile is None:
            return error_reply(-32603, "Internal error")
        for tool in normalized:
            if tool["name"] == "remote_subagent_status" or tool["name"] not in profile.allowed_tools:
                return error_reply(
                    -32015, f'tool_not_allowed: tool "{tool["name"]}" is not in the profile\'s allowlist'
                )
        await self.store.set_client_tools(request.session_id, actor, normalized)
        return result_reply({"updated": True})

    # -- subscriptions ----------------------------------------------------------

    async def subscribe(self, request, context) -> AsyncIterator[session_pb2.RpcFrame]:
        await self._principal(request)
        yield ACCEPTED
        try:
            params = parse_params(request)
        except InvalidParams as exc:
            yield error_frame(-32602, str(exc))
            return
        since = params.get("since_event_id")
        session = await self.store.get_session(request.session_id)
        is_open = session is not None and session.state == "open"
        live = self.runtime.get(request.session_id) if is_open else None
        watcher = live.feed.watch(subscriber=True) if live else None
        replayed: set[str] = set()
        try:
            if isinstance(since, str):
                try:
                    seq = await self.store.event_seq(request.session_id, since) or 0
                    while True:
                        page = await self.store.list_events(request.session_id, seq, 200)
                        for seq, event in page:
                            replayed.add(event["id"])
                            yield session_pb2.RpcFrame(event_json=event.json)
                        if len(page) < 200:
                            break
                except Exception:
                    log.exception("replay for %s failed", request.session_id)
                    yield error_frame(-32000, "replay failed", RpcError.NULL_ID)
                    return
            if watcher is None:
                return  # a terminal session gets its replay, then the stream ends (O-8)
            async for frame in self._relay(watcher, skip=replayed):
                yield frame
        finally:
            if watcher is not None:
                live.feed.forget(watcher)

    async def _relay(self, watcher: Watcher, skip: set[str] = frozenset()) -> AsyncIterator[session_pb2.RpcFrame]:
        while True:
            try:
                items = await watcher.take()
            except Lagged:
                yield error_frame(-32000, "lagged; reconnect with since_event_id", RpcError.NO_ID)
                return
            if items is None:
                return
            for item in items:
                if isinstance(item, session_pb2.RpcFrame):
                    yield item
                    return
                if item["id"] not in skip:
                    yield session_pb2.RpcFrame(event_json=item.json)

    async def unsubscribe(self, request, context) -> session_pb2.RpcReply:
        await self._principal(request)
        live = self.runtime.sessions.get(request.session_id)
        if live is not None:
            live.feed.end_subscriptions()
        return result_reply({"unsubscribed": True})

    # -- turns ------------------------------------------------------------------

    async def send_message(self, request, context) -> AsyncIterator[session_pb2.RpcFrame]:
        actor, session, profile, refusal = await gate(self.auth, self.runtime, request, "session.sendMessage", needs_open=True)
        yield ACCEPTED
        if refusal:
            yield error_frame(*refusal)
            return
        try:
            message = parse_message(parse_params(request))
        except InvalidParams as exc:
            yield error_frame(-32602, str(exc))
            return
        live = self.runtime.get(request.session_id)
        watcher = Watcher(subscriber=False)
        holding = asyncio.Event()
        task = asyncio.create_task(self._turn(live, actor, message, watcher, holding, (session, profile)))
        try:
            async for frame in self._relay(watcher):
                yield frame
        finally:
            live.feed.forget(watcher)
            if not holding.is_set():
                task.cancel()  # still queued: the caller gave up, nothing was recorded

    async def _turn(
        self, live, actor: str, message: dict, watcher: Watcher, holding: asyncio.Event, records: tuple
    ) -> None:
        claim: Claim = await live.gate.acquire(actor)
        holding.set()
        outcome: Outcome | None = None
        try:
            if claim.waited:  # the session may have changed (closed, new tools) while queued
                records = await self.store.session_and_profile(live.session_id)
            outcome = await self._run_claimed(live, actor, message, watcher, claim, *records)
        except TurnFailed as exc:
            log.error("turn on %s failed: %s", live.session_id, exc)
            watcher.push(error_frame(-32000, "session loop failed"))
        except Exception:
            log.exception("turn on %s failed", live.session_id)
            watcher.push(error_frame(-32603, "Internal error"))
        finally:
            if outcome is not None and outcome.parked is not None:
                live.gate.park(outcome.parked)
            else:
                live.gate.release()

    async def _run_claimed(
        self, live, actor, message, watcher: Watcher, claim: Claim, session, profile
    ) -> Outcome | None:
        turn = Turn(self.runtime, live, actor, watcher, self.runner)
        parked: ParkedTurn | None = claim.parked
        if claim.reclaimed:
            await turn.emit(
                [("session.error", {"reason": "driver_turn_abandoned", "owner_client_key_id": parked.owner})],
                attribute_to=parked.owner,
                in_result=False,
            )
        if problem := not_open(session):
            watcher.push(error_frame(-32000, problem))
            return None
        role, content = message["role"], message["content"]
        server_ids: set[str] = set()
        if parked is not None:
            try:
                if role != "user":
                    raise MergeInvalid(f'paused tool continuation must have role "user", got "{role}"')
                if claim.reclaimed:
                    content = merge_abandonment(parked.tool_uses, parked.server_results, content, timed_out=True)
                elif is_continuation(content):
                    content = merge_continuation(parked.tool_uses, parked.server_results, content)
                else:
                    content = merge_abandonment(parked.tool_uses, parked.server_results, content, timed_out=False)
            except MergeInvalid as exc:
                await turn.emit(
                    [("session.error", {"reason": "tool_result_merge_invalid", "detail": str(exc)})],
                    new_state="error",
                )
                watcher.push(error_frame(-32000, f"tool result merge invalid: {exc}"))
                return None
            server_ids = set(parked.server_results)
        elif has_tool_result(content):
            watcher.push(error_frame(-32000, ORPHAN_RESULT))
            return None

        if live.history is None:
            live.history = History.from_events(await self.store.message_events(live.session_id))
        live.feed.watchers.add(watcher)
        items = [("client.message.send", {"role": role, "content": content})]
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("tool_use_id") not in server_ids:
                items.append(
                    (
                        "tool.result",
                        {
                            "tool_use_id": block.get("tool_use_id"),
                            "dispatch": "client",
                            "server_name": None,
                            "is_error": bool(block.get("is_error", False)),
                            "content": block.get("content"),
                        },
                    )
                )
        await turn.emit(items, echo=True)

        if profile is None:
            await turn.emit(
                [("session.error", {"reason": "profile_unavailable", "profile_id": session.profile_id})],
                new_state="error",
            )
            watcher.push(error_frame(-32000, PROFILE_GONE))
            return None
        outcome = await turn.run(session, profile)
        events = RawJson("[" + ",".join(view.json for view in turn.events) + "]")
        watcher.push(session_pb2.RpcFrame(result_json=dump({"message": outcome.message, "events": events})))
        return outcome

    # -- methods of later issues -------------------------------------------------

    async def compact(self, request, context) -> AsyncIterator[session_pb2.RpcFrame]:
        await self._principal(request)
        yield ACCEPTED
        yield error_frame(-32601, "Method not found: session.compact")

    async def _not_available(self, request, method: str) -> session_pb2.RpcReply:
        await self._principal(request)
        return error_reply(-32601, f"Method not found: {method}")

    async def report_local_subagent(self, request, context):
        return await self._not_available(request, "session.reportLocalSubagent")

    async def cancel_subagent(self, request, context):
        return await self._not_available(request, "session.cancelSubagent")
