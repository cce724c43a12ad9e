"""What a failed test's report shows of its stacks' service logs.

A stack's logs live in its temporary directory, which a CI run does not keep: without them a failure
such as "session loop failed" says nothing of why. Each stack launch_stack starts is noted here while
it runs, and as started during the current test; tests/conftest.py adds to a failed test's report the
warnings and errors (tracebacks whole) of every such stack's service logs: those of the stacks the
test started (closed or not) and of every stack still running, module-scoped shared ones included.
"""

from __future__ import annotations

import re
from pathlib import Path

# Each service log's last lines shown, and how much of its end is read to find them.
SHOWN_LINES = 60
READ_BYTES = 1024 * 1024
LINE_CHARS = 600
# A log record's first line, as bae.common.logs.TextFormatter writes it: "2026-01-01 00:00:00,000 LEVEL logger: message".
_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) ")
_NOTABLE_LEVELS = {"WARNING", "ERROR", "CRITICAL"}

_running: dict[Path, None] = {}
_this_test: dict[Path, None] = {}


def started(log_dir: Path) -> None:
    _running[log_dir] = None
    _this_test[log_dir] = None


def stopped(log_dir: Path) -> None:
    _running.pop(log_dir, None)


def test_started() -> None:
    _this_test.clear()


def notable_lines(text: str) -> list[str]:
    """The records at WARNING and above with their continuation lines (a traceback), and any traceback
    printed outside a record (an uncaught exception's)."""
    kept: list[str] = []
    block: list[str] = []
    notable = False
    for line in text.splitlines():
        record = _RECORD.match(line)
        if record is not None:
            if notable:
                kept += block
            block, notable = [], record.group("level") in _NOTABLE_LEVELS
        elif line.startswith("Traceback"):
            notable = True
        block.append(line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + "…")
    return kept + block if notable else kept


def _tail(path: Path) -> str:
    with path.open("rb") as log:
        size = log.seek(0, 2)
        log.seek(max(size - READ_BYTES, 0))
        return log.read().decode("utf-8", "replace")


def failure_report() -> str:
    """The notable lines of the service logs of the stacks this test started or that still run ("" if none)."""
    parts = []
    for log_dir in dict.fromkeys([*_this_test, *_running]):
        for path in sorted(log_dir.glob("*.log")):
            lines = notable_lines(_tail(path))
            if lines:
                shown = lines[-SHOWN_LINES:]
                cut = f" (the last {SHOWN_LINES} of {len(lines)})" if len(lines) > SHOWN_LINES else ""
                parts.append(f"--- {path}{cut}\n" + "\n".join(shown))
    return "\n".join(parts)
