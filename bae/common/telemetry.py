"""OpenTelemetry for every service (TELEMETRY.md): bring-up from `[telemetry]`, the span and
metric hooks, W3C context in gRPC metadata, the metrics snapshot behind `/metrics`, and the
flush at shutdown.

Each service calls `start()` once after logging is configured and `shutdown()` once at the
end. Off means off: unless a pipeline is enabled, `tracer` stays None, no instrument exists,
no propagator runs and every hook returns at its first line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bae import __version__
from bae.common.config import METRIC_NAMES, EnvResolutionError, resolve_env
from bae.common.config import Telemetry as TelemetryConfig
from bae.common.errors import UsageError

log = logging.getLogger("bae.telemetry")

# Instrumentation scope of every server span and instrument, whatever the process is called.
# A wire name: the telemetry contract fixes this literal, and tools select server spans by it.
SCOPE = "baesrv"
# BAE_OTEL_LOG targets that name the server: its scope, and `bae`, the name its programs go by.
_SCOPE_TARGETS = frozenset((SCOPE, "bae"))
EXPORT_TIMEOUT_SECONDS = 10

# Which role owns which instrument (TELEMETRY §10.4, with tool dispatch and MCP in the session service).
RUNNER_INSTRUMENTS = ("bae.provider.requests", "bae.provider.latency")
ROLE_INSTRUMENTS: dict[str, tuple[str, ...]] = {
    "session": tuple(name for name in METRIC_NAMES if name not in RUNNER_INSTRUMENTS),
    "runner": RUNNER_INSTRUMENTS,
    "sandbox": (),
    "gateway": (),
}
# Gauges read from the shared store: every session replica reports the same count, so
# merged views (the gateway's /metrics) take one value instead of summing them.
STORE_GAUGES = ("bae.sessions.open", "bae.sessions.total", "bae.events.total", "bae.profiles.count", "bae.keys.count")
# Every instrument carries a description: it becomes the HELP line of its /metrics family.
GAUGES = {
    "bae.sessions.open": "Sessions in state open, in the store",
    "bae.sessions.total": "Session rows in the store, in any state",
    "bae.events.total": "Events in the store's event log",
    "bae.profiles.count": "Profiles in the store, not deleted",
    "bae.keys.count": "Active client keys in the store (session and admin keys excluded)",
    "bae.mcp.sessions.live": "Live sessions holding MCP connections",
    "bae.turns.pending": "Turns paused on client tools, waiting to be resumed",
    "bae.sandboxes.live": "Live sessions with a running remote sandbox",
    "bae.subagents.active": "Remote subagents running",
    "bae.drivers.registered": "Registered drivers, summed over live sessions",
}
COUNTERS = {
    "bae.turns.completed": "Turns that returned normally, by outcome",
    "bae.provider.requests": "Provider attempts, by provider kind and outcome",
    "bae.tool.calls": "tool_use blocks dispatched, by dispatch kind",
    "bae.retention.sessions.deleted": "Ended sessions deleted, by trigger (sweep or admin)",
    "bae.retention.bytes.deleted": "Stored event payload bytes of the sessions deleted, by trigger",
    "bae.webhook.deliveries": "Webhook delivery attempts, by outcome (delivered, retry, failed, gone, refused)",
}
# Counters whose unit is not `1`.
COUNTER_UNITS = {"bae.retention.bytes.deleted": "By"}
HISTOGRAMS = {
    "bae.provider.latency": "Wall time of one provider HTTP call",
    "bae.tool.latency": "Server-side tool handling, until its tool.result is written",
    "bae.webhook.latency": "Wall time of one webhook delivery attempt, resolution included",
}

# The RegisterDriver reply's trailer naming the session's `bae.session` span, which the
# gateway links the registration's request span to.
SESSION_TRACEPARENT_KEY = "bae-session-traceparent"

# The tool a dispatch span runs, sent with the calls made under it (a sandbox exec names it).
TOOL_NAME_KEY = "bae-tool-name"
tool_name: ContextVar[str | None] = ContextVar("bae_tool_name", default=None)

_PROPAGATOR = TraceContextTextMapPropagator()
_LEVELS = {"trace": 0, "debug": 1, "info": 2, "warn": 3, "warning": 3, "error": 4, "off": 5}

# The hooks read these; `start()` sets them when a pipeline is on.
tracer: Tracer | None = None
_instruments: dict[str, Counter | Histogram] = {}
_meter: Meter | None = None
_disabled: frozenset[str] = frozenset()
_owned: tuple[str, ...] = ()
_state: "_Providers | None" = None


@dataclass
class _Providers:
    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None
    scrape_reader: InMemoryMetricReader | None


class _ExportHealth:
    """One flag for both pipelines: the first failure after a success warns once (TELEMETRY §2.4)."""

    def __init__(self) -> None:
        self._failing = False
        self._lock = threading.Lock()

    def report(self, ok: bool, pipeline: str) -> None:
        with self._lock:
            if ok:
                self._failing = False
                return
            if self._failing:
                return
            self._failing = True
        # Never the error text: it could echo configuration.
        log.warning(
            "telemetry: OTLP %s export is failing (collector unreachable or misconfigured). Export is "
            "fire-and-forget and does not affect request latency or success; this is logged once per outage.",
            pipeline,
        )


class _SpanExporter(OTLPSpanExporter):
    def __init__(self, health: _ExportHealth, headers: tuple[tuple[str, str], ...], endpoint: str) -> None:
        super().__init__(
            endpoint=endpoint, insecure=endpoint.startswith("http://"), headers=headers, timeout=EXPORT_TIMEOUT_SECONDS
        )
        # Headers come only from the config: an empty map must not fall back to OTEL_EXPORTER_OTLP_*.
        self._headers = headers
        self._health = health

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = super().export(spans)
        self._health.report(result is SpanExportResult.SUCCESS, "trace")
        return result


class _MetricExporter(OTLPMetricExporter):
    def __init__(self, health: _ExportHealth, headers: tuple[tuple[str, str], ...], endpoint: str) -> None:
        super().__init__(
            endpoint=endpoint, insecure=endpoint.startswith("http://"), headers=headers, timeout=EXPORT_TIMEOUT_SECONDS
        )
        self._headers = headers
        self._health = health

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        result = super().export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        self._health.report(result is MetricExportResult.SUCCESS, "metric")
        return result


def spans_allowed(otel_log: str | None) -> bool:
    """BAE_OTEL_LOG (default info; unparseable means info): spans are INFO, so a stricter level drops them.

    Accepts a level (`warn`) or directives (`bae=warn,info`); the server's target wins.
    """
    level = "info"
    default: str | None = None
    target: str | None = None
    for directive in (otel_log or "").split(","):
        name, sep, value = directive.strip().lower().rpartition("=")
        if not value:
            continue
        if value not in _LEVELS:
            return True
        if not sep:
            default = value
        elif name in _SCOPE_TARGETS:
            target = value
    level = target or default or level
    return _LEVELS[level] <= _LEVELS["info"]


def _headers(config: TelemetryConfig, env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """`otlp_headers` resolved now, names lowercased for gRPC; the values live only in the exporter."""
    resolved = []
    for name, template in sorted(config.otlp_headers.items()):
        try:
            value = resolve_env(template, env=env)
        except EnvResolutionError as exc:
            raise UsageError(f"telemetry initialization failed: otlp_headers[{name}]: {exc}") from None
        if any(char < " " and char != "\t" or char == "\x7f" for char in value):
            raise UsageError(f'telemetry initialization failed: invalid OTLP header value for "{name}"')
        resolved.append((name.lower(), value))
    return tuple(resolved)


def start(config: TelemetryConfig, role: str, env: Mapping[str, str] | None = None) -> None:
    """Build this process's providers from `[telemetry]`; raises UsageError (exit 2) when it cannot."""
    global tracer, _meter, _disabled, _owned, _state
    env = os.environ if env is None else env
    traces_on = config.enabled and config.traces_enabled
    # A role without instruments (gateway, sandbox) needs no meter at all.
    metrics_on = config.enabled and config.metrics_enabled and bool(ROLE_INSTRUMENTS.get(role))
    if not (traces_on or metrics_on):
        return
    # The exporters' own error lines would repeat every failed batch, with its error text; a full
    # span queue drops spans silently (TELEMETRY §2.1).
    for noisy in (
        "opentelemetry.exporter.otlp.proto.grpc.exporter",
        "opentelemetry.sdk.metrics._internal.export",
        "opentelemetry.sdk._shared_internal",
    ):
        logging.getLogger(noisy).setLevel(logging.CRITICAL + 1)
    health = _ExportHealth()
    endpoint = config.otlp_endpoint or ""
    resource = Resource.create(
        {
            "service.name": f"{config.service_name}-{role}",
            "service.version": __version__,
            "service.instance.id": uuid.uuid4().hex,
        }
    )
    meter_provider = scrape_reader = None
    if metrics_on:  # metrics first, then traces (TELEMETRY §2.2)
        headers = _headers(config, env)
        try:
            exporter = _MetricExporter(health, headers, endpoint)
        except Exception as exc:
            raise UsageError(f"telemetry initialization failed: OTLP metric exporter: {exc}") from None
        scrape_reader = InMemoryMetricReader()
        meter_provider = MeterProvider(
            metric_readers=[PeriodicExportingMetricReader(exporter), scrape_reader], resource=resource
        )
        _meter = meter_provider.get_meter(SCOPE)
        _disabled = frozenset(config.metrics_disabled)
        _owned = ROLE_INSTRUMENTS.get(role, ())
        for name in _owned:
            if name in _disabled:
                continue
            if name in COUNTERS:
                _instruments[name] = _meter.create_counter(
                    name, unit=COUNTER_UNITS.get(name, "1"), description=COUNTERS[name]
                )
            elif name in HISTOGRAMS:
                _instruments[name] = _meter.create_histogram(name, unit="ms", description=HISTOGRAMS[name])
        log.info("telemetry: OTLP metric export enabled (endpoint=%s)", endpoint)
    tracer_provider = None
    if traces_on and spans_allowed(env.get("BAE_OTEL_LOG")):
        headers = _headers(config, env)
        try:
            span_exporter = _SpanExporter(health, headers, endpoint)
        except Exception as exc:
            raise UsageError(f"telemetry initialization failed: OTLP span exporter: {exc}") from None
        tracer_provider = TracerProvider(
            resource=resource, sampler=ParentBased(root=TraceIdRatioBased(config.sample_ratio))
        )
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        tracer = tracer_provider.get_tracer(SCOPE)
        log.info(
            "telemetry: OTLP trace export enabled (endpoint=%s sample_ratio=%s)", endpoint, config.sample_ratio
        )
    _state = _Providers(tracer_provider, meter_provider, scrape_reader)


