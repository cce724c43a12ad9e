"""The exec hot path straight over the Docker daemon's unix socket, on the event loop.

An exec is three requests to the Docker daemon whatever the client: create it, start it and
read its output until it closes, then inspect it for the exit code. Through the
docker SDK each is a thread hop plus requests/urllib3 (about a millisecond of
Python per request on a loaded host); here each is one HTTP/1.1 exchange on a
unix-socket connection, written and parsed in the event loop. Connections are
kept alive and reused (the start of an exec consumes one: the Docker daemon closes it
when the output ends); a reused one the daemon closed while it sat idle is
replaced and the request sent again, as it never reached the daemon.

Only for a Docker daemon on a unix socket (the default, and `DOCKER_HOST=unix://...`);
any other daemon address uses the SDK path.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
from typing import Any, Mapping

from docker.constants import IS_WINDOWS_PLATFORM
from docker.utils import parse_host

from bae.services.sandbox.output import CappedOutput

UNIX_SCHEME = "http+unix://"
# Bounds on what the Docker daemon sends back outside an output stream: a JSON document, a header line.
MAX_BODY = 4 * 1024 * 1024
MAX_HEADER_LINE = 64 * 1024
# Idle keep-alive connections kept for reuse; more concurrent requests open more, closed after use.
MAX_IDLE = 8
STDERR = 2


class DockerError(Exception):
    """The Docker daemon answered with an HTTP error; `explanation` is its message."""

    def __init__(self, status: int, explanation: str) -> None:
        super().__init__(f"{status} {explanation}")
        self.status = status
        self.explanation = explanation


def unix_socket_path(environ: Mapping[str, str] | None = None) -> str | None:
    """The Docker daemon's socket path as the SDK's from_env resolves it; None when it is not a unix socket."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    tls = env.get("DOCKER_TLS_VERIFY", "") != ""
    host = parse_host(env.get("DOCKER_HOST") or None, IS_WINDOWS_PLATFORM, tls=tls)
    return host[len(UNIX_SCHEME):] if host.startswith(UNIX_SCHEME) else None


