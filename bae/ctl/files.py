"""Files baectl writes: always with the mode asked for, even over an existing file."""

from __future__ import annotations

import os


def write_file(path: str, content: str, mode: int) -> None:
    """Raises OSError; the mode is forced with fchmod because O_CREAT's mode only applies to new files."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, content.encode())
    finally:
        os.close(fd)
