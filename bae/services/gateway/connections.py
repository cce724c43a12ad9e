"""The gateway's HTTP connections, bounded: uvicorn bounds none of these waits itself.

- A request's head must be complete within BAE_HTTP_HEADER_TIMEOUT: of the connection opening for
  its first request, of the head's first byte for a later one.
- A request's body must keep moving: BAE_HTTP_HEADER_TIMEOUT without a byte of it ends the request.
  Time the gateway itself holds the client back does not count (reading paused until the endpoint
  takes what arrived, an `Expect: 100-continue` not answered yet).
- A connection idle between requests is closed after BAE_HTTP_KEEPALIVE_TIMEOUT (uvicorn arms the
  same timer after a response; this one also covers a response that ended before its request did).
- An answer must keep moving too: once nothing more is added to what waits to be sent (the
  endpoint waits for it to drain, or the response is complete), some of it must leave every
  BAE_HTTP_HEADER_TIMEOUT, or the connection is dropped. A client that stops reading would
  otherwise hold its connection for good (closing waits for the unsent bytes).
- Each port holds at most BAE_HTTP_MAX_CONNECTIONS connections. One accepted beyond that is
  answered 503 at its first request and closed: the ones within the limit are served on, so a
  flood of connections cannot take the place of the clients that hold theirs. Its head is bounded
  like any other.

A request that runs out of time is answered 408 when nothing else is being written on its
connection (a pipelined request's response could be), and the connection is closed.

One timer per connection, re-armed lazily: the parser's callbacks only move a deadline (a float),
and the timer, when it fires before that deadline, sets itself again for it. A request costs a few
clock reads and no timer handle.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from starlette.types import Receive, Scope, Send
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from bae.services.gateway.problems import TITLES, problem_body, problem_response

log = logging.getLogger("bae.gateway")

# How often a port at its limit says so in the log, at most.
REFUSAL_LOG_INTERVAL = 60.0


# Where a connection is in its current request. Plain module constants, not an Enum: a member's
# lookup costs a microsecond on Python 3.11, and these are read several times per request.
IDLE = "idle"  # before a request: nothing of it has arrived
HEAD = "head"  # its head is arriving
BODY = "body"  # its body is arriving
BUSY = "busy"  # read whole: the endpoint has it, nothing is awaited from the client


class PortLimits:
    """One port's bounds, and how many connections it refused (told in the log at most once a minute)."""

    def __init__(self, port: str, *, header_timeout: float, keepalive_timeout: float, max_connections: int) -> None:
        self.port = port
        self.header_timeout = header_timeout
        self.keepalive_timeout = keepalive_timeout
        self.max_connections = max_connections
        self.refused = 0
        self.logged_at: float | None = None

    async def refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app of a connection accepted beyond the limit: 503, then the connection closes."""
        self.refused += 1
        now = asyncio.get_running_loop().time()
        if self.logged_at is None or now - self.logged_at >= REFUSAL_LOG_INTERVAL:
            self.logged_at = now
            log.warning(
                "%s port is at its limit of %d connections (BAE_HTTP_MAX_CONNECTIONS): %d refused with 503 so far",
                self.port, self.max_connections, self.refused,
            )
        detail = f"the gateway holds its limit of {self.max_connections} connections; try again shortly"
        response = problem_response(503, "service_unavailable", detail, {"connection": "close", "retry-after": "1"})
        await response(scope, receive, send)


class BoundedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds above; `limits` is set per port (protocol_for)."""

    limits: PortLimits
    _phase = IDLE
    _deadline = 0.0
    _timer: asyncio.TimerHandle | None = None
    _unsent = 0  # bytes waiting to be sent at the last look; 0: none, or not watched
    _unsent_at = 0.0  # when that look was

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.app = cast(ASGI3Application, self.limits.refuse)
        self._expect(IDLE, self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.cycle is None:
            self._phase = HEAD  # the first request: its head is due when the connection's is
        else:
            self._expect(HEAD, self.limits.header_timeout)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        # No timer to move: it is due no later than the head was, which is no later than this.
        self._phase = BODY
        self._deadline = self.loop.time() + self.limits.header_timeout

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._deadline = self.loop.time() + self.limits.header_timeout

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = BUSY
        if self.cycle.response_complete:  # answered before it was read whole
            self._idle()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # self.cycle is the last request read; with pipelining, an earlier one's response may end first.
        if self._phase is BUSY and self.cycle.response_complete:
            self._idle()

    def pause_writing(self) -> None:
        super().pause_writing()
        # The client takes its answer slower than it is written: watch that it takes some.
        self._look_at_unsent(self.transport.get_write_buffer_size())

    def _look_at_unsent(self, unsent: int) -> None:
        self._unsent, self._unsent_at = unsent, self.loop.time()
        self._arm(self._unsent_at + self.limits.header_timeout)

    def resume_writing(self) -> None:
        super().resume_writing()
        # The client took enough for writing to go on: that is progress. (What is written from now
        # on adds to the unsent bytes, so they are compared again only from the next look.)
        self._unsent = 0

    def _idle(self) -> None:
        # Also when the connection is closing: its last answer may still be waiting to be sent.
        self._expect(IDLE, self.limits.keepalive_timeout)

    def _expect(self, phase: str, seconds: float) -> None:
        self._phase = phase
        self._deadline = deadline = self.loop.time() + seconds
        self._arm(deadline)

    def _arm(self, when: float) -> None:
        timer = self._timer
        if timer is None or timer.when() > when:
            if timer is not None:
                timer.cancel()
            self._timer = self.loop.call_at(when, self._check)

    def _check(self) -> None:
        self._timer = None
        now = self.loop.time()
        unsent = self.transport.get_write_buffer_size()
        if unsent and (self.flow.write_paused or (self.cycle is not None and self.cycle.response_complete)):
            # Nothing is added meanwhile, so what waits to be sent must have shrunk since a look a
            # whole period ago (a timer set for another deadline may come sooner: then look later).
            if not self._unsent:
                self._look_at_unsent(unsent)
            elif now < self._unsent_at + self.limits.header_timeout:
                self._arm(self._unsent_at + self.limits.header_timeout)
            elif self._unsent <= unsent:
                self.transport.abort()
            else:
                self._look_at_unsent(unsent)
            return
        self._unsent = 0
        if self._phase is BUSY or self.transport.is_closing():
            return
        if self._phase is not IDLE and self._holding_back():
            self._deadline = now + self.limits.header_timeout
        if now < self._deadline:
            self._arm(self._deadline)
            return
        if self._phase is HEAD and (self.cycle is None or self.cycle.response_complete):
            self._answer_408(f"the request head did not arrive within {self.limits.header_timeout:g} s")
        elif self._phase is BODY and not self.cycle.response_started:
            self._answer_408(f"the request body stopped: no byte of it for {self.limits.header_timeout:g} s")
        self.transport.close()

    def _holding_back(self) -> bool:
        """Whether the client waits on the gateway rather than the other way round."""
        return self.flow.read_paused or (
            self._phase is BODY and self.cycle.waiting_for_100_continue
        )

    def _answer_408(self, detail: str) -> None:
        body = problem_body(408, "request_timeout", detail).encode()
        head = [b"HTTP/1.1 408 ", TITLES[408].encode(), b"\r\n"]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(), b"\r\n"]
        head += [b"connection: close\r\n\r\n", body]
        self.transport.write(b"".join(head))


def protocol_for(limits: PortLimits) -> type[BoundedHttp]:
    """The HTTP protocol class of one port, for uvicorn.Config(http=...)."""

    class PortHttp(BoundedHttp):
        pass

    PortHttp.limits = limits
    return PortHttp
