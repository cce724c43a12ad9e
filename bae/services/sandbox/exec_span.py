"""The `bae.sandbox.exec` span around one driver exec (TELEMETRY §3.2), when tracing is on.

Its parent is the caller's context from the Exec metadata (the session's `bae.tool.dispatch`
span). Neither the command nor its output nor the driver's error text is recorded.
"""

from __future__ import annotations

from opentelemetry.trace import Span, Status, StatusCode

from bae.common import telemetry


def start_exec() -> Span | None:
    """Named after the tool whose dispatch ran the command, when one did (not `execRemoteSandbox`)."""
    if telemetry.tracer is None:
        return None
    tool = telemetry.tool_name.get()
    return telemetry.tracer.start_span("bae.sandbox.exec", attributes={"bae.tool.name": tool} if tool else None)


def end_exec(span: Span | None, exit_code: int | None) -> None:
    """`exit_code` None: the exec failed without returning."""
    if span is None:
        return
    if exit_code is None:
        span.set_status(Status(StatusCode.ERROR, "sandbox exec failed"))
    else:
        span.set_attribute("bae.sandbox.exit_code", exit_code)
        if exit_code != 0:
            span.set_status(Status(StatusCode.ERROR, "non-zero exit code"))
    span.end()
