"""Bounded input through the real stack (in this process): body size, strict JSON, pagination bounds.
(Internal details that stay inside when a service fails: test_hardening_internal.py.)"""

from __future__ import annotations

import json
import socket
import time
import uuid
from urllib.parse import urlsplit

import pytest

from bae.common.settings import DEFAULT_MAX_BODY_BYTES, load_settings
from testkit.live import new_session, result, rpc
from testkit.problems import assert_problem
from testkit.inprocess import launch_inprocess_stack
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.inprocess

LIMIT = 1024 * 1024  # the stack's BAE_MAX_BODY_BYTES


@pytest.fixture(scope="module")
def stack(mock, tmp_path_factory):
    running = launch_inprocess_stack(
        tmp_path_factory.mktemp("hardening"),
        mock_provider_toml(mock.base_url),
        BAE_MAX_BODY_BYTES=str(LIMIT),
    )
    yield running
    running.close()


def raw_exchange(url: str, head: bytes, body: bytes = b"", timeout: float = 10) -> tuple[int, bytes]:
    """Send a request head (and part of a body) on a plain socket; the status and body of the answer."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(head + body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def head(path: str, authorization: str | None, length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: bae", "Content-Type: application/json", f"Content-Length: {length}"]
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# --- 1. request body size ---------------------------------------------------------------------

def test_default_body_limit_is_16_mib():
    assert DEFAULT_MAX_BODY_BYTES == 16 * 1024 * 1024
    assert load_settings({}).max_body_bytes == DEFAULT_MAX_BODY_BYTES


def test_an_announced_300_mb_body_is_413_before_any_of_it_is_read(stack):
    started = time.monotonic()
    status, body = raw_exchange(stack.client_url, head("/api/v1/sessions", None, 300 * 1024 * 1024))
    assert time.monotonic() - started < 5
    assert status == 413
    problem = json.loads(body)
    assert problem == {
        "type": "payload_too_large", "title": "Payload Too Large", "status": 413,
        "detail": f"request body exceeds the limit of {LIMIT} bytes (BAE_MAX_BODY_BYTES)",
    }


def test_a_large_body_with_a_bad_credential_is_refused_before_it_is_read(stack):
    # Under the cap but large: the gateway asks about the key first and never waits for the body.
    for path, authorization in (
        ("/api/v1/sessions", "Bearer bae_" + "0" * 48),
        ("/api/v1/sessions/ses_nope/rpc", None),
        ("/admin/v1/profiles", "Bearer nope"),
    ):
        url = stack.admin_url if path.startswith("/admin") else stack.client_url
        status, body = raw_exchange(url, head(path, authorization, LIMIT - 1), b"[")
        assert status == 401, body
        assert json.loads(body)["type"] == "unauthorized"


def test_a_streamed_body_is_counted_and_cut_at_the_limit(stack):
    sid, skey, _ = new_session(stack)

    def chunks():
        for _ in range(4):
            yield b" " * (512 * 1024)  # 2 MiB in all, no Content-Length (chunked)

    response = stack.client.post(
        f"/api/v1/sessions/{sid}/rpc", content=chunks(), headers={"Authorization": f"Bearer {skey}"}
    )
    assert_problem(response, 413, "payload_too_large")
    # Without a valid key, a body of unannounced length is not read at all.
    response = stack.client.post(f"/api/v1/sessions/{sid}/rpc", content=chunks(),
                                 headers={"Authorization": "Bearer bae_ses_" + "0" * 48})
    assert_problem(response, 401, "unauthorized")
    # Over the cap by Content-Length too, for the admin port.
    response = stack.admin.post("/admin/v1/profiles", content=b" " * (LIMIT + 1),
                                headers={"content-type": "application/json"})
    assert_problem(response, 413, "payload_too_large")


def test_bodies_up_to_the_limit_still_work(stack):
    sid, skey, _ = new_session(stack)
    padding = "x" * (LIMIT - 1000)  # well past the size that is authenticated first
    frames = rpc(stack.client, sid, skey, "session.registerDriver", {"padding": padding})
    assert result(frames) == {"registered": True}


# --- 2. malformed JSON --------------------------------------------------------------------------

MALFORMED = {
    "deep": ("[" * 100_000 + "]" * 100_000, "nesting too deep"),
    "long integer": ('{"client_version": "1.0.0", "metadata": {"n": ' + "7" * 5000 + "}}", "number out of range"),
    "NaN": ('{"client_version": "1.0.0", "metadata": {"n": NaN}}', "NaN is not a JSON value"),
    "Infinity": ('{"client_version": "1.0.0", "metadata": {"n": -Infinity}}', "-Infinity is not a JSON value"),
    "float overflow": ('{"client_version": "1.0.0", "metadata": {"n": 1e999}}', "number out of range"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_rest_bodies_are_400_problems(stack, case):
    text, reason = MALFORMED[case]
    profile = stack.create_profile(f"json-{uuid.uuid4().hex[:8]}")
    key = stack.create_key(profile["id"])["key"]
    response = stack.client.post(
        "/api/v1/sessions", content=text.encode(),
        headers={"Authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    problem = assert_problem(response, 400, "bad_request")
    assert problem["detail"] == f"Failed to parse the request body as JSON: {reason}"
    response = stack.admin.post("/admin/v1/profiles", content=text.encode(),
                                headers={"content-type": "application/json"})
    assert_problem(response, 400, "bad_request")


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_rpc_bodies_are_parse_errors(stack, case):
    text, _ = MALFORMED[case]
    sid, skey, _ = new_session(stack)
    envelope = '{"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver", "params": ' + text + "}"
    response = stack.client.post(f"/api/v1/sessions/{sid}/rpc", content=envelope.encode(),
                                 headers={"Authorization": f"Bearer {skey}"})
    assert response.status_code == 200
    assert json.loads(response.text) == {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}


def test_large_exact_integers_within_range_are_kept(stack):
    sid, skey, _ = new_session(stack)
    envelope = '{"jsonrpc": "2.0", "id": 123456789012345678901234567890, "method": "session.registerDriver"}'
    response = stack.client.post(f"/api/v1/sessions/{sid}/rpc", content=envelope.encode(),
                                 headers={"Authorization": f"Bearer {skey}"})
    assert response.text == '{"jsonrpc":"2.0","id":123456789012345678901234567890,"result":{"registered":true}}\n'


# --- 3. pagination ------------------------------------------------------------------------------

def test_a_huge_limit_clamps_and_bad_limits_are_400(stack):
    for _ in range(3):
        stack.create_profile(f"page-{uuid.uuid4().hex[:8]}")
    for limit in ("99999999999999999999999999", "9" * 5000, "201", "+00300"):
        response = stack.admin.get("/admin/v1/profiles", params={"limit": limit})
        assert response.status_code == 200, response.text
        assert response.json()["next_cursor"] is None
    for limit in ("0", "-1", "-99999999999999999999", "abc", "1.5", "000"):
        response = stack.admin.get("/admin/v1/profiles", params={"limit": limit})
        assert assert_problem(response, 400, "bad_request")["detail"] == "limit must be a positive integer"


def test_an_over_long_cursor_is_cut_in_the_error(stack):
    sid, skey, _ = new_session(stack)
    cursor = "c" * 20_000
    for response in (
        stack.client.get(f"/api/v1/sessions/{sid}/events", params={"cursor": cursor},
                         headers={"Authorization": f"Bearer {skey}"}),
        stack.admin.get("/admin/v1/sessions", params={"cursor": cursor}),
        stack.admin.get(f"/admin/v1/sessions/{sid}/events", params={"cursor": cursor}),
    ):
        problem = assert_problem(response, 400, "bad_request")
        assert problem["detail"] == f'invalid cursor: "{"c" * 200}…"'


def test_an_over_long_echoed_value_never_breaks_the_error(stack):
    # Any detail that repeats client input is bounded, whatever the input's size.
    profile = stack.create_profile(f"echo-{uuid.uuid4().hex[:8]}")
    key = stack.create_key(profile["id"])["key"]
    response = stack.client.post("/api/v1/sessions", json={"tools": "t" * 20_000},
                                 headers={"Authorization": f"Bearer {key}"})
    problem = assert_problem(response, 400, "bad_request")
    assert problem["detail"].endswith(f'invalid type: string "{"t" * 200}…", expected a sequence'), problem
    # A profile naming a 20 KB provider: opening a session repeats the name in its 422.
    profile = stack.create_profile(f"echo-{uuid.uuid4().hex[:8]}", primary="p" * 20_000)
    key = stack.create_key(profile["id"])["key"]
    response = stack.client.post("/api/v1/sessions", json={}, headers={"Authorization": f"Bearer {key}"})
    problem = assert_problem(response, 422, "primary_provider_unavailable")
    assert problem["detail"] == f'the profile\'s primary provider "{"p" * 200}…" is not configured in bae-config.toml'
    # Ids and filters in not-found and invalid-value texts.
    response = stack.admin.get("/admin/v1/sessions/ses_" + "i" * 20_000)
    assert assert_problem(response, 404, "not_found")["detail"] == f"no session ses_{'i' * 196}…"
    response = stack.admin.get("/admin/v1/sessions", params={"state": "s" * 20_000})
    assert assert_problem(response, 400, "bad_request")["detail"] == (
        f'invalid state filter "{"s" * 200}…"; expected one of open, closed, error')
