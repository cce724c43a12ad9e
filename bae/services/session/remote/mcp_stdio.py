"""The stdio transport under the MCP SDK's ClientSession, reading within `BAE_MCP_OUTPUT_LIMIT`.

The SDK's own stdio transport joins each line of the server's output whole before it
parses it, so one answer of 40 MB costs the session service hundreds of megabytes and
seconds of its event loop. This one reads the child's stdout in chunks and hands each
line to `mcp_output.LineReader`, which reads an over-long line as it streams and keeps
at most the limit of it. Otherwise it does what the SDK's does: the child runs in a new
session (its own process group), newline-delimited JSON-RPC both ways, its stderr where
the caller says; closing it closes stdin, waits, then SIGTERMs and SIGKILLs the group,
every wait bounded and shielded from cancellation so a child never outlives the session.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TextIO

import anyio
import anyio.lowlevel
import mcp_types as types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from bae.services.session.remote.mcp_output import LineReader, Shortener, rebuild

log = logging.getLogger("bae.session.mcp")

# Grace for the child to exit on its own after its stdin closes, then after SIGTERM (as the SDK).
EXIT_GRACE_SECONDS = 2.0
KILL_GRACE_SECONDS = 2.0
# Time for the writer to flush messages already accepted before stdin closes.
FLUSH_SECONDS = 0.5
EXIT_POLL_SECONDS = 0.01
READ_CHUNK = 64 * 1024
CANCELLED = "notifications/cancelled"


@dataclass
class StdioChild:
    """What an open stdio transport gives its session: the streams, and the child's PID."""

    read: MemoryObjectReceiveStream[SessionMessage | Exception]
    write: MemoryObjectSendStream[SessionMessage]
    pid: int


@contextlib.asynccontextmanager
async def bounded_stdio_client(
    command: str, args: list[str], env: dict[str, str], *, limit: int, errlog: TextIO
) -> AsyncIterator[StdioChild]:
    """Spawn the server and connect to it; raises OSError when it cannot be spawned."""
    process = await anyio.open_process([command, *args], env=env, stderr=errlog, start_new_session=True)
    # No await from here until the task group is entered: a cancellation would leak the child.
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    # The requests sent and not answered yet, by id: what an answer over the limit may answer.
    waiting: dict[int | str, str] = {}
    writer_done = anyio.Event()
    shutting_down = False

    async def stdout_reader() -> None:
        assert process.stdout is not None
        lines = LineReader(limit)
        try:
            async with read_writer:
                while True:
                    chunk = await process.stdout.receive(READ_CHUNK)
                    # A read that finds data waiting does not yield: a child writing fast would
                    # keep the event loop from everything else until its line ends.
                    await anyio.lowlevel.checkpoint()
                    for line in lines.feed(chunk):
                        for message in _messages(line, waiting):
                            await read_writer.send(message)
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            pass
        except anyio.BrokenResourceError:
            await _drain(process)  # the session is gone: a child blocked on a full pipe could not exit
        except OSError:
            if not shutting_down:
                log.exception("reading the MCP server's stdout failed")

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for session_message in write_reader:
                    message = session_message.message
                    if isinstance(message, types.JSONRPCRequest):
                        waiting[message.id] = message.method
                    elif isinstance(message, types.JSONRPCNotification) and message.method == CANCELLED:
                        cancelled = (message.params or {}).get("requestId")
                        if isinstance(cancelled, (int, str)):
                            waiting.pop(cancelled, None)
                    data = message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The child may live on without reading: end the session's reads, or a request would hang.
            await read_writer.aclose()
        finally:
            writer_done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(stdout_reader)
        group.start_soon(stdin_writer)
        try:
            yield StdioChild(read_stream, write_stream, process.pid)
        finally:
            shutting_down = True
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(FLUSH_SECONDS):
                    await writer_done.wait()
                await _stop(process)
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()
            group.cancel_scope.cancel()


def _messages(line: bytes | Shortener, waiting: dict[int | str, str]) -> list[SessionMessage | Exception]:
    if isinstance(line, Shortener):
        messages = list(rebuild(line, waiting))
    elif not line.strip():
        return []
    else:
        try:
            messages = [SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))]
        except ValueError as exc:
            log.warning("MCP server wrote a line that is not JSON-RPC error=%.200s", exc)
            return [exc]
    for message in messages:
        if isinstance(message, SessionMessage) and isinstance(message.message, (types.JSONRPCResponse, types.JSONRPCError)):
            if message.message.id is not None:
                waiting.pop(message.message.id, None)
    return messages


async def _drain(process: Process) -> None:
    """Read and drop the rest of the child's output until it closes."""
    assert process.stdout is not None
    with anyio.CancelScope(shield=True), contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        while True:
            await process.stdout.receive(READ_CHUNK)


async def _stop(process: Process) -> None:
    """Close stdin, give the child time to exit, then end its whole process group."""
    assert process.stdin is not None and process.stdout is not None
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, EXIT_GRACE_SECONDS):
        await terminate_posix_process_tree(process, KILL_GRACE_SECONDS)
        if not await _exited(process, KILL_GRACE_SECONDS):
            log.warning("MCP server process %d is still alive after SIGKILL; abandoning it", process.pid)
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()
    if process.returncode is not None:
        # Releases the child's transport; bounded, as a grandchild may hold the pipes open.
        with anyio.move_on_after(KILL_GRACE_SECONDS):
            await process.aclose()


async def _exited(process: Process, seconds: float) -> bool:
    # Not process.wait(): it also waits for the pipes to close, which a grandchild may hold.
    with anyio.move_on_after(seconds):
        while process.returncode is None:  # noqa: ASYNC110  # no event tells of the exit
            await anyio.sleep(EXIT_POLL_SECONDS)
        return True
    return False
