"""Free loopback ports for the processes a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def consecutive_ports(count: int) -> int:
    """The first of `count` consecutive free loopback ports."""
    for _ in range(100):
        first = free_port()
        sockets = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return first
    raise RuntimeError("no consecutive free ports")
