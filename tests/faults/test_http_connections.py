"""The gateway's HTTP connections are bounded without configuration (docs/security.md, "HTTP connections").

Held partial request heads, a stalled body and an idle keep-alive connection are each closed by
the gateway, and a port at BAE_HTTP_MAX_CONNECTIONS answers 503 to the connections beyond it,
while a well-behaved client is served throughout. The gateway is the real process; the requests
it answers itself (/healthz) need no session service, and a body it reads first needs none either.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import uvicorn

from bae.services.gateway.connections import PortLimits, protocol_for

from testkit.ports import free_port
from testkit.processes import ServiceProcess, service_env

pytestmark = pytest.mark.stack

TIMEOUT = 1  # BAE_HTTP_HEADER_TIMEOUT and BAE_HTTP_KEEPALIVE_TIMEOUT of the bounded gateway
# How long past its timeout a connection may take to be closed: scheduling on a busy machine, never a second timeout.
SLACK = 3.0
HELD = 200
LIMIT = 20


class Gateway(ServiceProcess):
    def __init__(self, log_path: Path, **settings: str) -> None:
        self.addr, self.admin_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        env = service_env(
            BAE_ADDR=self.addr,
            BAE_ADMIN_ADDR=self.admin_addr,
            BAE_SESSION_GRPC_ADDR=f"127.0.0.1:{free_port()}",  # nothing there: these tests never reach it
            BAE_SHUTDOWN_TIMEOUT="5",
            BAE_LOG="warning",
            **settings,
        )
        super().__init__("bae.services.gateway", env=env, log_path=log_path)
        deadline = time.monotonic() + 15
        while not self.healthy():
            assert self.process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.05)

    def healthy(self, admin: bool = False) -> bool:
        """A request the port answers itself is served."""
        url = f"http://{self.admin_addr if admin else self.addr}/healthz"
        try:
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def connect(self, admin: bool = False) -> socket.socket:
        host, port = (self.admin_addr if admin else self.addr).rsplit(":", 1)
        return socket.create_connection((host, int(port)), timeout=10)


@pytest.fixture(scope="module")
def bounded(tmp_path_factory) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path_factory.mktemp("bounded") / "gateway.log",
                      BAE_HTTP_HEADER_TIMEOUT=str(TIMEOUT), BAE_HTTP_KEEPALIVE_TIMEOUT=str(TIMEOUT))
    yield gateway
    assert gateway.stop() == 0


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path_factory.mktemp("limited") / "gateway.log", BAE_HTTP_MAX_CONNECTIONS=str(LIMIT),
                      BAE_HTTP_KEEPALIVE_TIMEOUT="60")
    yield gateway
    assert gateway.stop() == 0


def read_until_closed(sock: socket.socket, deadline: float) -> bytes:
    """Everything the gateway sends until it closes the connection; fails at `deadline`."""
    chunks = []
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise AssertionError("the gateway did not close the connection in time") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length body, from a connection that stays open."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(status_line.split()[1]), headers, body


def problem_of(response: bytes, status: int) -> dict:
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), response
    assert b"\r\nconnection: close\r\n" in head.lower() + b"\r\n", head
    problem = json.loads(body)
    assert problem["status"] == status
    return problem


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"


def test_partial_heads_are_closed_while_a_well_behaved_client_is_served(bounded):
    held = []
    for _ in range(HELD):
        sock = bounded.connect()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Slow: ")  # never finished
        held.append(sock)
    silent = bounded.connect()  # connects and sends nothing at all
    opened = time.monotonic()
    assert bounded.healthy()  # served while they are held

    deadline = opened + TIMEOUT + SLACK
    answers = [read_until_closed(sock, deadline) for sock in held]
    assert read_until_closed(silent, deadline) == b""  # nothing was asked: closed without an answer
    assert problem_of(answers[0], 408) == {
        "type": "request_timeout", "title": "Request Timeout", "status": 408,
        "detail": f"the request head did not arrive within {TIMEOUT} s",
    }
    assert all(problem_of(answer, 408)["type"] == "request_timeout" for answer in answers)
    for sock in [*held, silent]:
        sock.close()
    assert bounded.healthy()  # and after


def test_a_stalled_body_is_answered_408_and_a_slow_one_is_not(bounded):
    head = b"POST /api/v1/sessions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n"
    with bounded.connect() as stalled:
        stalled.sendall(head + b'{"a"')  # and nothing more
        problem = problem_of(read_until_closed(stalled, time.monotonic() + TIMEOUT + SLACK), 408)
        assert problem["detail"] == f"the request body stopped: no byte of it for {TIMEOUT} s"

    # A body that takes longer than the timeout in all, but never waits that long for its next byte.
    with bounded.connect() as slow:
        slow.sendall(head + b'{"a": ')
        for byte in b'1}  ':
            time.sleep(TIMEOUT * 0.4)
            slow.sendall(bytes([byte]))
        status, _, _ = read_response(slow)
        assert status != 408  # read whole, and answered (no session service here: whatever it says)


async def late_reader(scope, receive, send) -> None:
    """Takes its time before it reads the body (as the gateway does while it checks a credential)."""
    await asyncio.sleep(TIMEOUT * 2)
    size, more = 0, True
    while more:
        message = await receive()
        size, more = size + len(message.get("body", b"")), message.get("more_body", False)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def test_a_body_the_gateway_holds_back_is_not_stalled():
    # The gateway's own protocol in this process, in front of an app that reads late.
    limits = PortLimits("client", header_timeout=TIMEOUT, keepalive_timeout=TIMEOUT, max_connections=10)
    config = uvicorn.Config(late_reader, lifespan="off", ws="none", http=protocol_for(limits), log_config=None)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    listener = socket.create_server(("127.0.0.1", 0))
    await server.startup(sockets=[listener])
    try:
        port = listener.getsockname()[1]
        # Waits for `100 Continue`, which comes when the app first reads.
        waiting_reader, waiting = await asyncio.open_connection("127.0.0.1", port)
        waiting.write(b"POST / HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n")
        # Sent whole at once: the protocol stops reading past 64 KiB until the app reads.
        big = 512 * 1024
        paused_reader, paused = await asyncio.open_connection("127.0.0.1", port)
        paused.write(b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n" % big + b"x" * big)

        assert await waiting_reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        waiting.write(b"0123456789")
        for reader, size in ((waiting_reader, 10), (paused_reader, big)):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 "), head
            assert await reader.readexactly(len(str(size))) == str(size).encode()
        for writer in (waiting, paused):
            writer.close()
    finally:
        await server.shutdown(sockets=[listener])


def test_a_body_after_an_early_answer_must_still_keep_moving(bounded):
    # Refused by its length before a byte of it is read; the client then sends nothing.
    with bounded.connect() as sock:
        sock.sendall(b"POST /api/v1/sessions HTTP/1.1\r\nHost: gw\r\nContent-Length: 999999999\r\n\r\n")
        answer = read_until_closed(sock, time.monotonic() + TIMEOUT + SLACK)
        assert answer.startswith(b"HTTP/1.1 413 "), answer
        assert answer.count(b"HTTP/1.1 ") == 1  # no 408 after the answer: closed, nothing more


def test_an_idle_keep_alive_connection_is_closed(bounded):
    with bounded.connect() as sock:
        for _ in range(2):  # kept alive between requests that come in time
            sock.sendall(HEALTHZ)
            status, headers, _ = read_response(sock)
            assert status == 200 and headers.get("connection") != "close"
        assert read_until_closed(sock, time.monotonic() + TIMEOUT + SLACK) == b""


def test_a_client_that_stops_reading_is_dropped(bounded):
    # Pipelined requests for more than the socket buffers between the two ends hold (a loopback
    # sender's grows to 4 MiB), answers not read: the gateway's unsent bytes stop shrinking. Dropped,
    # the connection ends once the client has read what its peer's buffers still held.
    requests = 200
    with bounded.connect() as sock:
        sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: gw\r\n\r\n" * requests)
        time.sleep(TIMEOUT * 3)
        received = 0
        sock.settimeout(SLACK)
        try:
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        except TimeoutError:
            raise AssertionError(f"the connection is still open after {received} bytes") from None
    assert received < requests * len(httpx.get(f"http://{bounded.addr}/openapi.json").content)
    assert bounded.healthy()


def test_connections_beyond_the_limit_are_answered_503(limited):
    held = []
    for _ in range(LIMIT):
        sock = limited.connect()
        sock.sendall(HEALTHZ)
        assert read_response(sock)[0] == 200  # served, and kept open
        held.append(sock)

    with limited.connect() as beyond:
        beyond.sendall(HEALTHZ)
        problem = problem_of(read_until_closed(beyond, time.monotonic() + 10), 503)
        assert problem == {
            "type": "service_unavailable", "title": "Service Unavailable", "status": 503,
            "detail": f"the gateway holds its limit of {LIMIT} connections; try again shortly",
        }
    # The ones held are served on, and the admin port counts its own connections.
    held[0].sendall(HEALTHZ)
    assert read_response(held[0])[0] == 200
    assert limited.healthy(admin=True)

    for sock in held:
        sock.close()
    deadline = time.monotonic() + 10
    while not limited.healthy():  # once the gateway saw them go
        assert time.monotonic() < deadline, "still refused after the connections were released"
        time.sleep(0.05)
    assert all(limited.healthy() for _ in range(3))
