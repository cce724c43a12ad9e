"""Reading the live streams of a session in tests: NDJSON subscriptions and Server-Sent Events.

`Listener` reads one stream on a thread of its own, so a test can start a turn, watch what
arrives and stop reading at any moment; `sse_records` parses `text/event-stream` lines the way
a browser's EventSource does (a record per blank line; `:` lines are comments).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, Callable, Iterator

import httpx

Record = dict[str, Any]


def sse_records(lines: Iterator[str]) -> Iterator[Record]:
    """Each record of an SSE stream: {"event", "data" (parsed JSON), "id" (None when it had none)};
    a comment line is a record {"comment": text}."""
    parser = _Lines()
    for line in lines:
        yield from parser.records(line)


class Listener:
    """One streaming request read on its own thread (its own event loop) until the stream ends or
    `close()`, which cuts the connection at once, as a client that goes away does.

    `items` holds what came: NDJSON frames (parsed), or SSE records (`sse=True`). `status` and
    `headers` are the response's."""

    def __init__(self, base_url: str, method: str, path: str, *, headers: dict[str, str],
                 json_body: Any = None, params: dict[str, str] | None = None, sse: bool = False) -> None:
        self.items: list[Record] = []
        self.status: int | None = None
        self.headers: httpx.Headers | None = None
        self.error: Exception | None = None
        self._request = (base_url, method, path, headers, json_body, params, sse)
        self._opened = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)
        self._thread.start()
        if not self._opened.wait(30):
            raise TimeoutError(f"{method} {path} did not answer")

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        base_url, method, path, headers, body, params, sse = self._request
        try:
            async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(120, connect=10)) as client:
                async with client.stream(method, path, headers=headers, json=body, params=params) as response:
                    self.status, self.headers = response.status_code, response.headers
                    self._opened.set()
                    lines = _Lines()
                    async for line in response.aiter_lines():
                        if sse:
                            self.items.extend(lines.records(line))
                        elif line.strip():
                            self.items.append(json.loads(line))
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # the server went away
            self.error = exc
        finally:
            self._opened.set()

    @property
    def ended(self) -> bool:
        return not self._thread.is_alive()

    def wait_for(self, predicate: Callable[[list[Record]], bool], timeout: float = 30) -> list[Record]:
        """Until `predicate(items)` holds (items so far); raises TimeoutError with what came."""
        deadline = time.monotonic() + timeout
        while not predicate(list(self.items)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not there after {timeout} s; got {self.items!r}"[:4000])
            time.sleep(0.005)
        return list(self.items)

    def wait_ended(self, timeout: float = 30) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the stream did not end within {timeout} s")

    def close(self) -> None:
        if self._loop is not None and self._task is not None and self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._task.cancel)
            except RuntimeError:
                pass  # the stream ended on its own meanwhile and its loop is closed: nothing to cancel
        self._thread.join(10)

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Lines:
    """sse_records, fed a line at a time."""

    def __init__(self) -> None:
        self._fields: dict[str, str] = {}

    def records(self, line: str) -> list[Record]:
        if line.startswith(":"):
            return [{"comment": line[1:].strip()}]
        if line == "":
            if not self._fields:
                return []
            fields, self._fields = self._fields, {}
            return [{"event": fields.get("event", "message"), "id": fields.get("id"),
                     "data": json.loads(fields.get("data", "null"))}]
        name, _, value = line.partition(":")
        self._fields[name] = value[1:] if value.startswith(" ") else value
        return []


def deltas_of(items: list[Record]) -> list[Record]:
    """The `session.delta` params among NDJSON frames or SSE records, in order."""
    return [item["params"] if "params" in item else item["data"] for item in items
            if item.get("method") == "session.delta" or item.get("event") == "session.delta"]


def events_of(items: list[Record]) -> list[Record]:
    """The events among NDJSON frames or SSE records, in order."""
    return [item["params"] if "params" in item else item["data"] for item in items
            if item.get("method") == "session.event" or item.get("event") == "session.event"]
