"""A small typed Python client for the client API (REST + JSON-RPC over NDJSON).

    from bae.client import Client

    with Client("http://127.0.0.1:8080") as bae:
        session = bae.open(client_key, tools=[ToolDef("get_time", "The current time")])
        reply = session.send("What time is it?", handlers={"get_time": lambda args: "12:00"})
        print(reply.text)

`Session.send` is the harness loop of the client API reference: it registers
the driver once, streams the turn (each live event goes to `on_event`), runs
the handler of every `dispatch:"client"` tool call, sends the results back and
repeats until the assistant answers without calling one of your tools.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import httpx

from bae.rpc_codes import RpcCode

Event = dict[str, Any]
EventHandler = Callable[[Event], None]
ToolHandler = Callable[[dict[str, Any]], Any]  # input -> result (str, or JSON-serialisable)
NDJSON = "application/x-ndjson"


class ApiError(Exception):
    """A REST problem document (RFC 7807): `type` is the stable slug, e.g. `session_closed`."""

    def __init__(self, status: int, type: str, detail: str) -> None:
        super().__init__(f"{status} {type}: {detail}")
        self.status, self.type, self.detail = status, type, detail


class RpcError(Exception):
    """A JSON-RPC error frame, e.g. -32001 when the driver was not registered."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.data = code, message, data


@dataclass(frozen=True)
class ToolDef:
    """A client tool declaration (sent at open/join; the profile must allow its name)."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


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


def _raise_for_problem(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    problem = problem if isinstance(problem, dict) else {}
    raise ApiError(response.status_code, str(problem.get("type", "unknown")), str(problem.get("detail", response.text)))


class Client:
    """The client port: opens and joins sessions with a client key (`bae_…`)."""

    def __init__(self, base_url: str, timeout: float | None = 300.0) -> None:
        self.http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def meta(self) -> dict[str, Any]:
        response = self.http.get("/api/v1/meta")
        _raise_for_problem(response)
        return response.json()

    def open(self, client_key: str, *, tools: Sequence[ToolDef] = (), client_version: str | None = None,
             **body: Any) -> Session:
        """POST /api/v1/sessions; `body` carries the other open fields (e.g. `compaction`)."""
        request = {"tools": [tool.to_json() for tool in tools], **body}
        if client_version is not None:
            request["client_version"] = client_version
        return self._session("/api/v1/sessions", client_key, request)

    def join(self, session_id: str, client_key: str, *, tools: Sequence[ToolDef] = (), **body: Any) -> Session:
        """POST /api/v1/sessions/{id}/join: a new session key for another client key on the same profile."""
        request = {"tools": [tool.to_json() for tool in tools], **body}
        return self._session(f"/api/v1/sessions/{session_id}/join", client_key, request)

    def _session(self, path: str, client_key: str, body: dict[str, Any]) -> Session:
        response = self.http.post(path, json=body, headers={"Authorization": f"Bearer {client_key}"})
        _raise_for_problem(response)
        opened = response.json()
        return Session(self.http, opened["session_id"], opened["session_key"], opened.get("profile", {}))


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
                _raise_for_problem(response)
            for line in response.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def call(self, method: str, params: dict[str, Any] | None = None,
             on_event: EventHandler | None = None) -> Any:
        """One call to its terminal frame: its `result`; notifications go to `on_event` meanwhile."""
        for frame in self.frames(method, params):
            if frame.get("method") == "session.event":
                if on_event is not None:
                    on_event(frame["params"])
            elif "error" in frame:
                error = frame["error"]
                raise RpcError(error.get("code", 0), error.get("message", ""), error.get("data"))
            elif "result" in frame:
                return frame["result"]
        raise RpcError(RpcCode.APPLICATION_ERROR, f"{method}: the stream ended without a terminal frame")

    def register_driver(self) -> None:
        self.call("session.registerDriver")
        self.registered = True

    def send_message(self, content: str | list[dict[str, Any]], on_event: EventHandler | None = None) -> Reply:
        """One `session.sendMessage` (registers the driver first if this object has not)."""
        if not self.registered:
            self.register_driver()
        result = self.call("session.sendMessage", {"message": {"role": "user", "content": content}}, on_event)
        return Reply(result["message"], result.get("events", []))

    def send(self, content: str | list[dict[str, Any]], handlers: dict[str, ToolHandler] | None = None,
             on_event: EventHandler | None = None) -> Reply:
        """The harness loop: answer every client tool call with its handler until the model is done.

        A call to a tool without a handler is answered with an error result, so the turn never hangs.
        """
        handlers = handlers or {}
        reply = self.send_message(content, on_event)
        while reply.client_tool_calls:
            results = [self._run_tool(call, handlers) for call in reply.client_tool_calls]
            reply = self.send_message(results, on_event)
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

    def subscribe(self, since_event_id: str | None = None, timeout: float | None = None) -> Iterator[Event]:
        """Live events (after replaying those following `since_event_id`), until the stream ends."""
        params = {"since_event_id": since_event_id} if since_event_id else {}
        for frame in self.frames("session.subscribe", params, timeout=timeout):
            if frame.get("method") == "session.event":
                yield frame["params"]
            elif "error" in frame:
                error = frame["error"]
                raise RpcError(error.get("code", 0), error.get("message", ""), error.get("data"))

    def unsubscribe(self) -> None:
        self.call("session.unsubscribe")

    # --- REST -----------------------------------------------------------------------------------

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        response = self.http.get(f"/api/v1/sessions/{self.id}{path}", params=params, headers=self._auth)
        _raise_for_problem(response)
        return response.json()

    def events(self, cursor: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """One page of persisted events: `{"items": [...], "next_cursor": ...}`."""
        params = {key: str(value) for key, value in (("cursor", cursor), ("limit", limit)) if value is not None}
        return self._get("/events", params)

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
        return self._get("/participants")["drivers"]

    def close(self) -> dict[str, Any]:
        """DELETE the session (closes it for every participant)."""
        response = self.http.delete(f"/api/v1/sessions/{self.id}", headers=self._auth)
        _raise_for_problem(response)
        return response.json()
