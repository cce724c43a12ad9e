"""/metrics follows Prometheus' naming rules (testkit/metric_names.py), for every instrument the
services define: each role's instruments, recorded once, as the gateway writes them."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from bae.common import telemetry
from bae.common.config import METRIC_NAMES, Telemetry
from bae.services.gateway.prometheus import PROMETHEUS_NAMES, exposition
from testkit.metric_names import naming_problems

pytestmark = pytest.mark.unit

ENDPOINT = "http://127.0.0.1:9"  # nothing listens: exports fail quietly in the background


def _every_instrument_of(role: str) -> ExportMetricsServiceRequest:
    telemetry.start(Telemetry(enabled=True, otlp_endpoint=ENDPOINT, traces_enabled=False), role, env={})
    try:
        for name in telemetry.ROLE_INSTRUMENTS[role]:
            if name in telemetry.COUNTERS:
                telemetry.add(name, 3, {"outcome": "ok"})
            elif name in telemetry.HISTOGRAMS:
                telemetry.record(name, 42.0, {"outcome": "ok"})
            else:
                telemetry.observe(name, lambda: 2)
        return ExportMetricsServiceRequest.FromString(telemetry.metrics_snapshot())
    finally:
        telemetry.shutdown(1.0)


def test_every_instrument_has_a_prometheus_name_and_a_description() -> None:
    assert set(PROMETHEUS_NAMES) == set(METRIC_NAMES)
    described = {**telemetry.GAUGES, **telemetry.COUNTERS, **telemetry.HISTOGRAMS}
    assert set(described) == set(METRIC_NAMES) and all(described.values())


def test_the_exposition_of_every_instrument_follows_the_naming_rules() -> None:
    text = exposition([_every_instrument_of("session"), _every_instrument_of("runner")]).decode()
    assert naming_problems(text) == []
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert families == {PROMETHEUS_NAMES[name] + ("_total" if name in telemetry.COUNTERS else "")
                        for name in METRIC_NAMES}
    # 42 ms recorded, 0.042 s written.
    assert 'bae_provider_latency_seconds_sum{outcome="ok"} 0.042' in text
    assert 'bae_retention_deleted_bytes_total{outcome="ok"} 3.0' in text


def test_the_rules_catch_what_the_old_names_did() -> None:
    old = "\n".join((
        "# HELP bae_sessions_total ", "# TYPE bae_sessions_total gauge", "bae_sessions_total 1.0",
        "# HELP bae_profiles_count Profiles", "# TYPE bae_profiles_count gauge", "bae_profiles_count 1.0",
        "# HELP bae_tool_latency_milliseconds Tool time", "# TYPE bae_tool_latency_milliseconds histogram",
        'bae_tool_latency_milliseconds_bucket{le="+Inf"} 1.0', "bae_tool_latency_milliseconds_count 1.0",
        "bae_tool_latency_milliseconds_sum 5.0",
        "# HELP bae_turns_total Turns", "# TYPE bae_turns_total counter", "bae_turns_total 1.0",
        "# HELP bae_wait_ms Waits", "# TYPE bae_wait_ms gauge", "bae_wait_ms 1.0",
        "",
    ))
    problems = naming_problems(old)
    assert "bae_sessions_total: no HELP text" in problems
    assert "bae_sessions_total: only counters end in _total" in problems
    assert "bae_profiles_count: a gauge must not end in a histogram or summary suffix" in problems
    assert 'bae_tool_latency_milliseconds: "milliseconds" is not a base unit (use seconds or bytes)' in problems
    assert "bae_tool_latency_milliseconds: a time ends in _seconds" in problems
    assert 'bae_wait_ms: "ms" is not a base unit (use seconds or bytes)' in problems
    assert not [problem for problem in problems if problem.startswith("bae_turns")]
