"""The asyncio client: AsyncClient, AsyncSession, AsyncSubscription (as the blocking ones, awaited).

Tool handlers, hooks and the on_event/on_delta callbacks may be plain functions or coroutine functions.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from contextlib import contextmanager
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence

import httpx

from bae_client import _protocol as p
from bae_client import sandbox
from bae_client._protocol import Reply
from bae_client.errors import (
    HookError,
    LaggedError,
    ProvidersFailedError,
    RpcCode,
    RpcError,
    ToolError,
    TransportError,
)
from bae_client.events import Delta, Event
from bae_client.hooks import Hooks
from bae_client.tools import Tool

EventCallback = Callable[[Event], Any]
DeltaCallback = Callable[[Delta], Any]


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class AsyncClient:
    """As Client, for asyncio: `async with AsyncClient(...) as bae: session = await bae.open(...)`.
    `transport` is an `httpx.AsyncBaseTransport` (e.g. `httpx.MockTransport`)."""

    def __init__(self, base_url: str | None = None, *, client_key: str | None = None,
                 timeout: float | None = 300.0, hooks: Hooks | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = p.base_url_from(base_url)
        self.client_key = p.key_from(client_key)
        self.hooks = hooks or Hooks()
        self.http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except httpx.TransportError as exc:
            raise p.transport_error(self.base_url, exc) from exc

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        with self._errors():
            response = await self.http.request(method, path, **kwargs)
        if not response.is_success:
            raise p.problem(response)
        return response.json() if response.content else None

    async def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = await self.request("GET", "/api/v1/meta")
        return meta

    async def open(self, *, tools: Sequence[Tool] = (), client_key: str | None = None,
                   client_version: str | None = None, **fields: Any) -> AsyncSession:
        return await self._session("/api/v1/sessions", tools, client_key, p.open_body(tools, client_version, fields))

    async def join(self, session_id: str, *, tools: Sequence[Tool] = (), client_key: str | None = None,
                   client_version: str | None = None, **fields: Any) -> AsyncSession:
        return await self._session(f"/api/v1/sessions/{session_id}/join", tools, client_key,
                                   p.open_body(tools, client_version, fields))

    async def _session(self, path: str, tools: Sequence[Tool], client_key: str | None,
                       body: dict[str, Any]) -> AsyncSession:
        headers = p.auth(client_key or self.client_key, "client key")
        opened = await self.request("POST", path, json=body, headers=headers)
        return AsyncSession(self, opened["session_id"], opened["session_key"], opened.get("profile") or {}, tools)


class AsyncSession:
    """As Session, awaited. `async with session:` closes nothing."""

    def __init__(self, client: AsyncClient, session_id: str, session_key: str, profile: dict[str, Any],
                 tools: Sequence[Tool] = ()) -> None:
        self.client, self.id, self.key, self.profile = client, session_id, session_key, profile
        self.tools = p.tool_map(tools)
        self.registered = False
        self._auth = {"Authorization": f"Bearer {session_key}"}
        self._next_id = 0

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    @property
    def hooks(self) -> Hooks:
        return self.client.hooks

    def _request(self, method: str, params: dict[str, Any] | None) -> httpx.Request:
        self._next_id += 1
        return self.client.http.build_request(
            "POST", f"/api/v1/sessions/{self.id}/rpc", json=p.rpc_body(self._next_id, method, params),
            headers={**self._auth, **p.RPC_HEADERS})

    async def _open_stream(self, method: str, params: dict[str, Any] | None,
                           timeout: httpx.Timeout | None = None) -> httpx.Response:
        request = self._request(method, params)
        if timeout is not None:
            request.extensions["timeout"] = timeout.as_dict()
        with self.client._errors():
            response = await self.client.http.send(request, stream=True)
        if not response.is_success:
            with self.client._errors():
                await response.aread()
            await response.aclose()
            raise p.problem(response)
        return response

    async def frames(self, method: str, params: dict[str, Any] | None = None) -> AsyncGenerator[dict[str, Any], None]:
        response = await self._open_stream(method, params)
        lines = response.aiter_lines()
        try:
            with self.client._errors():
                async for line in lines:
                    frame = p.parse_frame(line)
                    if frame is not None:
                        yield frame
        finally:
            # Closed here, in this task: left to the garbage collector, it would be closed from another.
            await lines.aclose()  # type: ignore[attr-defined]
            await response.aclose()

    async def call(self, method: str, params: dict[str, Any] | None = None, *,
                   on_event: EventCallback | None = None, on_delta: DeltaCallback | None = None) -> Any:
        frames = self.frames(method, params)
        try:
            async for frame in frames:
                notification = frame.get("method")
                if notification == "session.event":
                    if on_event is not None:
                        await _maybe_await(on_event(Event.from_wire(frame.get("params") or {})))
                elif notification == "session.delta":
                    if on_delta is not None:
                        await _maybe_await(on_delta(Delta.from_wire(frame.get("params") or {})))
                elif "error" in frame:
                    raise RpcError.from_frame(frame["error"])
                elif "result" in frame:
                    return frame["result"]
        finally:
            await frames.aclose()
        raise RpcError(RpcCode.INTERNAL_ERROR, f"{method}: the stream ended without a terminal frame")

    async def register_driver(self) -> None:
        await self.call("session.registerDriver")
        self.registered = True

    async def _drive(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """A call only a driver may make: this session's driver is registered first, once."""
        if not self.registered:
            await self.register_driver()
        return await self.call(method, params)

    async def _hook(self, name: str, hook: Callable[[Any], Any] | None, argument: Any) -> None:
        if hook is None:
            return
        try:
            await _maybe_await(hook(argument))
        except Exception as exc:
            raise HookError(name, exc) from exc

    async def send_message(self, content: str | list[dict[str, Any]], *, on_event: EventCallback | None = None,
                           on_delta: DeltaCallback | None = None) -> Reply:
        if not self.registered:
            await self.register_driver()
        message: dict[str, Any] = {"role": "user", "content": content}
        await self._hook("before_send", self.hooks.before_send, message)
        params: dict[str, Any] = {"message": message}
        if on_delta is not None:
            params["stream_deltas"] = True

        async def live(event: Event) -> None:
            await self._hook("on_event", self.hooks.on_event, event)
            if on_event is not None:
                await _maybe_await(on_event(event))

        reply = p.reply_of(await self.call("session.sendMessage", params, on_event=live, on_delta=on_delta))
        if p.providers_failed(reply):
            raise ProvidersFailedError(reply.message, reply.events)
        await self._hook("after_receive", self.hooks.after_receive, reply.message)
        return reply

    async def send(self, content: str | list[dict[str, Any]], *, on_event: EventCallback | None = None,
                   on_delta: DeltaCallback | None = None) -> Reply:
        reply = await self.send_message(content, on_event=on_event, on_delta=on_delta)
        while calls := p.calls_to_run(reply.message, self.tools):
            results = [await self._run_tool(call) for call in calls]
            reply = await self.send_message(results, on_event=on_event, on_delta=on_delta)
        return reply

    async def _run_tool(self, call: dict[str, Any]) -> dict[str, Any]:
        await self._hook("before_tool_call", self.hooks.before_tool_call, call)
        tool = p.tool_for(call, self.tools)
        assert tool.handler is not None
        try:
            output = await _maybe_await(tool.handler(call.get("input") or {}))
        except Exception as exc:
            raise ToolError(tool.name, exc) from exc
        block = p.result_block(call, output)
        await self._hook("after_tool_call", self.hooks.after_tool_call, block)
        return block

    async def update_client_tools(self, tools: Sequence[Tool]) -> None:
        await self._drive("session.updateClientTools", {"tools": [tool.declaration() for tool in tools]})
        self.tools = p.tool_map(tools)

    async def cancel_turn(self) -> bool:
        return bool((await self._drive("session.cancelTurn"))["cancelled"])

    async def compact(self, prompt: str | None = None) -> Event:
        return Event.from_wire(await self._drive("session.compact", {"prompt": prompt} if prompt is not None else {}))

    async def start_remote_sandbox(self, image: str) -> dict[str, Any]:
        started: dict[str, Any] = await self._drive("session.startRemoteSandbox", {"image": image})
        return started

    async def exec_remote_sandbox(self, command: str) -> dict[str, Any]:
        ran: dict[str, Any] = await self._drive("session.execRemoteSandbox", {"command": command})
        return ran

    async def stop_remote_sandbox(self) -> dict[str, Any]:
        stopped: dict[str, Any] = await self._drive("session.stopRemoteSandbox")
        return stopped

    def remote_shell_tool(self, name: str = sandbox.SHELL_NAME,
                          description: str = sandbox.SHELL_DESCRIPTION) -> Tool:
        async def run(input: dict[str, Any]) -> str:
            return sandbox.shell_result(await self.exec_remote_sandbox(sandbox.command_of(input)))

        return Tool(name, description, sandbox.SHELL_SCHEMA, run)

    def subscribe(self, *, since_event_id: str | None = None, deltas: bool = False,
                  resume: bool = True) -> AsyncSubscription:
        """`async with session.subscribe() as sub:` enters once the server has taken the subscription
        (or `sub = await session.subscribe()`); `async for item in sub` as Subscription."""
        return AsyncSubscription(self, since_event_id, deltas, resume)

    async def unsubscribe(self) -> None:
        await self.call("session.unsubscribe")

    async def events(self, cursor: str | None = None, limit: int | None = None) -> dict[str, Any]:
        page = await self.client.request("GET", f"/api/v1/sessions/{self.id}/events",
                                         params=p.page_params(cursor, limit), headers=self._auth)
        return {"items": [Event.from_wire(item) for item in page.get("items") or []],
                "next_cursor": page.get("next_cursor")}

    async def all_events(self) -> AsyncIterator[Event]:
        cursor = None
        while True:
            page = await self.events(cursor, p.EVENTS_PAGE)
            for event in page["items"]:
                yield event
            cursor = page["next_cursor"]
            if cursor is None:
                return

    async def drivers(self) -> list[str]:
        drivers: list[str] = (await self.client.request("GET", f"/api/v1/sessions/{self.id}/participants",
                                                        headers=self._auth))["drivers"]
        return drivers

    async def usage(self) -> dict[str, Any]:
        usage: dict[str, Any] = await self.client.request("GET", f"/api/v1/sessions/{self.id}/usage",
                                                          headers=self._auth)
        return usage

    async def close(self) -> dict[str, Any]:
        closed: dict[str, Any] = await self.client.request("DELETE", f"/api/v1/sessions/{self.id}",
                                                           headers=self._auth)
        return closed


