"""CORS through a stack of service processes (BAE_CORS_ORIGINS): the client port answers it for the
listed origins on every answer, errors and streams included; the admin port never does; without the
setting nothing changes (an OPTIONS preflight is a 405)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from testkit.live import new_session
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = pytest.mark.stack

ALLOWED = "http://127.0.0.1:5173"
OTHER_ALLOWED = "https://app.example.com"
REFUSED = "https://evil.example.net"
# A key's burst on the client port: low enough that the 429 test reaches it at once.
LIMITS = """
[limits]
max_open_sessions_per_key = 100
requests_per_second_per_key = 1.0
burst = 20
"""
MAX_BODY_BYTES = 65536


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = launch_stack(
        tmp_path_factory.mktemp("cors"), mock_provider_toml("http://127.0.0.1:9") + LIMITS,
        # Written as an operator might: spaces, a default port, upper case.
        BAE_CORS_ORIGINS=f" {ALLOWED}, HTTPS://App.Example.com:443 ", BAE_MAX_BODY_BYTES=str(MAX_BODY_BYTES),
    )
    yield running
    running.close()


@pytest.fixture(scope="module")
def session(stack: RunningStack) -> tuple[str, str]:
    sid, skey, _ = new_session(stack)
    return sid, skey


def preflight(url: str, origin: str, method: str = "GET", headers: str = "authorization") -> httpx.Response:
    return httpx.options(url, headers={"Origin": origin, "Access-Control-Request-Method": method,
                                       "Access-Control-Request-Headers": headers})


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {name: value for name, value in response.headers.items() if name.startswith("access-control-")}


def exposed(response: httpx.Response) -> set[str]:
    return {name.strip() for name in response.headers["access-control-expose-headers"].split(",")}


def test_a_preflight_from_an_allowed_origin_is_answered_without_a_credential(stack, session):
    sid, _ = session
    for origin in (ALLOWED, OTHER_ALLOWED):
        answer = preflight(f"{stack.client_url}/api/v1/sessions/{sid}/events", origin,
                           headers="Authorization, Last-Event-ID")
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == origin
        allowed_headers = {h.strip() for h in answer.headers["access-control-allow-headers"].lower().split(",")}
        assert {"authorization", "content-type", "last-event-id"} <= allowed_headers
        methods = {m.strip() for m in answer.headers["access-control-allow-methods"].split(",")}
        assert {"GET", "POST", "DELETE"} <= methods
        assert "access-control-allow-credentials" not in answer.headers
        assert "Origin" in answer.headers["vary"]
    rpc = preflight(f"{stack.client_url}/api/v1/sessions/{sid}/rpc", ALLOWED, "POST", "authorization,content-type")
    assert rpc.status_code == 200 and rpc.headers["access-control-allow-origin"] == ALLOWED


def test_a_preflight_from_another_origin_is_refused_as_a_problem(stack, session):
    sid, _ = session
    answer = preflight(f"{stack.client_url}/api/v1/sessions/{sid}/events", REFUSED)
    assert "access-control-allow-origin" not in answer.headers
    assert answer.status_code == 400
    assert answer.json() == {"type": "bad_request", "title": "Bad Request", "status": 400,
                             "detail": "CORS preflight refused: origin not allowed"}
    # A header the client API never reads is refused too, from an allowed origin.
    odd = preflight(f"{stack.client_url}/api/v1/sessions/{sid}/events", ALLOWED, headers="authorization,x-secret")
    assert odd.status_code == 400 and odd.json()["detail"] == "CORS preflight refused: headers not allowed"
    # An OPTIONS that is no preflight reaches the routes: 405 as without CORS.
    options = httpx.options(f"{stack.client_url}/api/v1/sessions/{sid}/events", headers={"Origin": ALLOWED})
    assert options.status_code == 405 and options.json()["type"] == "method_not_allowed"
    assert options.headers["access-control-allow-origin"] == ALLOWED


def test_an_answer_to_an_allowed_origin_carries_the_headers_and_exposes_the_rate_limit(stack, session):
    sid, skey = session
    answer = httpx.get(f"{stack.client_url}/api/v1/sessions/{sid}/events",
                       headers={"Origin": ALLOWED, "Authorization": f"Bearer {skey}"})
    assert answer.status_code == 200 and answer.json()["items"][0]["event_type"] == "session.open"
    assert answer.headers["access-control-allow-origin"] == ALLOWED
    assert {"RateLimit", "RateLimit-Policy", "Retry-After", "X-Request-Id"} <= exposed(answer)

    refused = httpx.get(f"{stack.client_url}/api/v1/sessions/{sid}/events",
                        headers={"Origin": REFUSED, "Authorization": f"Bearer {skey}"})
    # The server answers (CORS is the browser's to enforce), without the header that lets a page read it.
    assert refused.status_code == 200 and "access-control-allow-origin" not in refused.headers
    # Without an Origin (not a browser's cross-origin request) nothing is added.
    plain = httpx.get(f"{stack.client_url}/api/v1/sessions/{sid}/events", headers={"Authorization": f"Bearer {skey}"})
    assert plain.status_code == 200 and cors_headers(plain) == {}


def test_a_stream_carries_the_headers(stack, session):
    sid, skey = session
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.getState"}
    with httpx.stream("POST", f"{stack.client_url}/api/v1/sessions/{sid}/rpc", json=body,
                      headers={"Origin": ALLOWED, "Authorization": f"Bearer {skey}"}) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("application/x-ndjson")
        assert answer.headers["access-control-allow-origin"] == ALLOWED
        assert "RateLimit" in exposed(answer)
        assert any(line for line in answer.iter_lines())


def test_error_answers_carry_the_headers(stack, session):
    sid, _ = session
    unauthenticated = httpx.get(f"{stack.client_url}/api/v1/sessions/{sid}/events",
                                headers={"Origin": ALLOWED, "Authorization": "Bearer bae_ses_not-a-key"})
    assert unauthenticated.status_code == 401 and unauthenticated.json()["type"] == "unauthorized"
    assert unauthenticated.headers["access-control-allow-origin"] == ALLOWED

    _, _, profile = new_session(stack)
    key = stack.create_key(profile["id"], "big")["key"]
    too_large = httpx.post(f"{stack.client_url}/api/v1/sessions", content=b"{" + b" " * MAX_BODY_BYTES + b"}",
                           headers={"Origin": ALLOWED, "Authorization": f"Bearer {key}",
                                    "Content-Type": "application/json"})
    assert too_large.status_code == 413 and too_large.json()["type"] == "payload_too_large"
    assert too_large.headers["access-control-allow-origin"] == ALLOWED

    # Its own credential, its own bucket: spent within the burst (and a request or so refilled meanwhile).
    headers = {"Origin": ALLOWED, "Authorization": "Bearer bae_ses_rate-limit-test"}
    for _ in range(1000):
        limited = httpx.get(f"{stack.client_url}/api/v1/sessions/{sid}/events", headers=headers)
        if limited.status_code == 429:
            break
    assert limited.status_code == 429 and limited.json()["type"] == "rate_limited"
    assert limited.headers["access-control-allow-origin"] == ALLOWED
    # The headers the page is allowed to read are there to be read.
    assert {"RateLimit", "RateLimit-Policy", "Retry-After"} <= exposed(limited)
    assert {"ratelimit", "ratelimit-policy", "retry-after"} <= set(limited.headers)


def test_the_admin_port_never_answers_cors(stack):
    answer = stack.admin.get("/admin/v1/sessions", headers={"Origin": ALLOWED})
    assert answer.status_code == 200 and cors_headers(answer) == {}
    ask = preflight(f"{stack.admin_url}/admin/v1/sessions", ALLOWED)
    assert ask.status_code == 405 and ask.json()["type"] == "method_not_allowed"
    assert cors_headers(ask) == {}


def test_without_the_setting_there_is_no_cors(tmp_path):
    running = launch_stack(tmp_path, mock_provider_toml("http://127.0.0.1:9"))
    try:
        sid, skey, _ = new_session(running)
        ask = preflight(f"{running.client_url}/api/v1/sessions/{sid}/events", ALLOWED)
        assert ask.status_code == 405 and ask.json()["type"] == "method_not_allowed"
        assert ask.headers["allow"] == "GET" and cors_headers(ask) == {}
        answer = httpx.get(f"{running.client_url}/api/v1/sessions/{sid}/events",
                           headers={"Origin": ALLOWED, "Authorization": f"Bearer {skey}"})
        assert answer.status_code == 200 and cors_headers(answer) == {}
    finally:
        running.close()
