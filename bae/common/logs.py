"""stderr log lines of every service: text (default) or one JSON object per line (BAE_LOG_FORMAT=json).

Each line carries the request id of the HTTP request it serves, when there is one
(bae.common.propagation). Fields passed as `extra={"fields": {...}}` (the gateway's access log)
are appended as `key=value` in text and become top-level keys in JSON.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

from bae.common.propagation import request_id

class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if fields:
            line += "".join(f" {key}={value}" for key, value in fields.items() if value is not None)
        elif (current := request_id.get()) is not None:
            line += f" request_id={current}"
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        elif (current := request_id.get()) is not None:
            entry["request_id"] = current
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def install_handler(level: int, log_format: str) -> None:
    """One stderr handler on the root logger, replacing any earlier one."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
