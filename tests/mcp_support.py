"""The MCP test server (tests/mcp_servers/tools.py) as a test module's HTTP fixture."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from conftest import free_port

TOOLS_SERVER = str(Path(__file__).resolve().parent / "mcp_servers" / "tools.py")


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
