"""A real OTLP/gRPC receiver for tests: the collector TraceService and MetricsService from the
OpenTelemetry proto definitions, recording every export request it is sent.

    with OtlpReceiver() as receiver:
        ...  # [telemetry] otlp_endpoint = receiver.endpoint
        spans = receiver.wait_spans(lambda spans: any(s.name == "bae.turn" for s in spans))

Standalone (benchmarks, so decoding shares no interpreter with the load generator):
`python -m testkit.otlp_receiver --port 4317`.
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Callable, TypeVar

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def value_of(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def attributes(items: list[KeyValue]) -> dict[str, object]:
    return {item.key: value_of(item.value) for item in items}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str  # the resource's service.name
    scope: str
    span: Span

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def attributes(self) -> dict[str, object]:
        return attributes(self.span.attributes)

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()


@dataclass(frozen=True)
class Point:
    """One metric data point: its metric, attributes and value (a histogram's value is its count)."""

    name: str
    unit: str
    kind: str
    attributes: dict[str, object]
    value: float
    total: float = 0.0  # histograms: the sum


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, port: int = 0) -> None:
        self._lock = threading.Lock()
        self.trace_requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.metadata: list[dict[str, str]] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "OtlpReceiver":
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)

    def Export(self, request, context):  # noqa: N802 - both services name their one method Export
        with self._lock:
            self.metadata.append({key: value for key, value in context.invocation_metadata()})
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                self.trace_requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()
            self.metric_requests.append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    def clear(self) -> None:
        with self._lock:
            self.trace_requests.clear()
            self.metric_requests.clear()
            self.metadata.clear()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            requests = list(self.trace_requests)
        found = []
        for request in requests:
            for resource in request.resource_spans:
                service = str(attributes(resource.resource.attributes).get("service.name"))
                for scope in resource.scope_spans:
                    found.extend(ReceivedSpan(service, scope.scope.name, span) for span in scope.spans)
        return found

    def wait_spans(self, done: Callable[[list[ReceivedSpan]], bool], timeout: float = 15.0) -> list[ReceivedSpan]:
        return _wait(self.spans, done, timeout, "spans")

    def latest_points(self) -> dict[str, list[Point]]:
        """Per metric name, the data points of the most recent export of each service instance."""
        with self._lock:
            requests = list(self.metric_requests)
        latest: dict[tuple[str, str], list[Point]] = {}
        for request in requests:
            for resource in request.resource_metrics:
                instance = str(attributes(resource.resource.attributes).get("service.instance.id"))
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        latest[(instance, metric.name)] = list(_points(metric))
        merged: dict[str, list[Point]] = {}
        for (_, name), points in latest.items():
            merged.setdefault(name, []).extend(points)
        return merged

    def wait_points(
        self, done: Callable[[dict[str, list[Point]]], bool], timeout: float = 15.0
    ) -> dict[str, list[Point]]:
        return _wait(self.latest_points, done, timeout, "metrics")


T = TypeVar("T")


def _wait(read: Callable[[], T], done: Callable[[T], bool], timeout: float, what: str) -> T:
    """Poll `read()` until `done` says so; past `timeout` fail with what was received."""
    deadline = time.monotonic() + timeout
    while True:
        received = read()
        if done(received):
            return received
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not exported in time; got {received}")
        time.sleep(0.05)


def _points(metric) -> list[Point]:  # type: ignore[no-untyped-def]
    kind = metric.WhichOneof("data")
    if kind in ("gauge", "sum"):
        return [
            Point(metric.name, metric.unit, kind, attributes(p.attributes), p.as_int if p.WhichOneof("value") == "as_int" else p.as_double)
            for p in getattr(metric, kind).data_points
        ]
    if kind == "histogram":
        return [
            Point(metric.name, metric.unit, kind, attributes(p.attributes), p.count, p.sum)
            for p in metric.histogram.data_points
        ]
    return []


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="An OTLP/gRPC receiver that records and drops what it gets.")
    parser.add_argument("--port", type=int, required=True)
    with OtlpReceiver(parser.parse_args().port) as running:
        running._server.wait_for_termination()
