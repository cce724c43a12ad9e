"""Output cut to a byte limit, the same wherever it is cut (sandbox commands, MCP results): at a
UTF-8 character boundary, ended by one marker line that counts what was left out."""

from __future__ import annotations


def utf8_prefix(data: bytes) -> bytes:
    """`data` without a UTF-8 sequence cut short at its end."""
    # A sequence is at most 4 bytes: only the last 3 can start an incomplete one.
    for back in range(1, min(4, len(data) + 1)):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: keep looking for the lead byte
            continue
        length = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return data if back >= length else data[:-back]
    return data


def marker(omitted: int) -> str:
    """The line that ends cut output."""
    return f"\n[output truncated: {omitted} byte{'' if omitted == 1 else 's'} omitted]\n"
