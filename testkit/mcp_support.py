"""The MCP test server (tests/mcp_servers/tools.py) as a test module's HTTP fixture, and its stdio children."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from testkit import ROOT
from testkit.ports import free_port

TOOLS_SERVER = str(ROOT / "tests" / "mcp_servers" / "tools.py")


def wait_for_port(port: int, process: subprocess.Popen, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, "MCP test server exited during startup"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"MCP test server did not listen on port {port}")


@contextmanager
def http_tools_server(prefix: str) -> Iterator[str]:
    """A streamable-HTTP tools server whose tool names start with `prefix`; yields its URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, TOOLS_SERVER, "http", "--port", str(port), "--prefix", prefix],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)


def proc_stat(pid: int | str) -> list[str]:
    """/proc/<pid>/stat after the command name: [state, ppid, ...]."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        # A zombie still answers signal 0; it is dead for our purposes.
        return proc_stat(pid)[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def live_children(parent: int, token: str) -> list[int]:
    """Live processes whose parent is `parent` and whose command line contains `token`."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            state, ppid = proc_stat(entry.name)[:2]
            if int(ppid) == parent and state != "Z" and token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found
