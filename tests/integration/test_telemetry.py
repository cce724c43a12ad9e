"""Telemetry end to end (TELEMETRY.md): the whole stack exports to a real OTLP/gRPC receiver.

Span trees, trace joining (with `tracestate`), sampling, error statuses, metric values after a
known workload, each pipeline switched off alone, metrics.disabled, secrets never exported, a
dead collector, readiness, /metrics and the access log.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from testkit.docker_support import TEST_IMAGE, ensure_harness_image, require_docker
from testkit.live import declared, join, new_session, register, result, rpc, send
from testkit.mcp_support import TOOLS_SERVER, http_tools_server
from testkit.mockllm import MockLLM, Reply
from testkit.otlp_receiver import OtlpReceiver, Point, ReceivedSpan
from testkit.ports import free_port
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.docker]

# Short export intervals: the SDK's own variables, which the server honours.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_METRIC_EXPORT_INTERVAL": "300"}
TOKEN = "sk-telemetry-" + secrets.token_hex(12)
SHELL = {"name": "sh", "description": "run a shell command", "input_schema": {"type": "object"}}
UNSET, ERROR = Status.STATUS_CODE_UNSET, Status.STATUS_CODE_ERROR


def telemetry_toml(endpoint: str, extra: str = "", *, metrics: str = "", ratio: float = 1.0) -> str:
    return (
        "[telemetry]\nenabled = true\n"
        f'otlp_endpoint = "{endpoint}"\nsample_ratio = {ratio}\n{extra}'
        f"[telemetry.metrics]\n{metrics or 'enabled = true'}\n"
    )


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def start(start_stack, mock: MockLLM, telemetry: str, **env: str) -> RunningStack:
    toml = mock_provider_toml(mock.base_url) + telemetry
    return start_stack(config_toml=toml, MOCK_LLM_TOKEN=TOKEN, **{**FAST_EXPORT, **env})


def traceparent() -> tuple[str, str, str]:
    """A sampled W3C traceparent of a client span: (header, trace id, span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def http_spans(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if "http.request.method" in s.attributes]


def by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = by_name(spans, name)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def status(span: ReceivedSpan) -> tuple[int, str]:
    """The span's status: (code, description)."""
    return span.span.status.code, span.span.status.message


def links(span: ReceivedSpan) -> list[tuple[str, str]]:
    """(linked span id, bae.link.kind) of each link."""
    return [(link.span_id.hex(), {a.key: a.value.string_value for a in link.attributes}["bae.link.kind"]) for link in span.span.links]


def send_traced(stack: RunningStack, sid: str, skey: str, content, header: str, tracestate: str = "") -> list[dict]:
    body = {"jsonrpc": "2.0", "id": 7, "method": "session.sendMessage",
            "params": {"message": {"role": "user", "content": content}}}
    headers = {"Authorization": f"Bearer {skey}", "traceparent": header}
    if tracestate:
        headers["tracestate"] = tracestate
    response = stack.client.post(f"/api/v1/sessions/{sid}/rpc", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


def test_text_turn_joins_the_client_trace(start_stack, mock: MockLLM, receiver: OtlpReceiver) -> None:
    stack = start(start_stack, mock, telemetry_toml(receiver.endpoint, metrics="enabled = false"))
    mock.reset()
    mock.enqueue(Reply.text("hello"))
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    receiver.clear()
    cleared = time.monotonic()
    header, trace_id, client_span = traceparent()
    assert "result" in send_traced(stack, sid, skey, "hi", header)[-1]

    def complete(spans: list[ReceivedSpan]) -> bool:
        ours = [s for s in spans if s.trace_id == trace_id]
        return {"bae.turn", "bae.provider.attempt"} <= {s.name for s in ours} and bool(http_spans(ours))

    spans = [s for s in receiver.wait_spans(complete) if s.trace_id == trace_id]
    assert {s.scope for s in spans} == {"baesrv"}
    request = one(http_spans(spans), "POST /api/v1/sessions/{id}/rpc")
    assert request.parent_id == client_span
    assert request.service.endswith("-gateway")
    assert request.attributes["http.route"] == "/api/v1/sessions/{id}/rpc"
    assert request.attributes["url.path"] == f"/api/v1/sessions/{sid}/rpc"
    assert request.attributes["http.response.status_code"] == 200
    attempt = one(spans, "bae.provider.attempt")
    assert attempt.service.endswith("-runner")
    assert attempt.attributes == {
        "bae.provider.name": "mock",
        "bae.provider.kind": "anthropic",
        "bae.provider.model": "mock-model",
        "bae.provider.attempt": 0,
        "bae.provider.attempt_kind": "primary",
        "http.response.status_code": 200,
    }
    turn = one(spans, "bae.turn")
    assert turn.service.endswith("-session")
    assert (turn.parent_id, attempt.parent_id) == (request.span_id, turn.span_id)
    assert turn.attributes["bae.turn.outcome"] == "completed" and turn.attributes["bae.turn.resumed"] is False
    assert [kind for _, kind in links(turn)] == ["session"]

    # [telemetry.metrics] enabled = false: spans came, but no metric export at all, even after more
    # than three metric intervals (300 ms here), and /metrics is not served.
    time.sleep(max(0.0, cleared + 1.0 - time.monotonic()))
    assert receiver.metric_requests == []
    missing = stack.admin.get("/metrics")
    assert missing.status_code == 404
    assert missing.json()["detail"] == "metrics are disabled: set [telemetry] enabled and [telemetry.metrics] enabled"


def test_a_client_disconnect_ends_the_turn_span_early_with_no_outcome(
    start_stack, mock: MockLLM, receiver: OtlpReceiver
) -> None:
    stack = start(start_stack, mock, telemetry_toml(receiver.endpoint, metrics="enabled = false"))
    mock.reset()
    mock.enqueue(Reply.hang(2.0))
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    receiver.clear()
    header, trace_id, _ = traceparent()
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.sendMessage", "params": {"message": {"content": "slow"}}}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up while the provider call hangs
        stack.client.post(f"/api/v1/sessions/{sid}/rpc", json=body, timeout=0.8,
                          headers={"Authorization": f"Bearer {skey}", "traceparent": header})

    def complete(spans: list[ReceivedSpan]) -> bool:
        return {"bae.turn", "bae.provider.attempt"} <= {s.name for s in spans if s.trace_id == trace_id}

    spans = [s for s in receiver.wait_spans(complete) if s.trace_id == trace_id]
    turn, attempt = one(spans, "bae.turn"), one(spans, "bae.provider.attempt")
    assert "bae.turn.outcome" not in turn.attributes
    # Ended when the client left, before the provider call it started had answered.
    assert turn.span.end_time_unix_nano < attempt.span.end_time_unix_nano
    # The turn itself ran on and finished.
    deadline = time.monotonic() + 10
    while True:
        events = stack.client.get(f"/api/v1/sessions/{sid}/events", headers={"Authorization": f"Bearer {skey}"})
        if events.json()["items"][-1]["event_type"] == "server.message.send" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert events.json()["items"][-1]["event_type"] == "server.message.send"


def mcp_toml() -> str:
    return (
        f'[[mcp.servers]]\nname = "local"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
        f'args = ["{TOOLS_SERVER}", "stdio"]\n'
    )


def test_mcp_and_client_tools_pause_and_resume(start_stack, mock: MockLLM, receiver: OtlpReceiver) -> None:
    stack = start(start_stack, mock, mcp_toml() + telemetry_toml(receiver.endpoint, metrics="enabled = false"))
    mock.reset()
    sid, skey, _ = new_session(stack, mcp_servers=["local"])
    register(stack, sid, skey)
    receiver.clear()
    mock.enqueue(Reply.tool_use([("tu_1", "echo", {"text": "hi"}), ("tu_2", "get_time", {})]))
    first_header, first_trace, _ = traceparent()
    assert result(send_traced(stack, sid, skey, "go", first_header))["message"]["content"][-1]["id"] == "tu_2"
    mock.enqueue(Reply.text("done"))
    second_header, second_trace, _ = traceparent()
    resumed = [{"type": "tool_result", "tool_use_id": "tu_2", "content": "12:00"}]
    assert result(send_traced(stack, sid, skey, resumed, second_header))["message"]["content"][0]["text"] == "done"

    def complete(spans: list[ReceivedSpan]) -> bool:
        ours = [s for s in spans if s.trace_id in (first_trace, second_trace)]
        return {"bae.turn", "bae.provider.attempt", "bae.mcp.call"} <= {s.name for s in ours} and \
            len(by_name(ours, "bae.turn")) == 2 and len(by_name(ours, "bae.provider.attempt")) == 2 and \
            len(by_name(ours, "bae.tool.dispatch")) == 2 and len(http_spans(ours)) == 2

    spans = receiver.wait_spans(complete)
    first = [s for s in spans if s.trace_id == first_trace]
    paused = one(first, "bae.turn")
    request = one(http_spans(first), "POST /api/v1/sessions/{id}/rpc")
    assert paused.parent_id == request.span_id
    assert paused.attributes == {
        "bae.session.id": sid, "bae.client_key.id": paused.attributes["bae.client_key.id"],
        "bae.turn.resumed": False, "bae.turn.outcome": "paused",
    }
    assert one(first, "bae.provider.attempt").parent_id == paused.span_id
    dispatches = {s.attributes["bae.tool.dispatch"]: s for s in by_name(first, "bae.tool.dispatch")}
    assert set(dispatches) == {"mcp", "client"}
    assert all(d.parent_id == paused.span_id for d in dispatches.values())
    assert dispatches["client"].attributes == {
        "bae.tool.name": "get_time", "bae.tool.dispatch": "client", "bae.tool.input.bytes": 2,
    }
    assert dispatches["mcp"].attributes["bae.tool.is_error"] is False
    assert dispatches["mcp"].attributes["bae.tool.input.bytes"] == len('{"text":"hi"}')
    assert dispatches["mcp"].attributes["bae.tool.output.bytes"] > 0
    mcp_call = one(first, "bae.mcp.call")
    assert mcp_call.parent_id == dispatches["mcp"].span_id
    assert mcp_call.attributes == {"bae.tool.name": "echo", "bae.mcp.server": "local"}

    second = [s for s in spans if s.trace_id == second_trace]
    resumed_turn = one(second, "bae.turn")
    assert resumed_turn.attributes["bae.turn.resumed"] is True
    assert resumed_turn.attributes["bae.turn.outcome"] == "completed"
    assert resumed_turn.parent_id == one(http_spans(second), "POST /api/v1/sessions/{id}/rpc").span_id
    assert (paused.span_id, "resume") in links(resumed_turn)
    # The session span is still open (no DELETE yet); the turns link to its span id.
    assert links(paused)[0][1] == "session" and links(resumed_turn)[0] == (links(paused)[0][0], "session")


def test_sandbox_exec_span(start_stack, mock: MockLLM, receiver: OtlpReceiver) -> None:
    require_docker()
    # BAE_SANDBOX_EXEC_TIMEOUT: a command that outlives it makes the exec itself fail.
    stack = start(start_stack, mock, telemetry_toml(receiver.endpoint),
                  BAE_SANDBOX_HOST_ID=f"test-telemetry-{secrets.token_hex(4)}", BAE_SANDBOX_NETWORK="none",
                  BAE_SANDBOX_EXEC_TIMEOUT="2")
    mock.reset()
    profile = stack.create_profile("sb", available_sandboxes=[TEST_IMAGE])
    key = stack.create_key(profile["id"])["key"]
    opened = stack.open_session(key, sandbox_tools=[SHELL])
    sid, skey = opened["session_id"], opened["session_key"]
    register(stack, sid, skey)
    assert "sandbox_id" in result(rpc(stack.client, sid, skey, "session.startRemoteSandbox", {"image": TEST_IMAGE}))
    mock.enqueue(Reply.tool_use([("tu_1", "sh", {"command": "echo secret-output; exit 3"}),
                                 ("tu_2", "sh", {"command": "sleep 30"})]), Reply.text("done"))
    header, trace_id, _ = traceparent()
    assert "result" in send_traced(stack, sid, skey, "run", header)[-1]
    spans = receiver.wait_spans(lambda spans: sorted(s.name for s in spans if s.trace_id == trace_id and s.name in (
        "bae.sandbox.exec", "bae.tool.dispatch", "bae.turn")) == ["bae.sandbox.exec"] * 2 + ["bae.tool.dispatch"] * 2
        + ["bae.turn"])
    spans = [s for s in spans if s.trace_id == trace_id]
    # The exec that returned has an exit code; the one that never did has none.
    execs = by_name(spans, "bae.sandbox.exec")
    (exits,) = [s for s in execs if "bae.sandbox.exit_code" in s.attributes]
    (sleeps,) = [s for s in execs if "bae.sandbox.exit_code" not in s.attributes]
    dispatches = by_name(spans, "bae.tool.dispatch")
    assert sorted(s.parent_id for s in (exits, sleeps)) == sorted(d.span_id for d in dispatches)
    assert exits.service.endswith("-sandbox")
    assert exits.attributes == {"bae.tool.name": "sh", "bae.sandbox.exit_code": 3}
    assert status(exits) == (ERROR, "non-zero exit code")
    assert sleeps.attributes == {"bae.tool.name": "sh"}  # the exec never returned: no exit code
    assert status(sleeps) == (ERROR, "sandbox exec failed")
    turn = one(spans, "bae.turn")
    for dispatch in dispatches:
        assert dispatch.parent_id == turn.span_id
        assert (dispatch.attributes["bae.tool.dispatch"], dispatch.attributes["bae.tool.is_error"]) == ("sandbox", True)
        assert status(dispatch) == (ERROR, "tool result is_error")
    dump = str(receiver.trace_requests)
    assert "secret-output" not in dump and "timed out" not in dump  # nor the host's error text

    # Both blocks counted and timed (the failed one for at least the 2 s it ran); the sandbox counts as live.
    points = receiver.wait_points(lambda points: values(points, "bae.tool.latency") == {(("dispatch", "sandbox"),): 2})
    assert values(points, "bae.tool.calls") == {(("dispatch", "sandbox"),): 2}
    (latency,) = points["bae.tool.latency"]
    assert latency.unit == "ms" and latency.total >= 2000
    assert values(points, "bae.sandboxes.live") == {(): 1}
    assert stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"}).status_code == 200
    receiver.wait_points(lambda points: values(points, "bae.sandboxes.live") == {(): 0})


def test_subagent_span_is_a_linked_root(start_stack, mock: MockLLM, receiver: OtlpReceiver) -> None:
    require_docker()
    image = ensure_harness_image()
    stack = start(start_stack, mock, telemetry_toml(receiver.endpoint),
                  BAE_SANDBOX_HOST_ID=f"test-telemetry-{secrets.token_hex(4)}", BAE_SANDBOX_NETWORK="none")
    mock.reset()
    receiver.clear()  # what earlier stacks exported, up to their final flush
    profile = stack.create_profile("sa", available_sandboxes=[image])
    key = stack.create_key(profile["id"])["key"]
    tool = {"name": "launch", "description": "launch", "input_schema": {"type": "object"}, "image": image,
            "subagents": [{"harness": "fake", "command_template": "fake-harness --model {model}"}]}
    opened = stack.open_session(key, subagent_tools=[tool])
    sid, skey = opened["session_id"], opened["session_key"]
    register(stack, sid, skey)
    assert "sandbox_id" in result(rpc(stack.client, sid, skey, "session.startRemoteSandbox", {"image": image}))
    launches = [("tu_ok", "launch", {"harness": "fake", "model": "m", "prompt": "print secret-subagent-output"}),
                ("tu_bad", "launch", {"harness": "fake", "model": "m", "prompt": "exit 3"})]
    mock.enqueue(Reply.tool_use(launches), Reply.text("launched"))
    header, trace_id, _ = traceparent()
    assert "result" in send_traced(stack, sid, skey, "go", header)[-1]

    spans = receiver.wait_spans(lambda spans: len(by_name(spans, "bae.subagent")) == 2, timeout=30)
    dispatches = {s.span_id: s for s in by_name(spans, "bae.tool.dispatch") if s.trace_id == trace_id}
    outcomes = {}
    for subagent in by_name(spans, "bae.subagent"):
        assert subagent.parent_id == "" and subagent.trace_id != trace_id  # a new root
        (linked, kind), = links(subagent)
        assert kind == "subagent" and linked in dispatches
        assert subagent.attributes["bae.session.id"] == sid
        assert subagent.attributes["bae.subagent.id"].startswith("sba_")
        outcomes[subagent.attributes["bae.subagent.outcome"]] = subagent.span.status.message
    assert outcomes == {"completed": "", "failed": "subagent failed"}
    # Both have ended: the gauge (which counted them while they ran) settles at 0. An export from before
    # the turn shows 0 too, so wait for one that has also seen the dispatches.
    points = receiver.wait_points(lambda points: values(points, "bae.subagents.active") == {(): 0}
                                  and (("dispatch", "subagent"),) in values(points, "bae.tool.calls"))
    assert values(points, "bae.tool.calls") == {(("dispatch", "subagent"),): 2}
    assert "secret-subagent-output" not in str(receiver.trace_requests)
    assert stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"}).status_code == 200


def test_session_span_and_driver_link(start_stack, mock: MockLLM, receiver: OtlpReceiver) -> None:
    stack = start(start_stack, mock, telemetry_toml(receiver.endpoint, metrics="enabled = false"))
    profile = stack.create_profile("p", allowed_tools=["get_time"])
    key = stack.create_key(profile["id"])
    receiver.clear()
    opened = stack.open_session(key["key"], tools=declared(("get_time",)))
    sid, skey = opened["session_id"], opened["session_key"]
    register(stack, sid, skey)
    assert stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"}).status_code == 200

    expected = {"bae.session", "POST /api/v1/sessions", "POST /api/v1/sessions/{id}/rpc", "DELETE /api/v1/sessions/{id}"}
    spans = receiver.wait_spans(lambda spans: expected <= {s.name for s in spans})
    session = one(spans, "bae.session")
    assert session.service.endswith("-session")
    assert session.attributes == {
        "bae.session.id": sid,
        "bae.profile.id": profile["id"],
        "bae.client_key.id": key["id"],
    }
    create = one(http_spans(spans), "POST /api/v1/sessions")
    assert session.parent_id == create.span_id and session.trace_id == create.trace_id
    registration = one(http_spans(spans), "POST /api/v1/sessions/{id}/rpc")
    assert links(registration) == [(session.span_id, "session")]

    # A session still open at shutdown: its span ends then, and the final flush exports it
    # within BAE_SHUTDOWN_TIMEOUT (5 s here).
    still_open = stack.open_session(key["key"])["session_id"]
    started = time.monotonic()
    assert set(stack.close().values()) == {0}
    assert time.monotonic() - started < 5 + 3
    ended = [s for s in receiver.spans() if s.name == "bae.session" and s.attributes["bae.session.id"] == still_open]
    assert len(ended) == 1 and ended[0].span.status.code == 0  # Unset


def test_sampling_ratio_zero_and_one(start_stack, mock: MockLLM, receiver: OtlpReceiver) -> None:
    zero = start(start_stack, mock, telemetry_toml(receiver.endpoint, metrics="enabled = false", ratio=0.0))
    receiver.clear()
    assert zero.client.get("/api/v1/meta").status_code == 200
    header, trace_id, client_span = traceparent()
    assert zero.client.get("/api/v1/meta", headers={"traceparent": header}).status_code == 200
    spans = receiver.wait_spans(lambda spans: any(s.trace_id == trace_id for s in spans))
    # Ratio 0: a root request is dropped, a sampled remote parent is kept.
    assert [(s.name, s.parent_id) for s in spans] == [("GET /api/v1/meta", client_span)]
    unsampled = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00"
    one_ = start(start_stack, mock, telemetry_toml(receiver.endpoint, metrics="enabled = false", ratio=1.0))
    receiver.clear()
    assert one_.client.get("/api/v1/meta", headers={"traceparent": unsampled}).status_code == 200
    assert one_.client.get("/api/v1/meta").status_code == 200
    spans = receiver.wait_spans(lambda spans: len(spans) >= 1)
    time.sleep(0.5)  # anything else would have been exported by now
    spans = receiver.spans()
    # Ratio 1: the root request is kept, the unsampled remote parent's request is dropped.
    assert [(s.name, s.parent_id) for s in spans] == [("GET /api/v1/meta", "")]


def test_disabled_telemetry_ignores_traceparent(start_stack, mock: MockLLM, receiver: OtlpReceiver) -> None:
    off = start(
        start_stack, mock,
        f'[telemetry]\nenabled = false\notlp_endpoint = "{receiver.endpoint}"\n',
    )
    receiver.clear()
    header, _, _ = traceparent()
    assert off.client.get("/api/v1/meta", headers={"traceparent": header}).status_code == 200
    time.sleep(0.5)
    assert receiver.spans() == [] and receiver.metric_requests == []


def test_bae_otel_log_warn_exports_no_spans_but_metrics(start_stack, mock: MockLLM, receiver: OtlpReceiver) -> None:
    stack = start(start_stack, mock, telemetry_toml(receiver.endpoint), BAE_OTEL_LOG="warn")
    mock.reset()
    receiver.clear()
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    assert "result" in send(stack, sid, skey, "hi")[-1]
    receiver.wait_points(lambda points: "bae.provider.requests" in points and "bae.sessions.open" in points)
    time.sleep(0.5)  # several span batches would have gone out by now
    assert receiver.spans() == []


def values(points: dict[str, list[Point]], name: str) -> dict[tuple, float]:
    return {tuple(sorted(p.attributes.items())): p.value for p in points.get(name, [])}


def test_metric_values_after_a_known_workload(start_stack, mock: MockLLM, receiver: OtlpReceiver) -> None:
    stack = start(start_stack, mock, telemetry_toml(receiver.endpoint, '[telemetry.traces]\nenabled = false\n'))
    mock.reset()
    sid, skey, profile = new_session(stack)
    register(stack, sid, skey)
    for index in range(3):
        mock.enqueue(Reply.text(f"answer {index}"))
        assert "result" in send(stack, sid, skey, f"question {index}")[-1]
    receiver.clear()

    def settled(points: dict[str, list[Point]]) -> bool:
        ok = values(points, "bae.provider.requests").get((("outcome", "ok"), ("provider", "anthropic")))
        return ok == 3 and "bae.sessions.open" in points and "bae.turns.completed" in points

    points = receiver.wait_points(settled)
    assert values(points, "bae.provider.requests") == {(("outcome", "ok"), ("provider", "anthropic")): 3}
    latency = points["bae.provider.latency"]
    assert [(p.unit, p.attributes, p.value) for p in latency] == [("ms", {"provider": "anthropic"}, 3)]
    assert latency[0].total > 0
    gauges = {name: values(points, name).get(()) for name in (
        "bae.sessions.open", "bae.sessions.total", "bae.profiles.count", "bae.keys.count",
        "bae.drivers.registered", "bae.turns.pending", "bae.mcp.sessions.live", "bae.sandboxes.live",
        "bae.subagents.active",
    )}
    assert gauges == {
        "bae.sessions.open": 1, "bae.sessions.total": 1, "bae.profiles.count": 1, "bae.keys.count": 1,
        "bae.drivers.registered": 1, "bae.turns.pending": 0, "bae.mcp.sessions.live": 0,
        "bae.sandboxes.live": 0, "bae.subagents.active": 0,
    }
    # session.open, session.driver.register, then per turn: client message, request, response, server message.
    events = stack.client.get(f"/api/v1/sessions/{sid}/events", headers={"Authorization": f"Bearer {skey}"})
    assert values(points, "bae.events.total") == {(): len(events.json()["items"])}
    assert values(points, "bae.turns.completed") == {(("outcome", "completed"),): 3}

    # The same instruments, scraped from the admin port.
    scraped = stack.admin.get("/metrics")
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    text = scraped.text
    assert 'bae_provider_requests_total{outcome="ok",provider="anthropic"} 3.0' in text
    assert 'bae_provider_latency_seconds_count{provider="anthropic"} 3.0' in text
    assert "bae_sessions_open 1.0" in text
    assert sid not in text and profile["id"] not in text

    # A second driver, and a turn paused on a client tool: scraped at once.
    second = join(stack, sid, profile)
    register(stack, sid, second)
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {})]))
    assert result(send(stack, sid, skey, "what time is it"))["message"]["content"][0]["name"] == "get_time"
    text = stack.admin.get("/metrics").text
    for line in ("bae_drivers_registered 2.0", "bae_turns_pending 1.0", 'bae_tool_calls_total{dispatch="client"} 1.0',
                 'bae_turns_completed_total{outcome="paused"} 1.0', 'bae_turns_completed_total{outcome="completed"} 3.0'):
        assert line in text, text
    assert "bae_tool_latency" not in text  # client tools are never timed
    assert second not in text and skey not in text

    # [telemetry.traces] enabled = false: metrics kept coming (the paused turn's among them, then
    # several exports more), and not one span was exported.
    receiver.wait_points(lambda points: values(points, "bae.turns.completed").get((("outcome", "paused"),)) == 1)
    exports = len(receiver.metric_requests)
    receiver.wait_points(lambda _: len(receiver.metric_requests) >= exports + 6)
    assert receiver.trace_requests == []


