"""The `bae.provider.attempt` span of one provider attempt (TELEMETRY §3.2), when tracing is on.

Its parent is the `bae.turn` whose context came with the step (bound by the step's task,
bae/services/runner/server.py). Error descriptions are the attempt's failure detail with any URL taken out;
the detail never holds a token (the walk redacts it) or a response body.
"""

from __future__ import annotations

import re

from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from bae.common import telemetry
from bae.common.config import ProviderEntry

_URL = re.compile(r"\w+://\S+")


def start_attempt(entry: ProviderEntry, attempt: int, kind: str) -> Span | None:
    """`kind` is the entry's place in the chain ("primary" or "fallback"), a retry's as well."""
    if telemetry.tracer is None:
        return None
    return telemetry.tracer.start_span(
        "bae.provider.attempt",
        kind=SpanKind.CLIENT,
        attributes={
            "bae.provider.name": entry.name,
            "bae.provider.kind": entry.provider,
            "bae.provider.model": entry.model,
            "bae.provider.attempt": attempt,
            "bae.provider.attempt_kind": kind,
        },
    )


def end_attempt(span: Span | None, ok: bool, status: int | None, detail: str) -> None:
    """`detail` is the failure text of a failed attempt."""
    if span is None:
        return
    if status is not None:
        span.set_attribute("http.response.status_code", status)
    if not ok:
        span.set_status(Status(StatusCode.ERROR, _URL.sub("<url>", detail)))
    span.end()
