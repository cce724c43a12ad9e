"""The test's end of BAE_TEST_HOLD_ADDR (services/session/api/race_hold.py)."""

from __future__ import annotations

import queue
import socket
import threading


class RaceHolds:
    """The test's end of BAE_TEST_HOLD_ADDR: every call that reaches the hold point is let
    through at once, except the one method and session it was told to hold."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self._server.getsockname()[1]
        self._target: tuple[str, str] | None = None
        self._held: queue.Queue[socket.socket] = queue.Queue()
        threading.Thread(target=self._serve, daemon=True).start()

    def hold(self, method: str, session_id: str) -> None:
        self._target = (method, session_id)

    def wait_held(self) -> socket.socket:
        """The held call's connection, once the call sits between its check and the live state."""
        return self._held.get(timeout=10)

    @staticmethod
    def release(held: socket.socket) -> None:
        held.sendall(b"go\n")
        held.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            line = conn.makefile("r").readline().split()
            if tuple(line) == self._target:
                self._held.put(conn)
            else:
                self.release(conn)

    def close(self) -> None:
        self._server.close()
