"""`bae run` stopping: once, whatever number of signals asks it to.

The same stop often arrives twice: `make run` forwards its own SIGTERM to the recipe, which the
process group (`timeout`, a service manager, a terminal's Ctrl-C) has already signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from testkit import ROOT
from testkit.stack import stack_env

pytestmark = pytest.mark.stack


def children_of(pid: int) -> set[int]:
    children = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.add(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue  # a process that ended while it was read
    return children


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_repeated_while_the_stack_stops_does_not_break_off_the_stop(tmp_path: Path, first: int) -> None:
    log = tmp_path / "stderr.log"  # a file, not a pipe: a service left running would hold a pipe open
    with log.open("w") as stderr:
        launcher = subprocess.Popen([sys.executable, "-m", "bae", "run"], cwd=ROOT, env=stack_env(tmp_path),
                                    stdout=subprocess.PIPE, stderr=stderr, text=True)
    services: set[int] = set()
    try:
        assert launcher.stdout is not None
        for line in launcher.stdout:
            if line.startswith("Press Ctrl-C"):
                break
        services = children_of(launcher.pid)
        assert len(services) >= 4  # gateway, session, runner, sandbox host
        launcher.send_signal(first)
        wait_for(lambda: "shutting down" in log.read_text(), "the stack to start stopping")
        launcher.send_signal(signal.SIGTERM)  # the stop under way is asked for again
        launcher.wait(timeout=60)
        wait_for(lambda: not any(alive(pid) for pid in services), "every service to stop")
    finally:
        for pid in [launcher.pid, *services]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        launcher.wait()
    assert launcher.returncode == 0, log.read_text()
    assert "Traceback" not in log.read_text(), log.read_text()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
