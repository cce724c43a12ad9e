"""Quotas and the rate limit, through the gateway: the [limits] defaults, a profile's overrides,
and what a caller over them gets (429 `quota_exceeded` / -32050, 429 `rate_limited`)."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from testkit.inprocess import launch_inprocess_stack
from testkit.live import declared, rpc, terminal
from testkit.stack import mock_provider_toml
from testkit.streams import Listener

pytestmark = pytest.mark.inprocess

TOKEN = "sk-test-secret-token-123456"
LIMITS = """
[limits]
max_open_sessions_per_key = 2
max_subscribers_per_session = 2
requests_per_second_per_key = 1000.0
burst = 1000
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory, mock):
    running = launch_inprocess_stack(
        tmp_path_factory.mktemp("limits"), mock_provider_toml(mock.base_url) + LIMITS, MOCK_LLM_TOKEN=TOKEN
    )
    yield running
    running.close()


def new_key(stack, **profile) -> tuple[str, dict]:
    row = stack.create_profile(f"p{time.monotonic_ns()}", allowed_tools=["t"], **profile)
    return stack.create_key(row["id"])["key"], row


def open_session(stack, key: str) -> httpx.Response:
    return stack.client.post("/api/v1/sessions", json={"tools": declared(("t",))},
                             headers={"Authorization": f"Bearer {key}"})


def session_count(stack) -> int:
    return len(stack.admin.get("/admin/v1/sessions", params={"limit": 200}).json()["items"])


def test_open_sessions_stop_at_the_quota_and_closing_one_frees_a_place(stack):
    key, _ = new_key(stack)
    opened = [open_session(stack, key).json() for _ in range(2)]
    before = session_count(stack)
    refused = open_session(stack, key)
    assert refused.status_code == 429
    assert refused.json() == {"type": "quota_exceeded", "title": "Too Many Requests", "status": 429,
                              "detail": "quota_exceeded: max_open_sessions_per_key 2 reached"}
    assert session_count(stack) == before  # nothing recorded, not even an audit row
    other, _ = new_key(stack)
    assert open_session(stack, other).status_code == 201  # another key's quota is its own
    sid, skey = opened[0]["session_id"], opened[0]["session_key"]
    assert stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"}).status_code == 200
    assert open_session(stack, key).status_code == 201


def test_a_profile_overrides_the_defaults_and_null_keeps_them(stack):
    key, profile = new_key(stack, limits={"max_open_sessions_per_key": 1, "session_tokens": None})
    assert stack.admin.get(f"/admin/v1/profiles/{profile['id']}").json()["limits"] == {"max_open_sessions_per_key": 1}
    assert open_session(stack, key).status_code == 201
    refused = open_session(stack, key)
    assert refused.status_code == 429 and refused.json()["detail"].endswith("max_open_sessions_per_key 1 reached")
    body = {"name": profile["name"], "primary_provider": "mock", "allowed_tools": ["t"], "limits": None}
    replaced = stack.admin.put(f"/admin/v1/profiles/{profile['id']}", json=body)
    assert replaced.status_code == 200 and replaced.json()["limits"] is None
    assert open_session(stack, key).status_code == 201  # the default, 2, applies again


@pytest.mark.parametrize("limits, detail", [
    ({"burst": 0}, "limits.burst must be at least 1"),
    ({"requests_per_second_per_key": 0}, "invalid request body: limits.requests_per_second_per_key must be above 0, at most 1000000000000"),
    ({"session_cost_usd": -1.5}, "invalid request body: limits.session_cost_usd must be at least 0, at most 1000000000000"),
    ({"max_sandboxes_per_key": "many"}, None),
])
def test_bad_profile_limits_are_refused(stack, limits, detail):
    response = stack.admin.post("/admin/v1/profiles", json={"name": f"bad{time.monotonic_ns()}",
                                                           "primary_provider": "mock", "limits": limits})
    assert response.status_code == 400, response.text
    if detail is not None:
        assert response.json()["detail"] == detail


