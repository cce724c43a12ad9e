"""`bae run`'s readiness asks its own processes: another server answering on a port of the stack is not it."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bae.launcher.stack import Stack
from testkit.stack import stack_env

pytestmark = pytest.mark.stack


class Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the handler's API)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_stranger_answering_healthz_on_the_client_port_is_not_the_gateway(tmp_path: Path) -> None:
    stranger = ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=stranger.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{stranger.server_address[1]}"
    # Stack.start itself, without `bae run`'s check of the ports first: as when a server takes the port
    # between that check and the gateway's start.
    stack = Stack(env=stack_env(tmp_path, BAE_ADDR=address), log_dir=tmp_path / "logs")
    try:
        with pytest.raises(RuntimeError, match="^gateway exited with code 1 during start-up$"):
            stack.start()
    finally:
        stack.stop()
        stranger.shutdown()
        stranger.server_close()
    log = (tmp_path / "logs" / "gateway.log").read_text()
    assert f"gateway cannot bind {address} (BAE_ADDR): Address already in use" in log