def test_metrics_disabled_drops_only_the_named_instruments(
    start_stack, mock: MockLLM, receiver: OtlpReceiver
) -> None:
    stack = start(
        start_stack, mock,
        telemetry_toml(receiver.endpoint, '[telemetry.traces]\nenabled = false\n',
                       metrics='enabled = true\ndisabled = ["bae.provider.latency", "bae.events.total"]'),
    )
    mock.reset()
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    assert "result" in send(stack, sid, skey, "hi")[-1]
    receiver.clear()
    points = receiver.wait_points(lambda points: "bae.provider.requests" in points and "bae.sessions.open" in points)
    assert "bae.provider.latency" not in points and "bae.events.total" not in points
    assert {"bae.sessions.total", "bae.profiles.count", "bae.keys.count"} <= set(points)
    assert "bae_provider_latency" not in stack.admin.get("/metrics").text


def test_no_secret_or_content_is_exported(start_stack, mock: MockLLM, receiver: OtlpReceiver) -> None:
    header_value = "otlp-secret-" + secrets.token_hex(8)
    stack = start(
        start_stack, mock,
        telemetry_toml(receiver.endpoint, 'otlp_headers = { "X-Collector-Token" = "${OTLP_TEST_TOKEN}" }\n'),
        OTLP_TEST_TOKEN=header_value,
    )
    mock.reset()
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {"zone": "MARKER-INPUT"})]))
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    marker = "MARKER-" + secrets.token_hex(8)
    send(stack, sid, skey, f"please {marker}")
    mock.enqueue(Reply.text("MARKER-OUTPUT"))
    send(stack, sid, skey, [{"type": "tool_result", "tool_use_id": "tu_1", "content": "MARKER-RESULT"}])
    receiver.wait_spans(lambda spans: len(by_name(spans, "bae.provider.attempt")) >= 2)
    receiver.wait_points(lambda points: "bae.provider.requests" in points)
    dump = "".join(str(request) for request in [*receiver.trace_requests, *receiver.metric_requests])
    for secret in (TOKEN, skey, stack.admin_key, header_value, marker, "MARKER-INPUT", "MARKER-RESULT",
                   "MARKER-OUTPUT", os.environ.get("BAE_INTERNAL_TOKEN") or "bae-internal-token"):
        assert secret not in dump
    # The headers reach the collector as gRPC metadata, names lowercased.
    assert any(metadata.get("x-collector-token") == header_value for metadata in receiver.metadata)


