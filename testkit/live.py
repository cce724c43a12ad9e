"""Helpers for driving the JSON-RPC/NDJSON endpoint in tests.

`stack` arguments are testkit.stack.RunningStack objects (anything with .client,
.admin, .create_profile, .create_key and .open_session).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from typing import Any

import httpx

from testkit.openapi_check import frame_errors

_ids = iter(range(1, 1_000_000))


def rpc(client: httpx.Client, session_id: str, key: str, method: str, params: Any = None, **request) -> list[dict]:
    """One JSON-RPC call; returns every NDJSON line as parsed JSON."""
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": method, **request}
    if params is not None:
        body["params"] = params
    response = client.post(
        f"/api/v1/sessions/{session_id}/rpc", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    frames = [json.loads(line) for line in response.text.splitlines()]
    for frame in frames:  # each as the OpenAPI document describes it
        assert not frame_errors(frame), (frame, frame_errors(frame))
    return frames


def terminal(frames: list[dict]) -> dict:
    assert frames and "id" in frames[-1], frames
    return frames[-1]


def result(frames: list[dict]) -> dict:
    last = terminal(frames)
    assert "result" in last, last
    return last["result"]


def notifications(frames: list[dict]) -> list[dict]:
    return [f["params"] for f in frames if f.get("method") == "session.event"]


def types(events: list[dict]) -> list[str]:
    return [e["event_type"] for e in events]


def payloads(events: list[dict], event_type: str) -> list[dict]:
    return [e["payload"] for e in events if e["event_type"] == event_type]


def at(event: dict) -> float:
    """An event's created_at as a Unix timestamp."""
    return datetime.fromisoformat(event["created_at"].replace("Z", "+00:00")).timestamp()


def declared(tools: tuple[str, ...]) -> list[dict]:
    """Client tool declarations for `tools`, each described by its own name."""
    return [{"name": t, "description": t, "input_schema": {"type": "object"}} for t in tools]


def new_session(stack, tools: tuple[str, ...] = ("get_time",), **profile) -> tuple[str, str, dict]:
    """A new profile allowing `tools` (plus `profile` fields) and a key on it that opens a session
    declaring them; returns (session id, session key, profile)."""
    profile_row = stack.create_profile(f"p{time.monotonic_ns()}", allowed_tools=list(tools), **profile)
    key = stack.create_key(profile_row["id"])["key"]
    opened = stack.open_session(key, tools=declared(tools))
    return opened["session_id"], opened["session_key"], profile_row


def join(stack, sid: str, profile: dict, name: str = "b") -> str:
    """A new client key on `profile` joins session `sid` declaring no tools; returns its session key."""
    key = stack.create_key(profile["id"], name=name)["key"]
    joined = stack.client.post(
        f"/api/v1/sessions/{sid}/join", json={"tools": []}, headers={"Authorization": f"Bearer {key}"}
    )
    assert joined.status_code == 201, joined.text
    return joined.json()["session_key"]


def register(stack, sid: str, skey: str) -> None:
    assert result(rpc(stack.client, sid, skey, "session.registerDriver")) == {"registered": True}


def send(stack, sid: str, skey: str, content, **params) -> list[dict]:
    """`session.sendMessage` with `content`, and `params` beside the message (e.g. stream_deltas=True)."""
    return rpc(stack.client, sid, skey, "session.sendMessage",
               {"message": {"role": "user", "content": content}, **params})


def all_events(stack, sid: str, skey: str) -> list[dict]:
    """Every event of session `sid`, page after page."""
    auth = {"Authorization": f"Bearer {skey}"}
    items, cursor = [], ""
    while True:
        page = stack.client.get(
            f"/api/v1/sessions/{sid}/events", params={"limit": 200, "cursor": cursor}, headers=auth
        ).json()
        items += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            return items


def session_state(stack, sid: str) -> str:
    listed = stack.admin.get("/admin/v1/sessions", params={"limit": 200}).json()["items"]
    return next(row["state"] for row in listed if row["id"] == sid)


def turn_in_background(stack, sid: str, skey: str, text, **params) -> tuple[threading.Thread, dict]:
    """`send` on a thread of its own; its outcome gets "frames", or "error" when the call failed."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["frames"] = send(stack, sid, skey, text, **params)
        except Exception as exc:  # the stream is cut when the service (or the session's replica) stops
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome
