"""Helpers for driving the JSON-RPC/NDJSON endpoint in tests."""

from __future__ import annotations

import json
from typing import Any

import httpx

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
    return [json.loads(line) for line in response.text.splitlines()]


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
