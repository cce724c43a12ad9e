"""What the sync and async clients share: the wire shapes, the frames of the /rpc stream, the loop's
pure steps and the bookkeeping that lets a subscription resume without a gap or a duplicate."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import httpx

from bae_client.errors import ApiError, RpcCode, RpcError, TransportError, UnknownToolError
from bae_client.events import Delta, Event, EventType
from bae_client.tools import Tool

NDJSON = "application/x-ndjson"
DEFAULT_ADDR = "127.0.0.1:8080"
# A subscription waits for events indefinitely: no read timeout on its stream, only on connecting.
STREAM_TIMEOUT = httpx.Timeout(30.0, read=None)
# Reconnecting a subscription (server restarting, a proxy in between): the waits between attempts, then
# the last one repeated until RESUME_WINDOW seconds have passed since the connection dropped.
RESUME_BACKOFF = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
RESUME_WINDOW = 60.0
EVENTS_PAGE = 200


def base_url_from(base_url: str | None) -> str:
    if base_url is None:
        base_url = "http://" + (os.environ.get("BAE_ADDR") or DEFAULT_ADDR)
    return base_url.rstrip("/")


def key_from(client_key: str | None) -> str | None:
    return client_key if client_key is not None else os.environ.get("BAE_CLIENT_KEY") or None


def auth(key: str | None, what: str) -> dict[str, str]:
    if not key:
        raise ValueError(f"no {what}: pass client_key=… (or set BAE_CLIENT_KEY)")
    return {"Authorization": f"Bearer {key}"}


def open_body(tools: Sequence[Tool], client_version: str | None, fields: Mapping[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"tools": [tool.declaration() for tool in tools], **fields}
    if client_version is not None:
        body["client_version"] = client_version
    return body


def rpc_body(request_id: int, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params or {})}


RPC_HEADERS = {"Content-Type": "application/json", "Accept": NDJSON}


def transport_error(url: str, exc: httpx.TransportError) -> TransportError:
    """A TransportError that says what failed and what to do about it."""
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return TransportError(url, f"cannot reach the BAE server at {url} ({exc or type(exc).__name__}): is it "
                                   f"running? Start it with `bae run` (or `make run`), or point the client at it "
                                   f"with base_url=… or BAE_ADDR=host:port", exc)
    if isinstance(exc, httpx.TimeoutException):
        return TransportError(url, f"no answer from the BAE server at {url} in time ({type(exc).__name__}); "
                                   f"raise the client's timeout=… for long turns", exc)
    return TransportError(url, f"the connection to the BAE server at {url} failed: "
                               f"{type(exc).__name__}: {exc}", exc)


def problem(response: httpx.Response) -> ApiError:
    """The ApiError of a failed answer whose body has been read."""
    try:
        body = response.json()
    except ValueError:
        body = None
    return ApiError.from_body(response.status_code, body, response.text[:500])


def parse_frame(line: str) -> dict[str, Any] | None:
    """One NDJSON line as a frame; None for a blank line."""
    if not line.strip():
        return None
    try:
        frame = json.loads(line)
    except ValueError as exc:
        raise RpcError(RpcCode.PARSE_ERROR, f"the server sent a line that is not JSON: {line[:200]!r}") from exc
    if not isinstance(frame, dict):
        raise RpcError(RpcCode.PARSE_ERROR, f"the server sent a frame that is not an object: {line[:200]!r}")
    return frame


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
        return "".join(str(block.get("text", "")) for block in content or []
                       if isinstance(block, dict) and block.get("type") == "text")

    @property
    def client_tool_calls(self) -> list[dict[str, Any]]:
        """The tool_use blocks this client must answer (`dispatch: "client"`; the others are the server's)."""
        return [block for block in tool_uses(self.message) if block.get("dispatch") == "client"]


def tool_uses(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict) and block.get("type") == "tool_use"]


def calls_to_run(message: Mapping[str, Any], tools: Mapping[str, Tool]) -> list[dict[str, Any]]:
    """The client's calls of an assistant message. The server's `dispatch` tag decides; a block without one
    (an older server) is the client's when it names one of its tools."""
    return [block for block in tool_uses(message)
            if (block["dispatch"] == "client" if block.get("dispatch") is not None else block.get("name") in tools)]