class Subscription:
    """A session.subscribe stream on a socket of its own, read in a thread until it ends or is closed."""

    def __init__(self, stack, sid: str, skey: str) -> None:
        self.lines: list[dict] = []
        host, port = httpx.URL(stack.client_url).host, httpx.URL(stack.client_url).port
        self._socket = socket.create_connection((host, port))
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.subscribe", "params": {}}).encode()
        self._socket.sendall(
            f"POST /api/v1/sessions/{sid}/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {skey}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        received = b""
        try:
            while chunk := self._socket.recv(65536):
                received += chunk
                # Chunked NDJSON: every line that is a JSON object is a frame.
                self.lines = [json.loads(line) for line in received.split(b"\r\n") if line.startswith(b"{")]
                if received.endswith(b"0\r\n\r\n"):
                    return
        except OSError:
            pass

    def ended(self, within: float = 5) -> bool:
        self._thread.join(within)
        return not self._thread.is_alive()

    def close(self) -> None:
        try:
            self._socket.shutdown(socket.SHUT_RDWR)  # close() alone leaves the reading thread's recv open
        except OSError:
            pass
        self._socket.close()


def test_subscribers_stop_at_the_quota_and_a_closed_stream_frees_its_place(stack):
    key, _ = new_key(stack)
    opened = open_session(stack, key).json()
    sid, skey = opened["session_id"], opened["session_key"]
    first, second = Subscription(stack, sid, skey), Subscription(stack, sid, skey)
    try:
        assert not first.ended(0.5) and not second.ended(0.1)  # both watching
        third = Subscription(stack, sid, skey)
        assert third.ended()
        assert third.lines == [{"jsonrpc": "2.0", "id": 1, "error": {
            "code": -32050, "message": "quota_exceeded: max_subscribers_per_session 2 reached"}}]
        first.close()
        deadline = time.monotonic() + 5
        while True:  # the gateway cancels the closed stream's call; the replica counts one less
            fourth = Subscription(stack, sid, skey)
            if not fourth.ended(0.5):
                break
            assert time.monotonic() < deadline, fourth.lines
        # It is a live observer: the next event reaches it.
        assert terminal(rpc(stack.client, sid, skey, "session.registerDriver"))["result"] == {"registered": True}
        deadline = time.monotonic() + 5
        while not any(line.get("method") == "session.event" for line in fourth.lines):
            assert time.monotonic() < deadline, fourth.lines
            time.sleep(0.05)
        fourth.close()
    finally:
        first.close()
        second.close()


def test_a_key_over_its_rate_gets_429_with_retry_after_and_ratelimit_headers(tmp_path, mock):
    limits = "\n[limits]\nrequests_per_second_per_key = 0.5\nburst = 3\n"
    slow = launch_inprocess_stack(tmp_path, mock_provider_toml(mock.base_url) + limits, MOCK_LLM_TOKEN=TOKEN)
    try:
        key, _ = new_key(slow)
        headers = {"Authorization": f"Bearer {key}"}
        answers = [slow.client.get("/api/v1/sessions/ses_none/events", headers=headers) for _ in range(4)]
        assert [a.status_code for a in answers[:3]] == [401, 401, 401]  # a client key is no session key
        refused = answers[3]
        assert refused.status_code == 429
        assert refused.json()["type"] == "rate_limited"
        assert refused.headers["retry-after"] == "2"
        assert refused.headers["ratelimit-policy"] == '"per-key";q=3;w=6'
        assert refused.headers["ratelimit"] == '"per-key";r=0;t=2'
        # Another key, and requests without a key, are not held back.
        other, _ = new_key(slow)
        assert open_session(slow, other).status_code == 201
        assert slow.client.get("/healthz").status_code == 200
    finally:
        slow.close()


def test_a_profile_sets_its_keys_rate_which_each_gateway_learns_after_the_first_request(stack):
    key, _ = new_key(stack, limits={"requests_per_second_per_key": 0.25, "burst": 2})
    headers = {"Authorization": f"Bearer {key}"}
    assert stack.client.get("/api/v1/sessions/ses_none/events", headers=headers).status_code == 401
    deadline = time.monotonic() + 5
    while True:  # the gateway asked the session service for the key's policy in the background
        statuses = [stack.client.get("/api/v1/sessions/ses_none/events", headers=headers).status_code
                    for _ in range(3)]
        if statuses[-1] == 429:
            break
        assert time.monotonic() < deadline, statuses
        time.sleep(0.2)
    refused = stack.client.get("/api/v1/sessions/ses_none/events", headers=headers)
    assert refused.status_code == 429 and refused.json()["type"] == "rate_limited"
    assert refused.headers["ratelimit-policy"] == '"per-key";q=2;w=8'
    assert refused.headers["retry-after"] == "4"


def test_event_streams_count_as_subscribers_and_one_too_many_is_a_429(stack):
    key, _ = new_key(stack)
    opened = open_session(stack, key).json()
    sid, skey = opened["session_id"], opened["session_key"]
    url, auth = f"/api/v1/sessions/{sid}/events/stream", {"Authorization": f"Bearer {skey}"}
    second = Subscription(stack, sid, skey)
    with Listener(str(stack.client.base_url), "GET", url, headers=auth, sse=True) as first:
        assert first.status == 200 and not second.ended(0.3)
        refused = stack.client.get(url, headers=auth)
        assert refused.status_code == 429
        assert refused.json()["detail"] == "quota_exceeded: max_subscribers_per_session 2 reached"
        # The admin port's stream counts against no limit.
        admin = Listener(str(stack.admin.base_url), "GET", f"/admin/v1/sessions/{sid}/events/stream",
                         headers={"Authorization": f"Bearer {stack.admin_key}"}, sse=True)
        with admin:
            assert admin.status == 200
    second.close()
