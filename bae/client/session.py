"""One open session: JSON-RPC calls over NDJSON (the harness loop among them) and its REST reads."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import httpx

from bae.client.errors import RpcCode, RpcError, raise_for_problem

Event = dict[str, Any]
EventHandler = Callable[[Event], None]
# A `session.delta`'s params: {"session_id", "request_event_id", "seq", "index", "kind", "text"}.
Delta = dict[str, Any]
DeltaHandler = Callable[[Delta], None]
ToolHandler = Callable[[dict[str, Any]], Any]  # input -> result (str, or JSON-serialisable)
NDJSON = "application/x-ndjson"


@dataclass(frozen=True)
class Reply:
    """The terminal result of one `session.sendMessage`: the assistant message and the turn's events."""

    message: dict[str, Any]
    events: list[Event]

    @property
    def text(self) -> str:
        content = self.message.get("content")
        if isinstance(content, str):
            return content
        return "".join(block.get("text", "") for block in content or [] if block.get("type") == "text")

    @property
    def client_tool_calls(self) -> list[dict[str, Any]]:
        """The tool_use blocks this client must answer (every other dispatch is the server's)."""
        content = self.message.get("content")
        return [block for block in content if isinstance(block, dict) and block.get("type") == "tool_use"
                and block.get("dispatch") == "client"] if isinstance(content, list) else []


class Session:
    """One session, driven with its session key (`bae_ses_…`)."""

    def __init__(self, http: httpx.Client, session_id: str, session_key: str, profile: dict[str, Any]) -> None:
        self.http, self.id, self.key, self.profile = http, session_id, session_key, profile
        self._auth = {"Authorization": f"Bearer {session_key}"}
        self._ids = itertools.count(1)
        self.registered = False

    # --- JSON-RPC -------------------------------------------------------------------------------

    def frames(self, method: str, params: dict[str, Any] | None = None,
               timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Every NDJSON frame of one call as it arrives (a subscribe stream has no end of its own)."""
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or {}}
        headers = {**self._auth, "Content-Type": "application/json", "Accept": NDJSON}
        with self.http.stream("POST", f"/api/v1/sessions/{self.id}/rpc", json=body, headers=headers,
                              timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout) as response:
            if not response.is_success:
                response.read()
                raise_for_problem(response)
            for line in response.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def call(self, method: str, params: dict[str, Any] | None = None,
             on_event: EventHandler | None = None, on_delta: DeltaHandler | None = None) -> Any:
        """One call to its terminal frame: its `result`; notifications go to `on_event` and `on_delta`
        meanwhile."""
        for frame in self.frames(method, params):
            if frame.get("method") == "session.event":
                if on_event is not None:
                    on_event(frame["params"])
            elif frame.get("method") == "session.delta":
                if on_delta is not None:
                    on_delta(frame["params"])
            elif "error" in frame:
                error = frame["error"]
                raise RpcError(error.get("code", 0), error.get("message", ""), error.get("data"))
            elif "result" in frame:
                return frame["result"]
        raise RpcError(RpcCode.APPLICATION_ERROR, f"{method}: the stream ended without a terminal frame")

    def register_driver(self) -> None:
        self.call("session.registerDriver")
        self.registered = True

    def send_message(self, content: str | list[dict[str, Any]], on_event: EventHandler | None = None,
                     on_delta: DeltaHandler | None = None) -> Reply:
        """One `session.sendMessage` (registers the driver first if this object has not). With
        `on_delta`, the turn's provider output streams to it as it is generated (`stream_deltas`)."""
        if not self.registered:
            self.register_driver()
        params: dict[str, Any] = {"message": {"role": "user", "content": content}}
        if on_delta is not None:
            params["stream_deltas"] = True
        result = self.call("session.sendMessage", params, on_event, on_delta)
        return Reply(result["message"], result.get("events", []))

    def send(self, content: str | list[dict[str, Any]], handlers: dict[str, ToolHandler] | None = None,
             on_event: EventHandler | None = None, on_delta: DeltaHandler | None = None) -> Reply:
        """The harness loop: answer every client tool call with its handler until the model is done.

        A call to a tool without a handler is answered with an error result, so the turn never hangs.
        `on_delta` gets the provider output of every call of the loop as it streams.
        """
        handlers = handlers or {}
        reply = self.send_message(content, on_event, on_delta)
        while reply.client_tool_calls:
            results = [self._run_tool(call, handlers) for call in reply.client_tool_calls]
            reply = self.send_message(results, on_event, on_delta)
        return reply

    @staticmethod
    def _run_tool(call: dict[str, Any], handlers: dict[str, ToolHandler]) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call["id"]}
        handler = handlers.get(call.get("name", ""))
        if handler is None:
            return {**block, "content": f"no handler for tool {call.get('name')!r}", "is_error": True}
        try:
            output = handler(call.get("input") or {})
        except Exception as exc:  # the model sees the failure instead of the turn breaking
            return {**block, "content": f"{type(exc).__name__}: {exc}", "is_error": True}
        return {**block, "content": output if isinstance(output, (str, list)) else json.dumps(output)}

    def cancel_turn(self) -> bool:
        """`session.cancelTurn`: stop the session's running or paused turn (registers the driver first
        if this object has not). True when a turn was stopped; its `send_message` raises RpcError -32052."""
        if not self.registered:
            self.register_driver()
        cancelled: bool = self.call("session.cancelTurn")["cancelled"]
        return cancelled

    def subscribe(self, since_event_id: str | None = None, timeout: float | None = None,
                  on_delta: DeltaHandler | None = None) -> Iterator[Event]:
        """Live events (after replaying those following `since_event_id`), until the stream ends.
        With `on_delta`, provider output streams to it too: first a catch-up of the call streaming
        now (one delta per content block, holding what it streamed so far), then as it comes."""
        params: dict[str, Any] = {"since_event_id": since_event_id} if since_event_id else {}
        if on_delta is not None:
            params["deltas"] = True
        for frame in self.frames("session.subscribe", params, timeout=timeout):
            if frame.get("method") == "session.event":
                yield frame["params"]
            elif frame.get("method") == "session.delta":
                if on_delta is not None:
                    on_delta(frame["params"])
            elif "error" in frame:
                error = frame["error"]
                raise RpcError(error.get("code", 0), error.get("message", ""), error.get("data"))

    def unsubscribe(self) -> None:
        self.call("session.unsubscribe")

    # --- REST -----------------------------------------------------------------------------------

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        response = self.http.get(f"/api/v1/sessions/{self.id}{path}", params=params, headers=self._auth)
        raise_for_problem(response)
        return response.json()

    def events(self, cursor: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """One page of persisted events: `{"items": [...], "next_cursor": ...}`."""
        params = {key: str(value) for key, value in (("cursor", cursor), ("limit", limit)) if value is not None}
        page: dict[str, Any] = self._get("/events", params)
        return page

    def all_events(self) -> Iterator[Event]:
        cursor = None
        while True:
            page = self.events(cursor)
            yield from page["items"]
            cursor = page.get("next_cursor")
            if cursor is None:
                return

    def drivers(self) -> list[str]:
        """GET …/participants: the client key ids registered as drivers."""
        drivers: list[str] = self._get("/participants")["drivers"]
        return drivers

    def close(self) -> dict[str, Any]:
        """DELETE the session (closes it for every participant)."""
        response = self.http.delete(f"/api/v1/sessions/{self.id}", headers=self._auth)
        raise_for_problem(response)
        closed: dict[str, Any] = response.json()
        return closed