def shutdown(budget: float) -> None:
    """Both providers shut down concurrently (each exports what it holds) within `budget` seconds."""
    global tracer, _meter, _state
    state, _state = _state, None
    tracer, _meter = None, None
    _instruments.clear()
    if state is None:
        return
    deadline = time.monotonic() + max(budget, 0.0)

    def run(what: str, stop: Callable[[], object]) -> None:
        try:
            stop()
        except Exception as exc:
            log.warning("telemetry %s shutdown failed: %s", what, exc)

    threads = []
    if state.tracer_provider is not None:
        threads.append(threading.Thread(target=run, args=("tracer", state.tracer_provider.shutdown), daemon=True))
    if state.meter_provider is not None:
        provider = state.meter_provider
        millis = max(budget, 0.0) * 1000
        threads.append(
            threading.Thread(target=run, args=("meter", lambda: provider.shutdown(timeout_millis=millis)), daemon=True)
        )
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))
    if any(thread.is_alive() for thread in threads):
        log.warning("telemetry shutdown timed out; remaining exports may be dropped")


# --- metrics -------------------------------------------------------------------


def count(name: str, attributes: Mapping[str, str]) -> None:
    """+1 on a counter; nothing when metrics are off or the instrument is disabled."""
    instrument = _instruments.get(name)
    if instrument is not None:
        instrument.add(1, attributes)  # type: ignore[union-attr]