def test_a_dead_collector_never_affects_requests(start_stack, mock: MockLLM, tmp_path: Path) -> None:
    stack = start(start_stack, mock, telemetry_toml(f"http://127.0.0.1:{free_port()}"))
    mock.reset()
    started = time.monotonic()
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    for _ in range(3):
        assert "result" in send(stack, sid, skey, "hi")[-1]
    assert time.monotonic() - started < 8
    time.sleep(1.5)  # several failed exports
    for name in ("gateway", "session", "runner"):
        log = (stack.tmp / "logs" / f"{name}.log").read_text()
        assert log.count("export is failing") <= 1, log


def test_readiness_follows_the_session_service(start_stack, mock: MockLLM, receiver: OtlpReceiver) -> None:
    stack = start(start_stack, mock, telemetry_toml(receiver.endpoint, metrics="enabled = false"))
    for client in (stack.client, stack.admin):
        ready = client.get("/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    receiver.clear()
    # A 4xx, here the admin port's 401, is not a span error.
    refused, refused_trace, _ = traceparent()
    assert stack.admin.get("/admin/v1/profiles", headers={"Authorization": "Bearer nope", "traceparent": refused}
                           ).status_code == 401
    session = stack.stack.processes["session"]
    session.send_signal(signal.SIGTERM)
    session.wait(15)
    for client in (stack.client, stack.admin):
        down = client.get("/readyz")
        assert down.status_code == 503
        # A reason, never an internal address (docs/security.md): that goes to the gateway's log.
        assert down.json()["detail"] == "not ready: session service unreachable"
    assert stack.client.get("/healthz").status_code == 200  # liveness is unaffected
    # A request the gateway cannot forward is a 503, and its span an error.
    failed, failed_trace, _ = traceparent()
    assert stack.client.post("/api/v1/sessions", json={}, headers={"Authorization": "Bearer k", "traceparent": failed}
                             ).status_code == 503
    spans = receiver.wait_spans(lambda spans: {refused_trace, failed_trace} <= {s.trace_id for s in spans})
    (unauthorized,) = [s for s in spans if s.trace_id == refused_trace]
    assert (unauthorized.name, unauthorized.attributes["http.response.status_code"]) == ("GET /admin/v1/profiles", 401)
    assert status(unauthorized) == (UNSET, "")
    (unavailable,) = [s for s in spans if s.trace_id == failed_trace]
    assert (unavailable.name, unavailable.attributes["http.response.status_code"]) == ("POST /api/v1/sessions", 503)
    assert status(unavailable) == (ERROR, "HTTP 503")
    stack.stack.restart("session")
    wait_ready(stack.client)
    assert stack.admin.get("/readyz").status_code == 200

    runner = stack.stack.processes["runner"]
    runner.send_signal(signal.SIGTERM)
    runner.wait(15)
    down = stack.client.get("/readyz")
    assert (down.status_code, down.json()["detail"]) == (503, "not ready: runner unreachable; turns cannot run")
    assert stack.stack.settings.runner_grpc_addr not in down.text
    stack.stack.restart("runner")
    wait_ready(stack.client)  # the gateway reconnects within its 2 s reconnect backoff
    # Each loss was logged once with the address, however often it was probed.
    log = (stack.tmp / "logs" / "gateway.log").read_text()
    settings = stack.stack.settings
    assert log.count(f"not ready: session service unreachable (at {settings.session_grpc_addr})") == 1
    assert log.count(f"not ready: runner unreachable; turns cannot run (at {settings.runner_grpc_addr})") == 1


def wait_ready(client: httpx.Client) -> None:
    deadline = time.monotonic() + 10
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def access_lines(stack: RunningStack) -> list[str]:
    return [line for line in (stack.tmp / "logs" / "gateway.log").read_text().splitlines() if "access" in line]


def test_access_log_text(start_stack, mock: MockLLM) -> None:
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN)
    mock.reset()
    mock.enqueue(Reply.error(500, "down"))
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    response = stack.client.post(
        f"/api/v1/sessions/{sid}/rpc", headers={"Authorization": f"Bearer {skey}", "x-request-id": "req-abc.1"},
        json={"jsonrpc": "2.0", "id": 1, "method": "session.sendMessage", "params": {"message": {"content": "x"}}},
    )
    assert response.headers["x-request-id"] == "req-abc.1"
    assert stack.client.get("/api/v1/nowhere").status_code == 404
    time.sleep(0.2)
    lines = access_lines(stack)
    turn = next(line for line in lines if "request_id=req-abc.1" in line)
    assert "method=POST route=/api/v1/sessions/{id}/rpc status=200 duration_ms=" in turn
    assert f"session_id={sid} request_id=req-abc.1" in turn
    missing = next(line for line in lines if "status=404" in line)
    assert "method=GET route=- status=404" in missing and "session_id" not in missing
    assert stack.admin.get("/metrics").status_code == 404  # telemetry is off
    # The request id reached the runner, whose warning about the failed attempt names it.
    runner_log = (stack.tmp / "logs" / "runner.log").read_text()
    assert any("attempt 0 failed" in line and "request_id=req-abc.1" in line for line in runner_log.splitlines())


