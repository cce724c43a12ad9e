"""Output cut to a byte limit, the same wherever it is cut (sandbox commands, MCP results): at a
UTF-8 character boundary, ended by one marker line that counts what was left out."""

from __future__ import annotations

import codecs


def utf8_prefix(data: bytes) -> bytes:
    """`data` without a UTF-8 sequence cut short at its end."""
    # A sequence is at most 4 bytes, so one cut short starts within the last 3: the incremental
    # decoder holds back exactly that start, complete sequences and stray bytes before it pass.
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data[-3:])
    pending, _ = decoder.getstate()
    return data[: len(data) - len(pending)]


def marker(omitted: int) -> str:
    """The line that ends cut output."""
    return f"\n[output truncated: {omitted} byte{'' if omitted == 1 else 's'} omitted]\n"
