"""The gateway's access line (docs/observability.md, "Request logs"): the JSON-RPC method of an
/rpc call, the client's address (the socket's peer, or behind BAE_TRUSTED_PROXIES the rightmost
untrusted X-Forwarded-For entry) and the response's size; and both probes on both ports."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx
import pytest

from testkit.live import new_session
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.inprocess

# The test's own connections come from 127.0.0.1 (a trusted proxy here) or 127.0.0.2 (not one).
TRUSTED = "127.0.0.1,10.0.0.0/8,fd00::/8"


def access_fields(caplog: pytest.LogCaptureFixture, request_id: str) -> dict[str, Any]:
    """The fields of the request's one access line, which is written just after its response ended."""
    deadline = time.monotonic() + 5
    while not (found := [r for r in caplog.records if r.name == "bae.access" and r.fields["request_id"] == request_id]):
        assert time.monotonic() < deadline, f"no access line for {request_id}"
        time.sleep(0.01)
    (record,) = found
    return record.fields  # type: ignore[attr-defined, no-any-return]


def post_rpc(client: httpx.Client, sid: str, skey: str, body: bytes, request_id: str,
             forwarded: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {skey}", "x-request-id": request_id, "content-type": "application/json"}
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    return client.post(f"/api/v1/sessions/{sid}/rpc", content=body, headers=headers)


def test_the_access_line_names_the_rpc_method_the_client_and_the_size(start_inprocess_stack, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="bae.access")
    stack = start_inprocess_stack(config_toml=mock_provider_toml("http://127.0.0.1:9"), BAE_TRUSTED_PROXIES=TRUSTED)
    sid, skey, _ = new_session(stack)
    client = stack.client

    def call(name: str, body: Any, forwarded: str | None = None) -> tuple[httpx.Response, dict[str, Any]]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = post_rpc(client, sid, skey, raw, name, forwarded)
        return response, access_fields(caplog, name)

    registered, fields = call("register", {"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver"},
                              forwarded="198.51.100.7, 203.0.113.9, 10.1.2.3")
    assert registered.status_code == 200
    assert fields["rpc_method"] == "session.registerDriver"
    assert fields["route"] == "/api/v1/sessions/{id}/rpc" and fields["session_id"] == sid
    assert fields["response_bytes"] == len(registered.content) > 0
    # 10.1.2.3 is a trusted proxy, 203.0.113.9 is not: what it says of itself (198.51.100.7) proves nothing.
    assert fields["client_addr"] == "203.0.113.9"

    # A notification runs like a call and is logged as one; it is answered with no body.
    notified, fields = call("notify", {"jsonrpc": "2.0", "method": "session.registerDriver"})
    assert (notified.content, fields["rpc_method"], fields["response_bytes"]) == (b"", "session.registerDriver", 0)
    assert fields["client_addr"] == "127.0.0.1"  # a trusted peer without X-Forwarded-For is the client

    # What the envelope refused is named by a fixed word, never by the request's text.
    for name, body, logged in (
        ("batch", [{"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver"}], "batch"),
        ("unknown", {"jsonrpc": "2.0", "id": 1, "method": "session.evil\nmethod"}, "unknown"),
        ("garbled", b"{not json", "invalid"),
        ("no-method", {"jsonrpc": "2.0", "id": 1}, "invalid"),
    ):
        response, fields = call(name, body)
        assert (response.status_code, fields["rpc_method"]) == (200, logged), name
        assert fields["response_bytes"] == len(response.content) > 0

    # A call whose key is refused still says what it asked for (a 401 problem, not NDJSON).
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver"}).encode()
    refused = post_rpc(client, sid, "nope", body, "refused")
    assert refused.status_code == 401
    fields = access_fields(caplog, "refused")
    assert (fields["rpc_method"], fields["status"]) == ("session.registerDriver", 401)
    assert fields["response_bytes"] == len(refused.content)

    # Not an /rpc call: no method. Every entry trusted: the leftmost is the client. An entry that is
    # not an address ends the walk at the last hop known.
    for request_id, forwarded, expected in (
        ("all-trusted", "10.0.0.9, 10.0.0.1", "10.0.0.9"),
        ("garbage", "203.0.113.5, not-an-address, 10.0.0.2", "10.0.0.2"),
        ("v6", "2001:db8::5, fd00::1", "2001:db8::5"),
        ("two-headers", None, "192.0.2.1"),
    ):
        headers = [("x-request-id", request_id)]
        headers += ([("X-Forwarded-For", "192.0.2.1"), ("X-Forwarded-For", "10.0.0.3")] if forwarded is None
                    else [("X-Forwarded-For", forwarded)])
        meta = client.get("/api/v1/meta", headers=headers)
        fields = access_fields(caplog, request_id)
        assert (fields["client_addr"], fields["rpc_method"]) == (expected, None), request_id
        assert fields["response_bytes"] == len(meta.content)

    # From a peer that is no trusted proxy, X-Forwarded-For is not read at all.
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=str(client.base_url), transport=transport) as untrusted:
        untrusted.get("/api/v1/meta", headers={"x-request-id": "untrusted", "X-Forwarded-For": "203.0.113.1"})
    assert access_fields(caplog, "untrusted")["client_addr"] == "127.0.0.2"


def test_both_probes_answer_on_both_ports(start_inprocess_stack, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="bae.access")
    stack = start_inprocess_stack(config_toml=mock_provider_toml("http://127.0.0.1:9"))
    for port in (stack.client, stack.admin):
        health = port.get("/healthz", headers={"x-request-id": "health"})
        assert (health.status_code, health.content) == (200, b"")
        ready = port.get("/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    # Probes log at DEBUG, so they do not drown the log.
    deadline = time.monotonic() + 5
    while len(probes := [r for r in caplog.records if r.name == "bae.access" and r.fields["request_id"] == "health"]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert [r.levelno for r in probes] == [logging.DEBUG, logging.DEBUG]