def add(name: str, value: int, attributes: Mapping[str, str]) -> None:
    """+value on a counter; nothing when metrics are off or the instrument is disabled."""
    instrument = _instruments.get(name)
    if instrument is not None:
        instrument.add(value, attributes)  # type: ignore[union-attr]


def record(name: str, value: float, attributes: Mapping[str, str]) -> None:
    instrument = _instruments.get(name)
    if instrument is not None:
        instrument.record(value, attributes)  # type: ignore[union-attr]


def observe(name: str, read: Callable[[], int | None]) -> None:
    """Register an observable gauge; `read()` returns the value, or None for no data point this time.

    The reader calls it from its own thread (periodic export) or from a scrape.
    """
    if _meter is None or name in _disabled or name not in _owned:
        return

    def callback(options: CallbackOptions) -> Iterable[Observation]:
        value = read()
        return [] if value is None else [Observation(value)]

    _meter.create_observable_gauge(name, callbacks=[callback], description=GAUGES.get(name, ""))


def metrics_snapshot() -> bytes:
    """This process's instruments now, as a serialized OTLP ExportMetricsServiceRequest (b"" when off)."""
    state = _state
    if state is None or state.scrape_reader is None:
        return b""
    data = state.scrape_reader.get_metrics_data()
    return encode_metrics(data).SerializeToString() if data is not None else b""