def test_access_log_json(start_stack) -> None:
    stack = start_stack(BAE_LOG_FORMAT="json")
    response = stack.client.get("/api/v1/meta")
    rid = response.headers["x-request-id"]
    time.sleep(0.2)
    entries = [json.loads(line) for line in (stack.tmp / "logs" / "gateway.log").read_text().splitlines()
               if line.startswith("{")]
    entry = next(e for e in entries if e.get("request_id") == rid)
    assert entry["logger"] == "bae.access" and entry["level"] == "INFO"
    assert {key: entry[key] for key in ("method", "route", "status", "session_id")} == {
        "method": "GET", "route": "/api/v1/meta", "status": 200, "session_id": None,
    }
    assert isinstance(entry["duration_ms"], float)



# --- Error statuses and instrument values, on one shared stack --------------------------------
# Traces and metrics on, fallback chains, an MCP server. The stack exports to a receiver of its own,
# so the "nothing exported" checks above never see it. Counters are cumulative and the tests share
# the stack, so each reads the exact values from /metrics before its workload and expects the
# receiver to get those plus what the workload adds.


@pytest.fixture(scope="module")
def shared_receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, mock: MockLLM, shared_receiver: OtlpReceiver
) -> Iterator[RunningStack]:
    with http_tools_server("") as mcp_url:
        toml = (
            mock_provider_toml(mock.base_url)
            + mock_provider_toml(mock.base_url, name="backup", kind="openai")
            + mock_provider_toml(f"http://127.0.0.1:{free_port()}", name="dead", kind="openai")  # nothing listens
            + f'[[mcp.servers]]\nname = "local"\ntransport = "http"\nurl = "{mcp_url}"\n'
            + telemetry_toml(shared_receiver.endpoint)
        )
        # BAE_MCP_TIMEOUT: a tools/call that outlives it fails as a call, not as a tool.
        running = launch_stack(tmp_path_factory.mktemp("telemetry"), toml, MOCK_LLM_TOKEN=TOKEN,
                               BAE_MCP_TIMEOUT="2", **FAST_EXPORT)
        yield running
        running.close()


