"""One output stream of a command, kept up to a limit and counted past it.

A command may print far more than anyone will read; only the first `limit`
bytes are kept, so the host's memory stays flat whatever the volume.
Appends come from the thread that reads the Docker daemon's stream, reads from the
event loop, hence the lock.
"""

from __future__ import annotations

import threading

from bae.common.truncation import marker, utf8_prefix


class CappedOutput:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept = bytearray()
        self._total = 0
        self._lock = threading.Lock()

    def append(self, data: bytes) -> None:
        with self._lock:
            room = self.limit - len(self._kept)
            if room > 0:
                self._kept += data[:room]
            self._total += len(data)

    @property
    def truncated(self) -> bool:
        return self._total > self.limit

    def read(self, offset: int = 0) -> bytes:
        """The kept bytes from `offset` on (empty past the end)."""
        with self._lock:
            return bytes(self._kept[offset:])

    def text(self) -> str:
        """The kept bytes as text; a cut stream is cut back to a UTF-8 boundary and ends with a marker line."""
        with self._lock:
            kept, total = bytes(self._kept), self._total
        if total <= self.limit:
            return kept.decode("utf-8", "replace")
        kept = utf8_prefix(kept)
        omitted = total - len(kept)
        return kept.decode("utf-8", "replace") + marker(omitted)
