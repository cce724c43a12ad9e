"""The session service's spans (TELEMETRY §3): `bae.session`, `bae.turn`, `bae.tool.dispatch`
and `bae.mcp.call`, and the counters updated at the same points (`bae.turns.completed`,
`bae.tool.calls`, `bae.tool.latency`).

With tracing off every helper here opens nothing and only the counters move (they are no-ops
too when metrics are off). No helper records content: tool input and output appear as byte
lengths, errors as the fixed status strings of the spec.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import ContextManager, Iterator

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode

from bae.common import telemetry
from bae.common.jsontext import JsonObject
from bae.services.session.engine.domain import Dispatch, TurnEnd
from bae.services.session.engine.subagents import SubagentStatus

TURNS_COMPLETED = "bae.turns.completed"
TOOL_CALLS = "bae.tool.calls"
TOOL_LATENCY = "bae.tool.latency"
# TurnEnd -> bae.turn.outcome
OUTCOMES = {TurnEnd.COMPLETED: "completed", TurnEnd.PAUSED: "paused", TurnEnd.UNAVAILABLE: "providers_failed"}

SUBAGENT_OUTCOMES = {
    SubagentStatus.COMPLETED: "completed",
    SubagentStatus.FAILED: "failed",
    SubagentStatus.TIMED_OUT: "failed",
    SubagentStatus.CANCELLED: "cancelled",
}

# Fixed error descriptions (TELEMETRY §3.2, §3.3).
ALL_PROVIDERS_FAILED = "all providers failed"
MERGE_INVALID = "tool result merge invalid"
PROFILE_UNAVAILABLE = "profile unavailable"


def _active(span: Span | None) -> ContextManager[object]:
    """`span` as the current span (what outgoing gRPC calls carry); exceptions are never recorded on it."""
    if span is None:
        return nullcontext()
    return trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False)


class SessionSpans:
    """The open `bae.session` spans of this replica, by session id (only when tracing is on).

    One per service, owned by whoever wires it (bae/services/session/wiring.py)."""

    def __init__(self) -> None:
        self._spans: dict[str, Span] = {}

    def open(self, session_id: str, profile_id: str, client_key_id: str) -> None:
        """Started under the current context: the creating request's `http.request`."""
        if telemetry.tracer is None:
            return
        span = telemetry.tracer.start_span(
            "bae.session",
            attributes={
                "bae.session.id": session_id,
                "bae.profile.id": profile_id,
                "bae.client_key.id": client_key_id,
            },
        )
        if span.get_span_context().is_valid:
            self._spans[session_id] = span

    def traceparent(self, session_id: str) -> str | None:
        span = self._spans.get(session_id)
        return telemetry.traceparent_of(span) if span is not None else None

    def links(self, session_id: str) -> list[Link]:
        """A `session` link to the session's span, for a turn; none when it has no span here."""
        span = self._spans.get(session_id)
        if span is None:
            return []
        return [Link(span.get_span_context(), {"bae.link.kind": "session"})]

    def end(self, session_id: str, error: str | None = None) -> None:
        """Idempotent; `error` is one of the fixed status strings of TELEMETRY §3.3."""
        span = self._spans.pop(session_id, None)
        if span is None:
            return
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def end_all(self) -> None:
        """Graceful shutdown: every still-open session span ends, status Unset."""
        for session_id in list(self._spans):
            self.end(session_id)



@dataclass
class TurnTrace:
    """One turn's span (None when tracing is off) and how it ended."""

    spans: SessionSpans
    session_id: str
    span: Span | None
    outcome: str | None = None
    # Set when the client went away mid-turn: the span ended then, with no outcome.
    left_context: SpanContext | None = None
    client_gone: bool = False

    def client_left(self) -> None:
        """The client disconnected: the span ends now, with no outcome, and the turn is not counted."""
        self.client_gone = True
        if self.span is not None and self.outcome is None:
            self.left_context = self.span.get_span_context()
            self.span.end()
            self.span = None

    def cancelled(self) -> None:
        """session.cancelTurn stopped the turn: as on a disconnect, the span ends with no outcome
        and the turn is not counted (TELEMETRY has no `cancelled` turn outcome)."""
        if self.span is not None and self.outcome is None:
            self.span.end()
            self.span = None

    def ended(self, end: TurnEnd) -> SpanContext | None:
        """The loop returned: outcome, counter and, when all providers failed, the session span's end.

        Returns the span's context for a paused turn to keep (the next turn's `resume` link).
        """
        if end == TurnEnd.UNAVAILABLE:
            self.spans.end(self.session_id, ALL_PROVIDERS_FAILED)
        if self.client_gone:
            return self.left_context
        self.outcome = OUTCOMES[end]
        telemetry.count(TURNS_COMPLETED, {"outcome": self.outcome})
        if self.span is None:
            return None
        self.span.set_attribute("bae.turn.outcome", self.outcome)
        if end == TurnEnd.UNAVAILABLE:
            self.span.set_status(Status(StatusCode.ERROR, ALL_PROVIDERS_FAILED))
        return self.span.get_span_context()


