"""What a failed stack test's report shows of the service logs (testkit/stack_logs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from testkit import stack_logs

pytestmark = pytest.mark.unit

LOG = """\
2026-01-01 00:00:00,001 INFO bae: session serving gRPC on 127.0.0.1:1
2026-01-01 00:00:00,002 WARNING bae.session.sandboxes: sandbox host 127.0.0.1:2 is down
2026-01-01 00:00:00,003 INFO bae.session: a turn started
2026-01-01 00:00:00,004 ERROR bae.session.api: session.sendMessage failed: step failed
Traceback (most recent call last):
  File "x.py", line 1, in <module>
RuntimeError: boom
2026-01-01 00:00:00,005 INFO bae.session: quiet again
Traceback (most recent call last):
  File "y.py", line 2, in <module>
ValueError: uncaught
"""


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    stack_logs.test_started()
    yield
    stack_logs.test_started()


def test_warnings_and_errors_are_kept_with_their_tracebacks() -> None:
    assert stack_logs.notable_lines(LOG) == [
        "2026-01-01 00:00:00,002 WARNING bae.session.sandboxes: sandbox host 127.0.0.1:2 is down",
        "2026-01-01 00:00:00,004 ERROR bae.session.api: session.sendMessage failed: step failed",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "RuntimeError: boom",
        # An info record is left out, but not a traceback printed after it.
        "2026-01-01 00:00:00,005 INFO bae.session: quiet again",
        "Traceback (most recent call last):",
        '  File "y.py", line 2, in <module>',
        "ValueError: uncaught",
    ]
    assert stack_logs.notable_lines("2026-01-01 00:00:00,001 INFO bae: fine\n") == []


def logs(tmp_path: Path, name: str, text: str) -> Path:
    log_dir = tmp_path / name / "logs"
    log_dir.mkdir(parents=True)
    (log_dir / "session.log").write_text(text)
    return log_dir


def test_the_report_covers_running_stacks_and_those_this_test_started(tmp_path: Path) -> None:
    shared = logs(tmp_path, "shared", "2026-01-01 00:00:00,000 ERROR bae: in the shared stack\n")
    own = logs(tmp_path, "own", "2026-01-01 00:00:00,000 ERROR bae: in the test's own stack\n")
    gone = logs(tmp_path, "gone", "2026-01-01 00:00:00,000 ERROR bae: in an earlier test's stack\n")
    stack_logs.started(shared)
    stack_logs.started(gone)
    stack_logs.stopped(gone)
    stack_logs.test_started()
    stack_logs.started(own)
    stack_logs.stopped(own)  # closed by the test before it failed: still shown
    report = stack_logs.failure_report()
    assert f"--- {own / 'session.log'}\n" in report and "in the test's own stack" in report
    assert "in the shared stack" in report
    assert "earlier test" not in report
    stack_logs.stopped(shared)


def test_a_long_log_shows_its_last_lines(tmp_path: Path) -> None:
    lines = [f"2026-01-01 00:00:00,000 WARNING bae: number {n}" for n in range(100)]
    log_dir = logs(tmp_path, "long", "\n".join(lines) + "\n")
    stack_logs.started(log_dir)
    report = stack_logs.failure_report().splitlines()
    stack_logs.stopped(log_dir)
    start = report.index(f"--- {log_dir / 'session.log'} (the last 60 of 100)") + 1
    assert report[start:start + 61] == lines[-60:]
