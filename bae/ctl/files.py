"""Files baectl writes and reads: always with the mode asked for, never through a symbolic link.

Each file is written whole to a new file beside it and renamed over the target, so a reader never
sees half of it, the mode holds from the first byte (a file of secrets is never readable by others,
even briefly), and a symbolic link planted at the target is refused, neither followed nor replaced.
"""

from __future__ import annotations

import errno
import os

SYMLINK = "it is a symbolic link; refusing to {} through it"


def write_file(path: str, content: str, mode: int) -> None:
    """Raises OSError; its strerror says why."""
    if os.path.islink(path):
        raise OSError(errno.ELOOP, SYMLINK.format("write"))
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            os.fchmod(file.fileno(), mode)  # O_CREAT's mode passed through the umask
            file.write(content)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def read_file(path: str) -> str:
    """A file's text; raises OSError, also for a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, SYMLINK.format("read")) from None
        raise
    with os.fdopen(fd, encoding="utf-8") as file:
        return file.read()