@contextmanager
def turn_trace(
    spans: SessionSpans, session_id: str, actor: str, resumed: bool, paused: SpanContext | None
) -> Iterator[TurnTrace]:
    """`bae.turn` around the provider loop, current for everything the loop does.

    Its parent is the current context: the sendMessage request's, which the turn's task copied.
    """
    span = None
    if telemetry.tracer is not None:
        links = spans.links(session_id)
        if paused is not None and paused.is_valid:
            links.append(Link(paused, {"bae.link.kind": "resume"}))
        span = telemetry.tracer.start_span(
            "bae.turn",
            attributes={"bae.session.id": session_id, "bae.client_key.id": actor, "bae.turn.resumed": resumed},
            links=links,
        )
    traced = TurnTrace(spans, session_id, span)
    try:
        with _active(span):
            yield traced
    except BaseException:
        if traced.span is not None and traced.outcome is None:
            traced.span.set_status(Status(StatusCode.ERROR, "session loop failed"))
        raise
    finally:
        if traced.span is not None:
            traced.span.end()


def _json_bytes(value: object) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


@dataclass
class DispatchTrace:
    """One `tool_use` block's dispatch: its span (None when tracing is off) and when handling began."""

    kind: Dispatch
    tool: str
    span: Span | None
    started: float = field(default_factory=time.perf_counter)

    @contextmanager
    def active(self) -> Iterator[None]:
        """The dispatch span as current: a sandbox exec it causes is its child and names the tool."""
        token = telemetry.tool_name.set(self.tool)
        try:
            with _active(self.span):
                yield
        finally:
            telemetry.tool_name.reset(token)

    def answered(self, result: JsonObject) -> None:
        """The block's `tool.result` is written; `result` is its tool_result block."""
        telemetry.record(TOOL_LATENCY, (time.perf_counter() - self.started) * 1000, {"dispatch": str(self.kind)})
        if self.span is None:
            return
        is_error = bool(result.get("is_error", False))
        self.span.set_attribute("bae.tool.is_error", is_error)
        self.span.set_attribute("bae.tool.output.bytes", _json_bytes(result.get("content")))
        if is_error:
            self.span.set_status(Status(StatusCode.ERROR, "tool result is_error"))
        self.span.end()

    def abandoned(self) -> None:
        """The turn failed or was cancelled before the block was answered."""
        if self.span is not None and self.span.is_recording():
            self.span.end()


def open_dispatch(block: JsonObject, kind: Dispatch) -> DispatchTrace:
    """Opened after all of the step's `tool.call` events; a client block's span ends at once."""
    telemetry.count(TOOL_CALLS, {"dispatch": str(kind)})
    tool = str(block.get("name"))
    span = None
    if telemetry.tracer is not None:
        span = telemetry.tracer.start_span(
            "bae.tool.dispatch",
            attributes={
                "bae.tool.name": tool,
                "bae.tool.dispatch": str(kind),
                "bae.tool.input.bytes": _json_bytes(block.get("input", {})),
            },
        )
        if kind == Dispatch.CLIENT:
            span.end()
    return DispatchTrace(kind, tool, span)


def start_subagent(session_id: str, subagent_id: str) -> Span | None:
    """`bae.subagent`, a new root linked to the launching dispatch span (the current one)."""
    if telemetry.tracer is None:
        return None
    launching = trace.get_current_span().get_span_context()
    return telemetry.tracer.start_span(
        "bae.subagent",
        context=Context(),
        links=[Link(launching, {"bae.link.kind": "subagent"})] if launching.is_valid else [],
        attributes={"bae.session.id": session_id, "bae.subagent.id": subagent_id},
    )


def end_subagent(span: Span | None, status: SubagentStatus) -> None:
    """At the subagent's terminal outcome; still running here means its task was stopped: `cancelled`."""
    if span is None:
        return
    outcome = SUBAGENT_OUTCOMES.get(status, "cancelled")
    span.set_attribute("bae.subagent.outcome", outcome)
    if outcome == "failed":
        span.set_status(Status(StatusCode.ERROR, "subagent failed"))
    span.end()


@contextmanager
def mcp_call_span(dispatch: DispatchTrace, tool: str, server: str) -> Iterator[Span | None]:
    """`bae.mcp.call` around one tools/call, a child of its dispatch span (set explicitly)."""
    if telemetry.tracer is None or dispatch.span is None:
        yield None
        return
    span = telemetry.tracer.start_span(
        "bae.mcp.call",
        context=trace.set_span_in_context(dispatch.span),
        kind=SpanKind.CLIENT,
        attributes={"bae.tool.name": tool, "bae.mcp.server": server},
    )
    try:
        yield span
    except BaseException:
        span.set_status(Status(StatusCode.ERROR, "MCP call failed"))
        raise
    finally:
        span.end()


def mcp_call_failed(span: Span | None, tool_error: bool) -> None:
    """The call returned an error: the tool's own (`isError`) or the call's."""
    if span is not None:
        span.set_status(Status(StatusCode.ERROR, "MCP tool returned isError" if tool_error else "MCP call failed"))