# The internal method every gRPC service answers with `metrics_snapshot()` (request and reply are
# raw bytes, so no generated code): the gateway's /metrics collects the services' instruments through it.
METRICS_SERVICE = "baeproto.v1.Telemetry"
METRICS_METHOD = f"/{METRICS_SERVICE}/CollectMetrics"


def metrics_rpc_handler() -> grpc.GenericRpcHandler:
    async def collect(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        # A thread: gauge callbacks may wait on this process's event loop (the store's count query).
        return await asyncio.to_thread(metrics_snapshot)

    return grpc.method_handlers_generic_handler(
        METRICS_SERVICE, {"CollectMetrics": grpc.unary_unary_rpc_method_handler(collect)}
    )


# --- context in gRPC metadata ---------------------------------------------------


def inject(metadata: list[tuple[str, str | bytes]]) -> None:
    """Add the current span's `traceparent`/`tracestate` (nothing when tracing is off)."""
    if tracer is None:
        return
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    metadata.extend(carrier.items())
    if (tool := tool_name.get()) is not None:
        metadata.append((TOOL_NAME_KEY, tool))


def attach_incoming(metadata: Sequence[tuple[str, str | bytes]] | None) -> None:
    """Make an incoming call's W3C context (if valid) the parent of what this call's task opens."""
    if tracer is None or not metadata:
        return
    carrier = {key: value for key, value in metadata if key in ("traceparent", "tracestate", TOOL_NAME_KEY)}
    if (tool := carrier.pop(TOOL_NAME_KEY, None)) is not None and isinstance(tool, str):
        tool_name.set(tool)
    if carrier:
        otel_context.attach(_PROPAGATOR.extract(carrier))


def extract_headers(headers: Mapping[str, str]) -> Context:
    """The W3C context of HTTP headers (an empty Context, so a new root, when absent or invalid)."""
    return _PROPAGATOR.extract(headers)


def traceparent_of(span: trace.Span) -> str:
    """A span's context as a `traceparent` string, to be stored or sent and linked to later."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def link_to(traceparent: str, kind: str) -> Link | None:
    """A link with `bae.link.kind` to the span a `traceparent` string names (None when invalid)."""
    context = trace.get_current_span(_PROPAGATOR.extract({"traceparent": traceparent})).get_span_context()
    return Link(context, {"bae.link.kind": kind}) if context.is_valid else None

