"""GET /metrics on the admin port: the services' instruments in Prometheus text exposition.

The gateway owns no instrument. Each scrape asks every service that owns some (session
service, runner) for its OTLP snapshot over the internal gRPC method of bae.common.telemetry, and
writes the sum over them: counters, histogram buckets and in-memory gauges of several
replicas add up, and the database gauges come from the one session service.

The OTLP names are fixed by the telemetry contract and stay as they are on the OTLP wire;
this exposition names each family after Prometheus' naming rules instead (`PROMETHEUS_NAMES`):
base units in the name (`_seconds`, `_bytes`), `_total` on counters only, and a HELP line from
the instrument's description. Millisecond histograms are converted to seconds here.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from starlette.requests import Request
from starlette.responses import Response

from bae.common.errors import NotFound
from bae.common.grpcutil import channel
from bae.common.internal import InternalPlane
from bae.common import telemetry
from bae.common.telemetry import METRICS_METHOD
from bae.services.gateway.problems import error_response

log = logging.getLogger("bae.gateway")

Labels = tuple[tuple[str, str], ...]

# OTLP instrument name -> Prometheus family name; a counter's `_total` is added by the exposition.
# docs/observability.md lists the same table (and the names these replaced), for dashboards.
PROMETHEUS_NAMES = {
    "bae.sessions.open": "bae_sessions_open",
    "bae.sessions.total": "bae_sessions_stored",
    "bae.events.total": "bae_events_stored",
    "bae.profiles.count": "bae_profiles_active",
    "bae.keys.count": "bae_client_keys_active",
    "bae.mcp.sessions.live": "bae_mcp_sessions_live",
    "bae.turns.pending": "bae_turns_pending",
    "bae.sandboxes.live": "bae_sandboxes_live",
    "bae.subagents.active": "bae_subagents_active",
    "bae.drivers.registered": "bae_drivers_registered",
    "bae.turns.completed": "bae_turns_completed",
    "bae.provider.requests": "bae_provider_requests",
    "bae.provider.latency": "bae_provider_latency_seconds",
    "bae.tool.calls": "bae_tool_calls",
    "bae.tool.latency": "bae_tool_latency_seconds",
    "bae.retention.sessions.deleted": "bae_retention_sessions_deleted",
    "bae.retention.bytes.deleted": "bae_retention_deleted_bytes",
    "bae.webhook.deliveries": "bae_webhook_deliveries",
    "bae.webhook.latency": "bae_webhook_latency_seconds",
}
# OTLP units and their Prometheus base unit: how many make one base unit, and its name suffix.
# (A division, not a product with 0.001: 5 ms is written 0.005, not 0.005000000000000001.)
_BASE_UNITS = {"ms": (1000.0, "_seconds"), "s": (1.0, "_seconds"), "By": (1.0, "_bytes")}


def prometheus_name(otlp_name: str, unit: str) -> str:
    """The family name of an instrument; one missing from the table gets the mechanical mapping
    (dots to underscores, plus the base unit's suffix), so a new instrument is never dropped."""
    if otlp_name in PROMETHEUS_NAMES:
        return PROMETHEUS_NAMES[otlp_name]
    base = otlp_name.replace(".", "_")
    suffix = _BASE_UNITS.get(unit, (1.0, ""))[1]
    return base if base.endswith(suffix) else base + suffix


@dataclass
class _Family:
    kind: str  # "gauge" | "sum" | "histogram"
    description: str
    unit: str
    points: dict[Labels, float] = field(default_factory=lambda: defaultdict(float))
    # histograms: labels -> (bounds, per-bucket counts, sum)
    buckets: dict[Labels, tuple[list[float], list[int], float]] = field(default_factory=dict)


def _labels(attributes: Iterable[KeyValue]) -> Labels:
    return tuple(sorted((item.key, item.value.string_value) for item in attributes))


def merge(snapshots: list[ExportMetricsServiceRequest]) -> dict[str, _Family]:
    """Every data point of every snapshot, summed per metric name and attribute set (the store-wide
    gauges, which every session replica reports alike, by their largest value)."""
    families: dict[str, _Family] = {}
    for snapshot in snapshots:
        for resource in snapshot.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    family = families.setdefault(metric.name, _Family(kind or "", metric.description, metric.unit))
                    if kind in ("gauge", "sum"):
                        store_wide = metric.name in telemetry.STORE_GAUGES
                        for point in getattr(metric, kind).data_points:
                            value = point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
                            labels = _labels(point.attributes)
                            if store_wide:
                                family.points[labels] = max(family.points.get(labels, value), value)
                            else:
                                family.points[labels] += value
                    elif kind == "histogram":
                        for point in metric.histogram.data_points:
                            labels = _labels(point.attributes)
                            bounds, counts, total = family.buckets.get(
                                labels, (list(point.explicit_bounds), [0] * len(point.bucket_counts), 0.0)
                            )
                            counts = [a + b for a, b in zip(counts, point.bucket_counts)]
                            family.buckets[labels] = (bounds, counts, total + point.sum)
    return families


def _prometheus(otlp_name: str, family: _Family) -> Metric | None:
    name = prometheus_name(otlp_name, family.unit)
    per_base_unit = _BASE_UNITS.get(family.unit, (1.0, ""))[0]
    # Every family has a HELP line: an instrument made without a description is named by its OTLP name.
    help_text = family.description or f"OTLP instrument {otlp_name}"
    label_names = sorted({key for labels in [*family.points, *family.buckets] for key, _ in labels})

    def values(labels: Labels) -> list[str]:
        present = dict(labels)
        return [present.get(key, "") for key in label_names]

    if family.kind == "gauge":
        gauge = GaugeMetricFamily(name, help_text, labels=label_names)
        for labels, value in family.points.items():
            gauge.add_metric(values(labels), value / per_base_unit)
        return gauge
    if family.kind == "sum":
        counter = CounterMetricFamily(name, help_text, labels=label_names)
        for labels, value in family.points.items():
            counter.add_metric(values(labels), value / per_base_unit)
        return counter
    if family.kind == "histogram":
        histogram = HistogramMetricFamily(name, help_text, labels=label_names)
        for labels, (bounds, counts, total) in family.buckets.items():
            cumulative, buckets = 0, []
            for bound, count in zip([*(str(b / per_base_unit) for b in bounds), "+Inf"], counts):
                cumulative += count
                buckets.append((bound, cumulative))
            histogram.add_metric(values(labels), buckets, total / per_base_unit)
        return histogram
    return None


class _Snapshot:
    """A prometheus_client collector over one merged scrape."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def exposition(snapshots: list[ExportMetricsServiceRequest]) -> bytes:
    metrics = [m for name, family in sorted(merge(snapshots).items()) if (m := _prometheus(name, family))]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(metrics))
    return generate_latest(registry)


class MetricsEndpoint:
    """The admin port's /metrics; `targets` are the gRPC addresses of the services to collect from."""

    def __init__(self, targets: list[str], plane: InternalPlane, *, enabled: bool, timeout: float) -> None:
        self.enabled = enabled
        self.timeout = timeout
        self.channels = {target: channel(target, plane) for target in targets} if enabled else {}

    async def close(self) -> None:
        for chan in self.channels.values():
            await chan.close()

    async def _collect(self, target: str, chan: grpc.aio.Channel) -> ExportMetricsServiceRequest | None:
        try:
            raw = await chan.unary_unary(METRICS_METHOD)(b"", timeout=self.timeout)
        except grpc.aio.AioRpcError as error:
            log.warning("metrics of %s left out of this scrape: %s", target, error.code().name)
            return None
        return ExportMetricsServiceRequest.FromString(raw)

    async def __call__(self, request: Request) -> Response:
        if not self.enabled:
            return error_response(
                NotFound("metrics are disabled: set [telemetry] enabled and [telemetry.metrics] enabled")
            )
        replies = await asyncio.gather(*(self._collect(target, chan) for target, chan in self.channels.items()))
        return Response(exposition([reply for reply in replies if reply is not None]), media_type=CONTENT_TYPE_LATEST)
