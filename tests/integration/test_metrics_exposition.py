"""GET /metrics of the real services, checked as `promtool check metrics` would, plus the naming
rules of docs/observability.md (testkit/metric_names.py): after a workload that gives every kind of
family points (gauges, counters, millisecond histograms), every family follows them."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bae.common import telemetry
from bae.services.gateway.prometheus import PROMETHEUS_NAMES
from testkit.live import new_session, register, result, send
from testkit.metric_names import naming_problems
from testkit.mockllm import MockLLM, Reply
from testkit.otlp_receiver import OtlpReceiver
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-metrics-names"


def test_every_scraped_family_follows_the_naming_rules(start_stack, mock: MockLLM) -> None:
    with OtlpReceiver() as receiver:
        toml = (mock_provider_toml(mock.base_url)
                + f'[telemetry]\nenabled = true\notlp_endpoint = "{receiver.endpoint}"\n'
                + "[telemetry.traces]\nenabled = false\n[telemetry.metrics]\nenabled = true\n")
        stack = start_stack(config_toml=toml, MOCK_LLM_TOKEN=TOKEN)
        mock.reset()
        sid, skey, _ = new_session(stack)
        register(stack, sid, skey)
        mock.enqueue(Reply.text("hello"))
        assert "result" in send(stack, sid, skey, "hi")[-1]
        mock.enqueue(Reply.tool_use([("tu_1", "get_time", {})]))
        assert result(send(stack, sid, skey, "what time is it"))["message"]["content"][0]["name"] == "get_time"

        scraped = stack.admin.get("/metrics")
    assert scraped.status_code == 200
    text = scraped.text
    assert naming_problems(text) == []
    families = {family.name: family for family in text_string_to_metric_families(text)}
    # The gauges are all there, and the instruments the workload touched.
    gauges = {PROMETHEUS_NAMES[name] for name in telemetry.GAUGES}
    assert gauges <= {name for name, family in families.items() if family.type == "gauge"}
    assert {"bae_turns_completed", "bae_provider_requests", "bae_tool_calls"} <= {
        name for name, family in families.items() if family.type == "counter"
    }
    latency = families["bae_provider_latency_seconds"]
    assert latency.type == "histogram" and latency.documentation
    # In seconds: a mock provider on loopback answers well within one.
    (total,) = [s.value for s in latency.samples if s.name.endswith("_sum")]
    assert 0 < total < 1
    buckets = [s.labels["le"] for s in latency.samples if s.name.endswith("_bucket")]
    assert "0.005" in buckets and "10.0" in buckets
    assert families["bae_sessions_open"].samples[0].value == 1
    assert families["bae_drivers_registered"].samples[0].value == 1