class AsyncSubscription:
    """As Subscription, for asyncio. Connects when entered (`async with`) or awaited."""

    def __init__(self, session: AsyncSession, since_event_id: str | None, deltas: bool, resume: bool) -> None:
        self.session, self.deltas, self.resume = session, deltas, resume
        self.subscribed = False
        self.reconnects = 0
        self._since = since_event_id
        self._closed = False
        self._response: httpx.Response | None = None
        self._lines: AsyncIterator[str] | None = None
        self._state = p.Resumable(since_event_id)

    @property
    def last_event_id(self) -> str | None:
        return self._state.last_event_id

    async def start(self) -> AsyncSubscription:
        if self.subscribed or self._closed:
            return self
        if self._since is None and self.resume:
            last = None
            async for event in self.session.all_events():
                last = event.event_id
            self._state.last_event_id = last
        await self._connect()
        return self

    def __await__(self) -> Any:
        return self.start().__await__()

    async def __aenter__(self) -> AsyncSubscription:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _connect(self) -> None:
        params = p.subscribe_params(self._state.last_event_id, self.deltas)
        # The gateway answers with its headers once the session service holds the subscription.
        self._response = await self.session._open_stream("session.subscribe", params, p.STREAM_TIMEOUT)
        self._lines = self._response.aiter_lines()
        self._state.reconnected()
        self.subscribed = True

    async def _reconnect(self, cause: BaseException) -> None:
        """As Subscription._reconnect."""
        await self._drop()
        started = time.monotonic()
        attempt = 0
        while not self._closed:
            await asyncio.sleep(p.RESUME_BACKOFF[min(attempt, len(p.RESUME_BACKOFF) - 1)])
            attempt += 1
            try:
                await self._connect()
                self.reconnects += 1
                return
            except TransportError as error:
                if time.monotonic() - started > p.RESUME_WINDOW:
                    raise error from cause

    async def _drop(self) -> None:
        self.subscribed = False
        response, lines, self._response, self._lines = self._response, self._lines, None, None
        if lines is not None:
            try:
                await lines.aclose()  # type: ignore[attr-defined]
            except RuntimeError:
                pass  # being read in another task: closing the response below ends that read
        if response is not None:
            await response.aclose()

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> Event | Delta:
        if not self.subscribed and not self._closed and self._lines is None:
            await self.start()
        while True:
            if self._closed or self._lines is None:
                raise StopAsyncIteration
            try:
                line = await self._lines.__anext__()
            except StopAsyncIteration:
                await self.aclose()
                raise
            except httpx.TransportError as exc:
                if self._closed:
                    raise StopAsyncIteration from None
                error = p.transport_error(self.session.client.base_url, exc)
                if not self.resume:
                    await self.aclose()
                    raise error from exc
                await self._reconnect(error)
                continue
            frame = p.parse_frame(line)
            if frame is None:
                continue
            method = frame.get("method")
            if method == "session.event":
                event = self._state.event(frame.get("params") or {})
                if event is not None:
                    return event
            elif method == "session.delta":
                delta = self._state.delta(frame.get("params") or {}) if self.deltas else None
                if delta is not None:
                    return delta
            elif "error" in frame:
                failed = RpcError.from_frame(frame["error"])
                if isinstance(failed, LaggedError) and self.resume:
                    await self._reconnect(failed)
                    continue
                await self.aclose()
                raise failed

    async def aclose(self) -> None:
        self._closed = True
        await self._drop()