def reply_of(result: Any) -> Reply:
    result = result if isinstance(result, dict) else {}
    message = result.get("message")
    return Reply(message if isinstance(message, dict) else {},
                 [Event.from_wire(event) for event in result.get("events") or [] if isinstance(event, dict)])


def providers_failed(reply: Reply) -> bool:
    """A turn whose every provider failed ends with a normal result carrying a `session.error` event
    (`all_providers_failed`), not with an error frame."""
    return any(event.event_type == EventType.SESSION_ERROR and event.payload.get("reason") == "all_providers_failed"
               for event in reply.events)


def tool_for(call: Mapping[str, Any], tools: Mapping[str, Tool]) -> Tool:
    tool = tools.get(str(call.get("name", "")))
    if tool is None or tool.handler is None:
        raise UnknownToolError(str(call.get("name", "")))
    return tool


def result_block(call: Mapping[str, Any], output: Any) -> dict[str, Any]:
    content = output if isinstance(output, (str, list)) else json.dumps(output)
    return {"type": "tool_result", "tool_use_id": call.get("id"), "content": content}


def tool_map(tools: Sequence[Tool]) -> dict[str, Tool]:
    return {tool.name: tool for tool in tools}


def page_params(cursor: str | None, limit: int | None) -> dict[str, str]:
    return {name: str(value) for name, value in (("cursor", cursor), ("limit", limit)) if value is not None}


def subscribe_params(since_event_id: str | None, deltas: bool) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if since_event_id:
        params["since_event_id"] = since_event_id
    if deltas:
        params["deltas"] = True
    return params


class Resumable:
    """What a subscription has delivered, so that after a reconnect (with since_event_id = the last event
    delivered) nothing is delivered twice or skipped.

    Events: the server replays exactly those after since_event_id. Deltas are never stored, so a reconnect
    gets, for a provider call still streaming, one catch-up delta per content block holding all of that
    block so far: the part already delivered is cut off, and deltas at or below a seq already delivered are
    dropped.
    """

    def __init__(self, since_event_id: str | None) -> None:
        self.last_event_id = since_event_id
        # request_event_id -> (last seq delivered, {block index: text delivered})
        self.calls: dict[str, tuple[int, dict[int, str]]] = {}
        self.fresh: set[tuple[str, int]] = set()  # blocks whose first delta on this connection is a catch-up

    def reconnected(self) -> None:
        self.fresh = {(request, index) for request, (_, blocks) in self.calls.items() for index in blocks}

    def event(self, frame: Mapping[str, Any]) -> Event | None:
        event = Event.from_wire(frame)
        if event.event_id and event.event_id == self.last_event_id:
            return None
        self.last_event_id = event.event_id or self.last_event_id
        if event.event_type == EventType.PROVIDER_RESPONSE:
            # A session's provider calls run one at a time and a call's response follows its last delta, so
            # no delta of any call tracked so far can come any more.
            self.calls.clear()
            self.fresh.clear()
        return event

    def delta(self, frame: Mapping[str, Any]) -> Delta | None:
        delta = Delta.from_wire(frame)
        last, blocks = self.calls.get(delta.request_event_id, (-1, {}))
        if delta.kind == "reset":
            self.calls[delta.request_event_id] = (max(last, delta.seq), {})
            return delta
        key = (delta.request_event_id, delta.index)
        if key in self.fresh:
            self.fresh.discard(key)
            seen = blocks.get(delta.index, "")
            text = delta.text[len(seen):] if delta.text.startswith(seen) else delta.text
            blocks[delta.index] = delta.text
            self.calls[delta.request_event_id] = (max(last, delta.seq), blocks)
            if not text:
                return None
            return Delta(delta.session_id, delta.request_event_id, delta.seq, delta.index, delta.kind, text)
        if delta.seq <= last:
            return None
        blocks[delta.index] = blocks.get(delta.index, "") + delta.text
        self.calls[delta.request_event_id] = (delta.seq, blocks)
        return delta