class DockerSocket:
    def __init__(self, path: str, api_version: str) -> None:
        self._path = path
        self._prefix = f"/v{api_version}"
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def _exchange(
        self, method: str, path: str, body: dict[str, Any] | None, upgrade: bool = False
    ) -> tuple[int, dict[str, str], asyncio.StreamReader, asyncio.StreamWriter]:
        """Send one request; returns (status, headers, reader, writer), the connection now the caller's.

        `upgrade`: ask for the connection itself (an exec's attached stdin), as the docker CLI does.
        """
        data = b"" if body is None else json.dumps(body).encode()
        hijack = "Connection: Upgrade\r\nUpgrade: tcp\r\n" if upgrade else ""
        request = (
            f"{method} {self._prefix}{path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n{hijack}"
            f"Content-Length: {len(data)}\r\n\r\n".encode() + data
        )
        while True:
            reused = bool(self._idle)
            if reused:
                reader, writer = self._idle.pop()
            else:
                reader, writer = await asyncio.open_unix_connection(self._path, limit=MAX_HEADER_LINE)
            try:
                writer.write(request)
                try:
                    status_line = await reader.readline()
                except ConnectionResetError:
                    if not reused:
                        raise
                    status_line = b""
                if not status_line and reused:  # closed by the daemon while idle: send it again
                    writer.close()
                    continue
                parts = status_line.split(None, 2)
                if len(parts) < 2 or not parts[1].isdigit():
                    raise ConnectionError(f"the engine sent no HTTP status line: {status_line[:80]!r}")
                headers: dict[str, str] = {}
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                return int(parts[1]), headers, reader, writer
            except BaseException:
                writer.close()
                raise

    def _release(self, headers: dict[str, str], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """After a whole answer was read: keep the connection for the next request, or close it."""
        framed = "content-length" in headers or headers.get("transfer-encoding", "").lower() == "chunked"
        if framed and headers.get("connection", "").lower() != "close" and len(self._idle) < MAX_IDLE \
                and not reader.at_eof():
            self._idle.append((reader, writer))
        else:
            writer.close()

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()

    @staticmethod
    async def _body(headers: dict[str, str], reader: asyncio.StreamReader) -> bytes:
        if "content-length" in headers:
            length = int(headers["content-length"])
            if length > MAX_BODY:
                raise ConnectionError(f"the engine's answer is larger than {MAX_BODY} bytes")
            return await reader.readexactly(length)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
                if len(body) + size > MAX_BODY:
                    raise ConnectionError(f"the engine's answer is larger than {MAX_BODY} bytes")
                body += await reader.readexactly(size)
                await reader.readline()
            await reader.readline()  # the blank line after the last chunk (no trailers)
            return bytes(body)
        return await reader.read(MAX_BODY)

    async def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        status, headers, reader, writer = await self._exchange(method, path, body)
        try:
            data = await self._body(headers, reader)
        except BaseException:
            writer.close()
            raise
        self._release(headers, reader, writer)
        document = json.loads(data) if data.strip() else {}
        if status >= 400:
            message = document.get("message") if isinstance(document, dict) else None
            raise DockerError(status, str(message or data[:200].decode("utf-8", "replace")))
        return document

    async def create_exec(self, container_id: str, argv: list[str], environment: list[str], stdin: bool = False) -> str:
        created = await self._json("POST", f"/containers/{container_id}/exec", {
            "Cmd": argv, "Env": environment, "AttachStdin": stdin, "AttachStdout": True, "AttachStderr": True,
            "Tty": False,
        })
        return str(created["Id"])

    async def _start(self, exec_id: str, upgrade: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Start the exec; the connection then carries its multiplexed output (and its stdin, when attached)."""
        status, headers, reader, writer = await self._exchange(
            "POST", f"/exec/{exec_id}/start", {"Detach": False, "Tty": False}, upgrade
        )
        if status >= 400:
            try:
                data = await self._body(headers, reader)
            finally:
                writer.close()
            try:
                message = json.loads(data).get("message")
            except (ValueError, AttributeError):
                message = None
            raise DockerError(status, str(message or data[:200].decode("utf-8", "replace")))
        return reader, writer

    async def run_exec(self, exec_id: str, stdout: CappedOutput, stderr: CappedOutput) -> None:
        """Start the exec and read its multiplexed output until the Docker daemon closes it."""
        reader, writer = await self._start(exec_id, upgrade=False)
        try:
            frames = Frames(reader)
            while (frame := await frames.next()) is not None:
                stream, piece = frame
                (stderr if stream == STDERR else stdout).append(piece)
        finally:
            writer.close()

    async def start_attached(self, exec_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Start an exec created with `stdin`: what is written goes to its stdin, and its output is read back."""
        return await self._start(exec_id, upgrade=True)

    async def inspect_exec(self, exec_id: str) -> dict[str, Any]:
        return await self._json("GET", f"/exec/{exec_id}/json")


class Frames:
    """An exec's multiplexed output: an 8-byte header (stream, length), then that many bytes, repeated.

    A large frame is handed on in pieces, never held whole.
    """

    PIECE = 65536

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._stream = 0
        self._left = 0

    async def next(self) -> tuple[int, bytes] | None:
        """The next piece as (stream, bytes); None once the Docker daemon closed the output between frames."""
        while not self._left:
            try:
                header = await self._reader.readexactly(8)
            except asyncio.IncompleteReadError as ended:
                if ended.partial:
                    raise ConnectionError("the engine cut an output frame short") from None
                return None
            self._stream = header[0]
            (self._left,) = struct.unpack(">I", header[4:])
        piece = await self._reader.read(min(self._left, self.PIECE))
        if not piece:
            raise ConnectionError("the engine cut an output frame short")
        self._left -= len(piece)
        return self._stream, piece
