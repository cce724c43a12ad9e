"""stderr log lines of every service: text (default) or one JSON object per line (BAE_LOG_FORMAT=json).

Each line carries the request id of the HTTP request it serves, when there is one
(bae.common.propagation). Fields passed as `extra={"fields": {...}}` (the gateway's access log)
are appended as `key=value` in text and become top-level keys in JSON.

A record is one line whatever it carries: control characters in the message and in every field
(a path parameter with `%0A`, a terminal escape) are written escaped (`\\n`, `\\x1b`, `\\u2028`),
in both formats, so client input can neither forge a line nor reach a terminal raw. In text, a
field value with a space, `"` or `=` is quoted, and a traceback's lines are indented under the
record's line, so no line that follows a record can pass for one.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone

from bae.common.propagation import request_id

# C0 and C1 controls, DEL, the Unicode line and paragraph separators, and lone surrogates.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_NEEDS_QUOTES = re.compile(r'[\s"=]')


def _escaped_char(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def escape_controls(text: str) -> str:
    """`text` with every control character written as its escape (a plain text is returned as is)."""
    return _CONTROL.sub(_escaped_char, text) if _CONTROL.search(text) else text


def _logged(value: object) -> object:
    return escape_controls(value) if isinstance(value, str) else value


def _text_field(value: object) -> str:
    text = escape_controls(str(value))
    return '"' + text.replace('"', '\\"') + '"' if not text or _NEEDS_QUOTES.search(text) else text


def _indented(text: str) -> str:
    return "\n".join("    " + escape_controls(line) for line in text.splitlines())


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(stack_info)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        # The fields go at the end of the record's first line, before any traceback.
        first, newline, rest = line.partition("\n")
        fields = getattr(record, "fields", None)
        if fields:
            first += "".join(f" {key}={_text_field(value)}" for key, value in fields.items() if value is not None)
        elif (current := request_id.get()) is not None:
            first += f" request_id={_text_field(current)}"
        return first + newline + rest


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": escape_controls(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if fields:
            entry.update((key, _logged(value)) for key, value in fields.items())
        elif (current := request_id.get()) is not None:
            entry["request_id"] = escape_controls(current)
        if record.exc_info:
            # Its lines stay lines (JSON escapes them); any other control is escaped.
            entry["exception"] = "\n".join(map(escape_controls, self.formatException(record.exc_info).splitlines()))
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
