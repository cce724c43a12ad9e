"""Telemetry pieces in process: bring-up switches, BAE_OTEL_LOG, the Prometheus merge, log lines."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from bae.common import telemetry
from bae.common.propagation import request_id
from bae.common.config import Telemetry
from bae.common.errors import UsageError
from bae.common.logs import JsonFormatter, TextFormatter
from bae.services.gateway.prometheus import exposition

pytestmark = pytest.mark.unit

ENDPOINT = "http://127.0.0.1:9"  # nothing listens: exports fail quietly in the background


@pytest.fixture
def started():
    yield
    telemetry.shutdown(1.0)


@pytest.mark.parametrize(
    "value, allowed",
    [(None, True), ("", True), ("info", True), ("debug", True), ("warn", False), ("off", False),
     ("nonsense", True), ("bae=warn", False), ("warn,bae=info", True), ("baesrv=warn", False), ("other=off", True)],
)
def test_bae_otel_log_gates_spans(value: str | None, allowed: bool) -> None:
    assert telemetry.spans_allowed(value) is allowed


def test_disabled_installs_nothing(started) -> None:
    telemetry.start(Telemetry(enabled=False, otlp_endpoint=ENDPOINT), "session", env={})
    assert telemetry.tracer is None and telemetry.metrics_snapshot() == b""
    telemetry.count("bae.turns.completed", {"outcome": "completed"})  # a no-op, never an error


def test_metrics_disabled_drops_only_the_named_instrument(started) -> None:
    config = Telemetry(enabled=True, otlp_endpoint=ENDPOINT, traces_enabled=False,
                       metrics_disabled=("bae.tool.latency",))
    telemetry.start(config, "session", env={})
    assert telemetry.tracer is None
    telemetry.count("bae.tool.calls", {"dispatch": "client"})
    telemetry.record("bae.tool.latency", 5.0, {"dispatch": "mcp"})
    for name in ("bae.sessions.open", "bae.tool.latency"):
        telemetry.observe(name, lambda: 4)
    snapshot = ExportMetricsServiceRequest.FromString(telemetry.metrics_snapshot())
    names = {m.name for r in snapshot.resource_metrics for s in r.scope_metrics for m in s.metrics}
    assert names == {"bae.tool.calls", "bae.sessions.open"}
    scopes = {s.scope.name for r in snapshot.resource_metrics for s in r.scope_metrics}
    assert scopes == {telemetry.SCOPE} == {"baesrv"}


def test_roles_register_only_their_own_instruments(started) -> None:
    telemetry.start(Telemetry(enabled=True, otlp_endpoint=ENDPOINT, traces_enabled=False), "runner", env={})
    telemetry.count("bae.tool.calls", {"dispatch": "client"})  # the session service's, not the runner's
    telemetry.count("bae.provider.requests", {"provider": "openai", "outcome": "ok"})
    snapshot = ExportMetricsServiceRequest.FromString(telemetry.metrics_snapshot())
    assert {m.name for r in snapshot.resource_metrics for s in r.scope_metrics for m in s.metrics} == {
        "bae.provider.requests"
    }


def test_unresolvable_header_fails_start() -> None:
    config = Telemetry(enabled=True, otlp_endpoint=ENDPOINT, otlp_headers={"X-Token": "${NOT_SET_ANYWHERE}"})
    with pytest.raises(UsageError, match=r"telemetry initialization failed: otlp_headers\[X-Token\]"):
        telemetry.start(config, "runner", env={})


def test_tracing_on_injects_w3c_context_only(started) -> None:
    telemetry.start(Telemetry(enabled=True, otlp_endpoint=ENDPOINT, metrics_enabled=False), "gateway", env={})
    assert telemetry.tracer is not None
    span = telemetry.tracer.start_span("x")
    from opentelemetry import trace

    with trace.use_span(span, end_on_exit=True):
        metadata: list[tuple[str, str]] = []
        telemetry.inject(metadata)
    assert [key for key, _ in metadata] == ["traceparent"]
    link = telemetry.link_to(telemetry.traceparent_of(span), "session")
    assert link is not None and link.context.span_id == span.get_span_context().span_id
    assert dict(link.attributes) == {"bae.link.kind": "session"}
    assert telemetry.link_to("00-garbage", "session") is None


def _attr(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _snapshot(requests: int, gauge: int, buckets: list[int]) -> ExportMetricsServiceRequest:
    counter = metrics_pb2.Metric(
        name="bae.provider.requests", unit="1",
        sum=metrics_pb2.Sum(is_monotonic=True, data_points=[
            metrics_pb2.NumberDataPoint(as_int=requests, attributes=[_attr("outcome", "ok"), _attr("provider", "openai")])
        ]),
    )
    drivers = metrics_pb2.Metric(
        name="bae.drivers.registered", gauge=metrics_pb2.Gauge(data_points=[metrics_pb2.NumberDataPoint(as_int=gauge)])
    )
    latency = metrics_pb2.Metric(
        name="bae.provider.latency", unit="ms",
        histogram=metrics_pb2.Histogram(data_points=[metrics_pb2.HistogramDataPoint(
            attributes=[_attr("provider", "openai")], count=sum(buckets), sum=10.0,
            explicit_bounds=[5.0, 50.0], bucket_counts=buckets,
        )]),
    )
    return ExportMetricsServiceRequest(resource_metrics=[metrics_pb2.ResourceMetrics(
        scope_metrics=[metrics_pb2.ScopeMetrics(metrics=[counter, drivers, latency])]
    )])


def test_prometheus_exposition_sums_replicas() -> None:
    text = exposition([_snapshot(2, 1, [1, 1, 0]), _snapshot(3, 2, [0, 1, 1])]).decode()
    assert 'bae_provider_requests_total{outcome="ok",provider="openai"} 5.0' in text
    assert "bae_drivers_registered 3.0" in text
    # Milliseconds on the OTLP side, seconds in the exposition: bounds and sum are converted.
    assert 'bae_provider_latency_seconds_bucket{le="0.005",provider="openai"} 1.0' in text
    assert 'bae_provider_latency_seconds_bucket{le="0.05",provider="openai"} 3.0' in text
    assert 'bae_provider_latency_seconds_bucket{le="+Inf",provider="openai"} 4.0' in text
    assert 'bae_provider_latency_seconds_sum{provider="openai"} 0.02' in text


def _record(message: str, **fields: object) -> logging.LogRecord:
    record = logging.LogRecord("bae.access", logging.INFO, __file__, 1, message, (), None)
    if fields:
        record.fields = fields
    return record


def test_log_lines_carry_the_request_id() -> None:
    token = request_id.set("r-1")
    try:
        assert TextFormatter().format(_record("hello")).endswith("INFO bae.access: hello request_id=r-1")
        assert json.loads(JsonFormatter().format(_record("hello")))["request_id"] == "r-1"
    finally:
        request_id.reset(token)
    line = TextFormatter().format(_record("access", method="GET", route="/x", status=200, session_id=None))
    assert line.endswith("bae.access: access method=GET route=/x status=200")
    entry = json.loads(JsonFormatter().format(_record("access", method="GET", session_id=None)))
    assert entry["method"] == "GET" and entry["session_id"] is None and entry["message"] == "access"
    assert "request_id" not in json.loads(JsonFormatter().format(_record("plain")))


def test_a_record_is_one_line_whatever_its_message_or_exception_carries() -> None:
    # A message or an exception text with client input: no line after the first can pass for a record.
    record = logging.LogRecord("bae.gateway", logging.ERROR, __file__, 1, "no route for %s", ("/a\nFAKE\x1b[2J",), None)
    try:
        raise ValueError("bad\nFAKE line\x07")
    except ValueError:
        record.exc_info = sys.exc_info()
    first, *rest = TextFormatter().format(record).split("\n")
    assert first.endswith("bae.gateway: no route for /a\\nFAKE\\x1b[2J")
    assert rest and all(line.startswith("    ") for line in rest)
    assert rest[-2:] == ["    ValueError: bad", "    FAKE line\\x07"]
    record.exc_text = None
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "no route for /a\\nFAKE\\x1b[2J"
    assert entry["exception"].endswith("ValueError: bad\nFAKE line\\x07")


def test_export_failure_warns_once_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    health = telemetry._ExportHealth()
    with caplog.at_level(logging.WARNING, logger="bae.telemetry"):
        for ok, pipeline in [(False, "trace"), (False, "metric"), (False, "trace"), (True, "metric"), (False, "metric")]:
            health.report(ok, pipeline)
    warnings = [record.getMessage() for record in caplog.records]
    assert [line.split(" export is failing")[0] for line in warnings] == [
        "telemetry: OTLP trace", "telemetry: OTLP metric",
    ]
    assert all("logged once per outage" in line for line in warnings)