def scraped(stack: RunningStack) -> dict[str, float]:
    """Every series on the admin port's /metrics now (`name{labels}` -> value), collected at once."""
    lines = [line for line in stack.admin.get("/metrics").text.splitlines() if line and not line.startswith("#")]
    return {series: float(value) for series, value in (line.rsplit(" ", 1) for line in lines)}


def point(points: dict[str, list[Point]], name: str, **labels: str) -> float | None:
    """The value of one metric's data point with exactly these attributes (None: no such point)."""
    return values(points, name).get(tuple(sorted(labels.items())))


def trace_of(
    receiver: OtlpReceiver, trace_id: str, done: Callable[[list[ReceivedSpan]], bool]
) -> list[ReceivedSpan]:
    """The spans of one trace, once `done(spans of that trace)` holds."""
    spans = receiver.wait_spans(lambda spans: done([s for s in spans if s.trace_id == trace_id]))
    return [s for s in spans if s.trace_id == trace_id]


def attempts(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return sorted(by_name(spans, "bae.provider.attempt"), key=lambda s: int(s.attributes["bae.provider.attempt"]))


def request_turn_and_two_attempts(spans: list[ReceivedSpan]) -> bool:
    """Each service exports on its own schedule: wait for the gateway's span as well as the others'."""
    return len(http_spans(spans)) == 1 and len(by_name(spans, "bae.turn")) == 1 and len(attempts(spans)) == 2


def test_a_failed_primary_attempt_is_an_error_and_its_fallback_is_not(
    shared: RunningStack, shared_receiver: OtlpReceiver, mock: MockLLM
) -> None:
    mock.reset()
    sid, skey, _ = new_session(shared, fallback_providers=["backup"])
    register(shared, sid, skey)
    before = scraped(shared)
    mock.enqueue(Reply.error(500, "primary down"), Reply.text("from backup"))
    header, trace_id, _ = traceparent()
    assert result(send_traced(shared, sid, skey, "hi", header))["message"]["content"][0]["text"] == "from backup"

    spans = trace_of(shared_receiver, trace_id, request_turn_and_two_attempts)
    turn = one(spans, "bae.turn")
    primary, fallback = attempts(spans)
    assert primary.parent_id == fallback.parent_id == turn.span_id
    assert primary.attributes == {
        "bae.provider.name": "mock", "bae.provider.kind": "anthropic", "bae.provider.model": "mock-model",
        "bae.provider.attempt": 0, "bae.provider.attempt_kind": "primary", "http.response.status_code": 500,
    }
    assert status(primary) == (ERROR, "provider returned HTTP 500")
    assert fallback.attributes == {
        "bae.provider.name": "backup", "bae.provider.kind": "openai", "bae.provider.model": "mock-model",
        "bae.provider.attempt": 1, "bae.provider.attempt_kind": "fallback", "http.response.status_code": 200,
    }
    assert status(fallback) == (UNSET, "")
    assert turn.attributes["bae.turn.outcome"] == "completed" and status(turn) == (UNSET, "")
    assert "primary down" not in str(shared_receiver.trace_requests)  # the error body is never exported

    # One error for the anthropic kind, one success for the openai kind (kinds, never entry names).
    error = before.get('bae_provider_requests_total{outcome="error",provider="anthropic"}', 0) + 1
    ok = before.get('bae_provider_requests_total{outcome="ok",provider="openai"}', 0) + 1
    points = shared_receiver.wait_points(
        lambda points: point(points, "bae.provider.requests", outcome="error", provider="anthropic") == error
        and point(points, "bae.provider.requests", outcome="ok", provider="openai") == ok
    )
    timed = before.get('bae_provider_latency_seconds_count{provider="openai"}', 0) + 1
    assert point(points, "bae.provider.latency", provider="openai") == timed
    assert {dict(labels)["provider"] for labels in values(points, "bae.provider.requests")} <= {"anthropic", "openai"}


def test_all_providers_failed_ends_the_turn_and_the_session_span_in_error(
    shared: RunningStack, shared_receiver: OtlpReceiver, mock: MockLLM
) -> None:
    mock.reset()
    sid, skey, _ = new_session(shared, fallback_providers=["dead"])
    register(shared, sid, skey)
    before = scraped(shared)
    mock.enqueue(Reply.error(500, "primary down"))
    header, trace_id, _ = traceparent()
    outcome = result(send_traced(shared, sid, skey, "hi", header))
    assert outcome["events"][-1]["payload"] == {"reason": "all_providers_failed", "attempts": 2}
    # The fallback got no HTTP answer at all: the runner's detail, which holds no URL.
    responses = [e["payload"] for e in outcome["events"] if e["event_type"] == "provider.response"]
    transport_error = responses[1]["error"]
    assert transport_error.startswith("connection error") and "127.0.0.1" not in transport_error

    spans = trace_of(shared_receiver, trace_id, request_turn_and_two_attempts)
    primary, fallback = attempts(spans)
    assert status(primary) == (ERROR, "provider returned HTTP 500")
    assert fallback.attributes["bae.provider.name"] == "dead"
    assert "http.response.status_code" not in fallback.attributes  # there was no HTTP status
    assert status(fallback) == (ERROR, transport_error)
    turn = one(spans, "bae.turn")
    assert turn.attributes["bae.turn.outcome"] == "providers_failed"
    assert status(turn) == (ERROR, "all providers failed")
    # The sendMessage request itself answered 200 (a JSON-RPC result): no HTTP error.
    request = one(http_spans(spans), "POST /api/v1/sessions/{id}/rpc")
    assert (request.attributes["http.response.status_code"], status(request)) == (200, (UNSET, ""))

    # The session (in error now) ended its span with the same status; the turn linked to it.
    def session_span(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [s for s in by_name(spans, "bae.session") if s.attributes["bae.session.id"] == sid]

    (session,) = session_span(shared_receiver.wait_spans(lambda spans: bool(session_span(spans))))
    assert status(session) == (ERROR, "all providers failed")
    assert links(turn) == [(session.span_id, "session")]

    counted = before.get('bae_turns_completed_total{outcome="providers_failed"}', 0) + 1
    errors = {kind: before.get(f'bae_provider_requests_total{{outcome="error",provider="{kind}"}}', 0) + 1
              for kind in ("anthropic", "openai")}
    points = shared_receiver.wait_points(
        lambda points: point(points, "bae.turns.completed", outcome="providers_failed") == counted
        and all(point(points, "bae.provider.requests", outcome="error", provider=kind) == n
                for kind, n in errors.items())
    )
    # A failed attempt is timed too.
    timed = before.get('bae_provider_latency_seconds_count{provider="openai"}', 0) + 1
    assert point(points, "bae.provider.latency", provider="openai") == timed


def test_mcp_tool_errors_and_the_mcp_instruments(
    shared: RunningStack, shared_receiver: OtlpReceiver, mock: MockLLM
) -> None:
    mock.reset()
    before = scraped(shared)
    sid, skey, _ = new_session(shared, mcp_servers=["local"])
    register(shared, sid, skey)
    calls = [("tu_1", "fail", {"message": "MCP-ERROR-TEXT"}), ("tu_2", "echo", {"text": "fine"}),
             ("tu_3", "sleep", {"seconds": 4})]  # outlives BAE_MCP_TIMEOUT (2 s)
    mock.enqueue(Reply.tool_use(calls), Reply.text("done"))
    header, trace_id, _ = traceparent()
    assert result(send_traced(shared, sid, skey, "go", header))["message"]["content"][0]["text"] == "done"

    spans = trace_of(shared_receiver, trace_id, lambda ours: len(by_name(ours, "bae.mcp.call")) == 3
                     and len(by_name(ours, "bae.tool.dispatch")) == 3 and len(by_name(ours, "bae.turn")) == 1)
    dispatches = {s.attributes["bae.tool.name"]: s for s in by_name(spans, "bae.tool.dispatch")}
    mcp_calls = {s.attributes["bae.tool.name"]: s for s in by_name(spans, "bae.mcp.call")}
    assert {tool: span.parent_id for tool, span in mcp_calls.items()} == \
        {tool: span.span_id for tool, span in dispatches.items()}
    assert {tool: status(span) for tool, span in mcp_calls.items()} == {
        "fail": (ERROR, "MCP tool returned isError"),  # the tool's own error
        "echo": (UNSET, ""),
        "sleep": (ERROR, "MCP call failed"),  # the call's: it timed out
    }
    assert {tool: (span.attributes["bae.tool.is_error"], status(span)) for tool, span in dispatches.items()} == {
        "fail": (True, (ERROR, "tool result is_error")),
        "echo": (False, (UNSET, "")),
        "sleep": (True, (ERROR, "tool result is_error")),
    }
    dump = str(shared_receiver.trace_requests)
    assert "MCP-ERROR-TEXT" not in dump and "timed out" not in dump  # MCP error texts are never exported

    # While its MCP connection is live the session counts in bae.mcp.sessions.live; the three MCP
    # blocks are counted and timed (the timed-out one for at least the 2 s it waited).
    live = before.get("bae_mcp_sessions_live", 0)
    counted = before.get('bae_tool_calls_total{dispatch="mcp"}', 0) + 3
    timed = before.get('bae_tool_latency_seconds_count{dispatch="mcp"}', 0) + 3
    points = shared_receiver.wait_points(
        lambda points: point(points, "bae.mcp.sessions.live") == live + 1
        and point(points, "bae.tool.calls", dispatch="mcp") == counted
        and point(points, "bae.tool.latency", dispatch="mcp") == timed
    )
    (latency,) = [p for p in points["bae.tool.latency"] if p.attributes == {"dispatch": "mcp"}]
    assert latency.unit == "ms"
    # The OTLP sum is in ms, the scraped one in seconds.
    assert latency.total - 1000 * before.get('bae_tool_latency_seconds_sum{dispatch="mcp"}', 0) >= 2000
    # Closing the session closes its connection.
    closed = shared.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"})
    assert closed.status_code == 200
    shared_receiver.wait_points(lambda points: point(points, "bae.mcp.sessions.live") == live)


def test_an_incoming_tracestate_travels_with_its_traceparent(
    shared: RunningStack, shared_receiver: OtlpReceiver, mock: MockLLM
) -> None:
    mock.reset()
    sid, skey, _ = new_session(shared)
    register(shared, sid, skey)
    shared_receiver.clear()
    header, trace_id, client_span = traceparent()
    tracestate = "vendor=opaque-1,other=2"
    mock.enqueue(Reply.text("hello"))
    assert "result" in send_traced(shared, sid, skey, "hi", header, tracestate)[-1]

    spans = trace_of(shared_receiver, trace_id,
                     lambda ours: {"bae.turn", "bae.provider.attempt"} <= {s.name for s in ours} and bool(http_spans(ours)))
    request = one(http_spans(spans), "POST /api/v1/sessions/{id}/rpc")
    assert request.parent_id == client_span
    # Joined at the gateway, then carried to the session service and on to the runner.
    carried = (request, one(spans, "bae.turn"), one(spans, "bae.provider.attempt"))
    assert [(s.service.rsplit("-", 1)[1], s.span.trace_state) for s in carried] == [
        ("gateway", tracestate), ("session", tracestate), ("runner", tracestate),
    ]

    # A tracestate is carried only alongside a valid traceparent: alone, or with an invalid one
    # (zero trace id), the request is a new root and carries none.
    invalid = f"00-{'0' * 32}-{secrets.token_hex(8)}-01"
    for extra in ({}, {"traceparent": invalid}):
        assert shared.client.get("/api/v1/meta", headers={"tracestate": tracestate, **extra}).status_code == 200
    metas = shared_receiver.wait_spans(lambda spans: len(by_name(spans, "GET /api/v1/meta")) == 2)
    assert [(s.parent_id, s.span.trace_state) for s in by_name(metas, "GET /api/v1/meta")] == [("", ""), ("", "")]


def test_an_invalid_continuation_ends_the_session_span_in_error(
    shared: RunningStack, shared_receiver: OtlpReceiver, mock: MockLLM
) -> None:
    mock.reset()
    sid, skey, _ = new_session(shared)
    register(shared, sid, skey)
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {}), ("tu_1", "get_time", {})]))  # a pause no answer can match
    assert result(send(shared, sid, skey, "twice"))["message"]["content"][0]["id"] == "tu_1"
    header, trace_id, _ = traceparent()
    answer = [{"type": "tool_result", "tool_use_id": "tu_1", "content": "noon"}]
    refused = send_traced(shared, sid, skey, answer, header)[-1]["error"]
    assert refused["message"].startswith("tool result merge invalid")

    def session_span(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [s for s in by_name(spans, "bae.session") if s.attributes["bae.session.id"] == sid]

    (session,) = session_span(shared_receiver.wait_spans(lambda spans: bool(session_span(spans))))
    assert status(session) == (ERROR, "tool result merge invalid")
    # The request answered 200 with a JSON-RPC error: not an HTTP error.
    (request,) = trace_of(shared_receiver, trace_id, lambda ours: bool(http_spans(ours)))
    assert (request.attributes["http.response.status_code"], status(request)) == (200, (UNSET, ""))
