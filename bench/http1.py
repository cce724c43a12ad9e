"""A lean HTTP/1.1 client for the load generator: one kept-alive connection, nothing else.

The benchmarks run the load generator on the same cores as the stack. httpx spends about
0.5 ms of CPU per request, as much as the gateway and the session service together spend
on an authenticated GET, so with it the figures measure the client as much as the server.
This client parses a response head and a Content-Length or chunked body and no more: no
pooling, redirects, cookies or decompression (the gateway sends none of those).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import re
import time
from typing import AsyncIterator
from urllib.parse import urlsplit

from bae.common.jsontext import dump


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self._reader = reader
        self._writer = writer
        self._host = host

    @classmethod
    async def open(cls, base_url: str) -> "Connection":
        parts = urlsplit(base_url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        return cls(reader, writer, parts.netloc)

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()

    async def request(self, method: str, path: str, *, token: str | None = None, body: object = None) -> tuple[int, bytes]:
        """The status and the whole body."""
        status, chunks = await self._exchange(method, path, token, body)
        return status, b"".join([chunk async for chunk in chunks])

    async def lines(self, method: str, path: str, *, token: str | None = None, body: object = None) -> AsyncIterator[bytes]:
        """Once the response head is in: each line of the body as it arrives (an NDJSON stream)."""
        _, chunks = await self._exchange(method, path, token, body)
        return _lines(chunks)

    async def _exchange(
        self, method: str, path: str, token: str | None, body: object
    ) -> tuple[int, AsyncIterator[bytes]]:
        self._writer.write(_request(method, path, self._host, token, body))
        response_head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = response_head[:-4].split(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if headers.get(b"transfer-encoding") == b"chunked":
            return status, self._chunked()
        return status, self._sized(int(headers.get(b"content-length", b"0")))

    async def _sized(self, length: int) -> AsyncIterator[bytes]:
        if length:
            yield await self._reader.readexactly(length)

    async def _chunked(self) -> AsyncIterator[bytes]:
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")  # no trailers are sent: the empty line
                return
            chunk = await self._reader.readexactly(size + 2)
            yield chunk[:-2]


class StampedStream(asyncio.Protocol):
    """One streaming request whose response bytes are stamped the moment the event loop reads
    them, and parsed only afterwards (frames()).

    With many streams in one load generator, parsing each frame as it comes puts every stream's
    Python work in one queue: the last stream's stamp would say more about the client than about
    when the server sent it.
    """

    FRAME = re.compile(rb'\{"jsonrpc"[^\n]*')
    END = b"0\r\n\r\n"  # the end of a chunked body

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._stamps: list[float] = []
        self._transport: asyncio.Transport | None = None
        self._host = ""
        self.ended = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(cls, base_url: str, path: str, *, token: str, body: object) -> "StampedStream":
        stream = await cls.connect(base_url)
        stream.send(path, token=token, body=body)
        return stream

    @classmethod
    async def connect(cls, base_url: str) -> "StampedStream":
        """A connection with no request on it yet: send() one, and once it `ended`, the next."""
        parts = urlsplit(base_url)
        _, stream = await asyncio.get_running_loop().create_connection(cls, parts.hostname, parts.port)
        stream._host = parts.netloc
        return stream

    def send(self, path: str, *, token: str, body: object) -> float:
        """POST `body` on this kept-alive connection, forgetting what the previous response brought;
        the time it was written, on the same clock as the stamps."""
        assert self._transport is not None
        self._chunks, self._stamps = [], []
        if self.ended.done():
            self.ended = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        self._transport.write(_request("POST", path, self._host, token, body))
        return started

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._stamps.append(time.perf_counter())
        self._chunks.append(data)
        if data.endswith(self.END) and not self.ended.done():
            self.ended.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def has_read(self, marker: bytes) -> bool:
        """Whether the bytes read last hold `marker` (looked for in the last two reads, in case it
        was cut between them): cheap enough to poll many streams with."""
        return marker in b"".join(self._chunks[-2:])

    @property
    def last_read(self) -> float:
        """When the response's last bytes were read."""
        return self._stamps[-1]

    def frames(self) -> list[tuple[float, dict]]:
        """Each JSON-RPC frame received, with the time the read that completed it happened."""
        ends, offset = [], 0
        for chunk in self._chunks:
            offset += len(chunk)
            ends.append(offset)
        received = b"".join(self._chunks)
        return [
            (self._stamps[bisect.bisect_left(ends, match.end())], json.loads(match.group()))
            for match in self.FRAME.finditer(received)
        ]


def _request(method: str, path: str, host: str, token: str | None, body: object) -> bytes:
    """One HTTP/1.1 request: head, and the body as JSON when there is one."""
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    payload = b"" if body is None else dump(body).encode()
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    return head.encode() + b"\r\n" + payload


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line:
                yield line
    if pending:
        yield pending


async def rpc(connection: Connection, session_id: str, session_key: str, method: str, params: dict | None = None) -> dict:
    """One JSON-RPC call on the session's /rpc route; its result (the last frame must carry one)."""
    return (await timed_rpc(connection, session_id, session_key, method, params))[1]


async def timed_rpc(
    connection: Connection, session_id: str, session_key: str, method: str, params: dict | None = None
) -> tuple[float, dict]:
    """As rpc, with the seconds from sending the call until the whole response was in. Parsing it
    comes after: that is the client's work, and a turn's result on a long session carries its
    provider request, whole history included (about 60 KB at 2,000 events)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    started = time.perf_counter()
    status, text = await connection.request(
        "POST", f"/api/v1/sessions/{session_id}/rpc", token=session_key, body=body
    )
    elapsed = time.perf_counter() - started
    last = json.loads(text.splitlines()[-1])
    assert "result" in last, (status, last)
    return elapsed, last["result"]
