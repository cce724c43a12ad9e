"""The blocking client: Client, Session, Subscription."""

from __future__ import annotations

import socket
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

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


class Client:
    """The client port of a BAE server: opens and joins sessions with a client key (`bae_…`).

    `base_url` defaults to `http://$BAE_ADDR` (127.0.0.1:8080), `client_key` to `$BAE_CLIENT_KEY`.
    `transport` replaces the network (e.g. `httpx.MockTransport` in tests).
    """

    def __init__(self, base_url: str | None = None, *, client_key: str | None = None,
                 timeout: float | None = 300.0, hooks: Hooks | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = p.base_url_from(base_url)
        self.client_key = p.key_from(client_key)
        self.hooks = hooks or Hooks()
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except httpx.TransportError as exc:
            raise p.transport_error(self.base_url, exc) from exc

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One REST call: its JSON body, ApiError on a problem, TransportError when nothing answered."""
        with self._errors():
            response = self.http.request(method, path, **kwargs)
        if not response.is_success:
            raise p.problem(response)
        return response.json() if response.content else None

    def meta(self) -> dict[str, Any]:
        """GET /api/v1/meta: `{"version", "api_versions"}` (no key needed)."""
        meta: dict[str, Any] = self.request("GET", "/api/v1/meta")
        return meta

    def open(self, *, tools: Sequence[Tool] = (), client_key: str | None = None, client_version: str | None = None,
             **fields: Any) -> Session:
        """POST /api/v1/sessions. `fields` are the other fields of the body (`compaction`, `sandbox_tools`,
        `subagent_tools`)."""
        return self._session("/api/v1/sessions", tools, client_key, p.open_body(tools, client_version, fields))

    def join(self, session_id: str, *, tools: Sequence[Tool] = (), client_key: str | None = None,
             client_version: str | None = None, **fields: Any) -> Session:
        """POST /api/v1/sessions/{id}/join: the session with a session key of this client key's own."""
        return self._session(f"/api/v1/sessions/{session_id}/join", tools, client_key,
                             p.open_body(tools, client_version, fields))

    def _session(self, path: str, tools: Sequence[Tool], client_key: str | None, body: dict[str, Any]) -> Session:
        headers = p.auth(client_key or self.client_key, "client key")
        opened = self.request("POST", path, json=body, headers=headers)
        return Session(self, opened["session_id"], opened["session_key"], opened.get("profile") or {}, tools)


class Session:
    """One session, driven with its session key (`bae_ses_…`). As a context manager it closes nothing:
    leaving the block only stops using it; `close()` ends the session for every participant."""

    def __init__(self, client: Client, session_id: str, session_key: str, profile: dict[str, Any],
                 tools: Sequence[Tool] = ()) -> None:
        self.client, self.id, self.key, self.profile = client, session_id, session_key, profile
        self.tools = p.tool_map(tools)
        self.registered = False
        self._auth = {"Authorization": f"Bearer {session_key}"}
        self._next_id = 0

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @property
    def hooks(self) -> Hooks:
        return self.client.hooks

    # --- JSON-RPC -------------------------------------------------------------------------------

    def _request(self, method: str, params: dict[str, Any] | None) -> httpx.Request:
        self._next_id += 1
        return self.client.http.build_request(
            "POST", f"/api/v1/sessions/{self.id}/rpc", json=p.rpc_body(self._next_id, method, params),
            headers={**self._auth, **p.RPC_HEADERS})

    def _open_stream(self, method: str, params: dict[str, Any] | None,
                     timeout: httpx.Timeout | None = None) -> httpx.Response:
        """The answer to one call, its headers read; a failed answer raises ApiError."""
        request = self._request(method, params)
        if timeout is not None:
            request.extensions["timeout"] = timeout.as_dict()
        with self.client._errors():
            response = self.client.http.send(request, stream=True)
        if not response.is_success:
            with self.client._errors():
                response.read()
            response.close()
            raise p.problem(response)
        return response

    def frames(self, method: str, params: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Every frame of one call as it arrives."""
        response = self._open_stream(method, params)
        try:
            with self.client._errors():
                for line in response.iter_lines():
                    frame = p.parse_frame(line)
                    if frame is not None:
                        yield frame
        finally:
            response.close()

    def call(self, method: str, params: dict[str, Any] | None = None, *, on_event: EventCallback | None = None,
             on_delta: DeltaCallback | None = None) -> Any:
        """One JSON-RPC call to its terminal frame: its `result` (RpcError for an error frame).
        Notifications meanwhile go to `on_event` (Event) and `on_delta` (Delta)."""
        for frame in self.frames(method, params):
            notification = frame.get("method")
            if notification == "session.event":
                if on_event is not None:
                    on_event(Event.from_wire(frame.get("params") or {}))
            elif notification == "session.delta":
                if on_delta is not None:
                    on_delta(Delta.from_wire(frame.get("params") or {}))
            elif "error" in frame:
                raise RpcError.from_frame(frame["error"])
            elif "result" in frame:
                return frame["result"]
        raise RpcError(RpcCode.INTERNAL_ERROR, f"{method}: the stream ended without a terminal frame")

    def register_driver(self) -> None:
        """`session.registerDriver`; send, send_message and cancel_turn call it once by themselves."""
        self.call("session.registerDriver")
        self.registered = True

    def _drive(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """A call only a driver may make: this session's driver is registered first, once."""
        if not self.registered:
            self.register_driver()
        return self.call(method, params)

    def _hook(self, name: str, hook: Callable[[Any], Any] | None, argument: Any) -> None:
        if hook is None:
            return
        try:
            hook(argument)
        except Exception as exc:
            raise HookError(name, exc) from exc

    def send_message(self, content: str | list[dict[str, Any]], *, on_event: EventCallback | None = None,
                     on_delta: DeltaCallback | None = None) -> Reply:
        """One `session.sendMessage` (no loop): the hooks before_send, on_event (live) and after_receive run.
        With `on_delta` the provider output streams to it as it is generated. ProvidersFailedError when every
        provider failed."""
        if not self.registered:
            self.register_driver()
        message: dict[str, Any] = {"role": "user", "content": content}
        self._hook("before_send", self.hooks.before_send, message)
        params: dict[str, Any] = {"message": message}
        if on_delta is not None:
            params["stream_deltas"] = True

        def live(event: Event) -> None:
            self._hook("on_event", self.hooks.on_event, event)
            if on_event is not None:
                on_event(event)

        reply = p.reply_of(self.call("session.sendMessage", params, on_event=live, on_delta=on_delta))
        if p.providers_failed(reply):
            raise ProvidersFailedError(reply.message, reply.events)
        self._hook("after_receive", self.hooks.after_receive, reply.message)
        return reply

    def send(self, content: str | list[dict[str, Any]], *, on_event: EventCallback | None = None,
             on_delta: DeltaCallback | None = None) -> Reply:
        """The harness loop: send, run the handler of each client tool call (with its hooks), send the
        results back, and repeat until the model answers without calling a client tool.

        A call of a tool without a handler raises UnknownToolError, a handler that raises ToolError; either
        leaves the turn paused on the server (answer it with send_message, or cancel_turn)."""
        reply = self.send_message(content, on_event=on_event, on_delta=on_delta)
        while calls := p.calls_to_run(reply.message, self.tools):
            results = [self._run_tool(call) for call in calls]
            reply = self.send_message(results, on_event=on_event, on_delta=on_delta)
        return reply

    def _run_tool(self, call: dict[str, Any]) -> dict[str, Any]:
        self._hook("before_tool_call", self.hooks.before_tool_call, call)
        tool = p.tool_for(call, self.tools)
        assert tool.handler is not None
        try:
            output = tool.handler(call.get("input") or {})
        except Exception as exc:
            raise ToolError(tool.name, exc) from exc
        block = p.result_block(call, output)
        self._hook("after_tool_call", self.hooks.after_tool_call, block)
        return block

    def update_client_tools(self, tools: Sequence[Tool]) -> None:
        """`session.updateClientTools`: this client's tools (and their handlers) from the next provider call on."""
        self._drive("session.updateClientTools", {"tools": [tool.declaration() for tool in tools]})
        self.tools = p.tool_map(tools)

    def cancel_turn(self) -> bool:
        """`session.cancelTurn`: stop the session's running or paused turn. True when one was stopped (its
        send raises TurnCancelledError). Call it from another thread than the one sending."""
        return bool(self._drive("session.cancelTurn")["cancelled"])

    def compact(self, prompt: str | None = None) -> Event:
        """`session.compact`: the `session.compaction.completed` event."""
        return Event.from_wire(self._drive("session.compact", {"prompt": prompt} if prompt is not None else {}))

    def start_remote_sandbox(self, image: str) -> dict[str, Any]:
        """`session.startRemoteSandbox` -> `{"sandbox_id", "image", "started_at"}`."""
        started: dict[str, Any] = self._drive("session.startRemoteSandbox", {"image": image})
        return started

    def exec_remote_sandbox(self, command: str) -> dict[str, Any]:
        """`session.execRemoteSandbox`: one shell command in the running sandbox -> `{"stdout", "stderr",
        "exit_code"}`."""
        ran: dict[str, Any] = self._drive("session.execRemoteSandbox", {"command": command})
        return ran

    def stop_remote_sandbox(self) -> dict[str, Any]:
        """`session.stopRemoteSandbox` -> `{"stopped", "image", "sandbox_id"}`."""
        stopped: dict[str, Any] = self._drive("session.stopRemoteSandbox")
        return stopped

    def remote_shell_tool(self, name: str = sandbox.SHELL_NAME,
                          description: str = sandbox.SHELL_DESCRIPTION) -> Tool:
        """A client tool (Manual mode) running each call's `command` in this session's remote sandbox."""
        return Tool(name, description, sandbox.SHELL_SCHEMA,
                    lambda input: sandbox.shell_result(self.exec_remote_sandbox(sandbox.command_of(input))))

    def subscribe(self, *, since_event_id: str | None = None, deltas: bool = False,
                  resume: bool = True) -> Subscription:
        """`session.subscribe`: returns once the server has taken the subscription (`sub.subscribed`), so
        every event recorded from then on is delivered. Iterate it for Event objects (and Delta objects
        with `deltas=True`). With `resume`, a `lagged` end or a dropped connection reconnects from the
        last event delivered, with no gap and no duplicate."""
        return Subscription(self, since_event_id, deltas, resume)

    def unsubscribe(self) -> None:
        """`session.unsubscribe`: ends every subscription of this session (on every client)."""
        self.call("session.unsubscribe")

    # --- REST -----------------------------------------------------------------------------------

    def events(self, cursor: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """One page of stored events: `{"items": [Event, …], "next_cursor": str | None}`."""
        page = self.client.request("GET", f"/api/v1/sessions/{self.id}/events", params=p.page_params(cursor, limit),
                                   headers=self._auth)
        return {"items": [Event.from_wire(item) for item in page.get("items") or []],
                "next_cursor": page.get("next_cursor")}

    def all_events(self) -> Iterator[Event]:
        cursor = None
        while True:
            page = self.events(cursor, p.EVENTS_PAGE)
            yield from page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def drivers(self) -> list[str]:
        """GET …/participants: the client key ids registered as drivers."""
        drivers: list[str] = self.client.request("GET", f"/api/v1/sessions/{self.id}/participants",
                                                 headers=self._auth)["drivers"]
        return drivers

    def usage(self) -> dict[str, Any]:
        usage: dict[str, Any] = self.client.request("GET", f"/api/v1/sessions/{self.id}/usage", headers=self._auth)
        return usage

    def close(self) -> dict[str, Any]:
        """DELETE the session: it is closed for every participant."""
        closed: dict[str, Any] = self.client.request("DELETE", f"/api/v1/sessions/{self.id}", headers=self._auth)
        return closed


class Subscription:
    """A live `session.subscribe` stream (see Session.subscribe). Iterating yields Event and Delta objects
    until the stream ends (unsubscribe, session closed) or `close()`."""

    def __init__(self, session: Session, since_event_id: str | None, deltas: bool, resume: bool) -> None:
        self.session, self.deltas, self.resume = session, deltas, resume
        self.subscribed = False
        self.reconnects = 0
        self._closed = False
        self._response: httpx.Response | None = None
        self._lines: Iterator[str] | None = None
        if since_event_id is None and resume:
            since_event_id = self._anchor()
        self._state = p.Resumable(since_event_id)
        self._connect()

    @property
    def last_event_id(self) -> str | None:
        return self._state.last_event_id

    def _anchor(self) -> str | None:
        """The last stored event: reconnecting from it after a drop that came before any event is delivered
        misses nothing. (Subscribing from it replays only what was recorded while subscribing.)"""
        last = None
        for event in self.session.all_events():
            last = event.event_id
        return last

    def _connect(self) -> None:
        params = p.subscribe_params(self._state.last_event_id, self.deltas)
        # The gateway answers with its headers once the session service holds the subscription: from here
        # on, every event recorded is delivered.
        self._response = self.session._open_stream("session.subscribe", params, p.STREAM_TIMEOUT)
        self._lines = self._response.iter_lines()
        self._state.reconnected()
        self.subscribed = True

    def _reconnect(self, cause: BaseException) -> None:
        """Connect again from the last event delivered, retrying while the server is unreachable (it may be
        restarting) for up to RESUME_WINDOW seconds."""
        self._drop()
        started = time.monotonic()
        attempt = 0
        while not self._closed:
            time.sleep(p.RESUME_BACKOFF[min(attempt, len(p.RESUME_BACKOFF) - 1)])
            attempt += 1
            try:
                self._connect()
                self.reconnects += 1
                return
            except TransportError as error:
                if time.monotonic() - started > p.RESUME_WINDOW:
                    raise error from cause

    def _drop(self) -> None:
        self.subscribed = False
        if self._response is not None:
            self._response.close()
        self._response, self._lines = None, None

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Event | Delta]:
        return self

    def __next__(self) -> Event | Delta:
        while True:
            if self._closed or self._lines is None:
                raise StopIteration
            try:
                line = next(self._lines)
            except StopIteration:
                # The server ended the stream: an unsubscribe, or the session closed.
                self.close()
                raise
            except httpx.TransportError as exc:
                if self._closed:
                    raise StopIteration from None
                error = p.transport_error(self.session.client.base_url, exc)
                if not self.resume:
                    self.close()
                    raise error from exc
                self._reconnect(error)
                continue
            item = self._item(line)
            if item is not None:
                return item

    def _item(self, line: str) -> Event | Delta | None:
        frame = p.parse_frame(line)
        if frame is None:
            return None
        method = frame.get("method")
        if method == "session.event":
            return self._state.event(frame.get("params") or {})
        if method == "session.delta":
            return self._state.delta(frame.get("params") or {}) if self.deltas else None
        if "error" in frame:
            error = RpcError.from_frame(frame["error"])
            if isinstance(error, LaggedError) and self.resume:
                self._reconnect(error)
                return None
            self.close()
            raise error
        return None

    def close(self) -> None:
        """Stop reading: the connection is closed, which ends the subscription on the server. Another thread
        iterating meanwhile stops too."""
        self._closed = True
        if self._response is not None:
            # A read blocked in another thread wakes only when the socket itself is shut down.
            stream = self._response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._drop()
