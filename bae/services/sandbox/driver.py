"""What a container driver (docker_driver.py: the Docker daemon) offers the sandbox service, and how it fails."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

from bae.common.errors import Unprocessable
from bae.services.sandbox.output import CappedOutput

LABEL_SANDBOX = "bae.sandbox"
LABEL_SESSION = "bae.session_id"
LABEL_HOST = "bae.host"
# A warm spare (bae/services/sandbox/warm.py): started before any session asked, in place of a session label.
LABEL_SPARE = "bae.spare"
# Tags a command's processes carry so that a kill finds every one (docker_driver.py says how): five
# digits, so that no tag's text begins another's. Unique among this host's commands until the count
# wraps; kept within the 65,536 user ids a remapped (userns-remap) container has, as the tag is one.
TAGS = 65533
_tags = itertools.count()


def new_tag() -> str:
    """The next command's tag."""
    return f"{1 + next(_tags) % TAGS:05d}"


@dataclass(frozen=True)
class ExecOutput:
    # Each capped at the host's output limit; a cut one ends with a marker line.
    stdout: str
    stderr: str
    exit_code: int
    stdout_truncated: bool
    stderr_truncated: bool


@dataclass(frozen=True)
class SandboxInfo:
    sandbox_id: str
    session_id: str
    image: str
    state: str
    # A warm spare: its session (if a session holds it) is in the host's memory, not in a label.
    spare: bool = False


class BackgroundCommand(Protocol):
    """What a driver reads of a background command (commands.Command) and reports to it as the command runs."""

    command_id: str
    sandbox_id: str
    # Tags the command's processes in the sandbox (new_tag), so a kill finds every one of them.
    token: str
    stdout: CappedOutput
    stderr: CappedOutput

    def ended(self, exit_code: int, failure: str | None = None) -> None: ...


class Driver(Protocol):
    async def ping(self) -> bool:
        """Whether the Docker daemon answers (health reporting)."""

    async def prepare(self) -> None:
        """Once per process, before any other call succeeds: remove this host's orphans."""

    async def ensure_image(self, image: str) -> bool:
        """True when the image had to be pulled, False when it was present."""

    async def start(self, session_id: str, image: str) -> str:
        """Start a sandbox; returns its id."""

    async def start_spare(self, image: str) -> str:
        """Start a warm spare: a sandbox like any other, labelled as a spare instead of with a session."""

    async def running(self, sandbox_id: str) -> bool:
        """Whether the sandbox exists and runs."""

    async def exec(self, sandbox_id: str, command: str, timeout: float) -> ExecOutput: ...

    async def spawn(self, command: BackgroundCommand, script: str, stdin: bytes) -> None:
        """Start `sh -c script` as a background command, `stdin` written to it then closed.

        Returns once it runs; its output and end are then reported to `command` from another thread.
        """

    async def kill(self, command: BackgroundCommand) -> None:
        """Kill the command and every process it started."""

    async def stop(self, sandbox_id: str) -> bool:
        """Stop and remove; False when it was already gone."""

    async def list(self) -> list[SandboxInfo]: ...

    async def remove_all(self) -> int:
        """At shutdown: stop and remove every sandbox of this host; returns how many."""

    async def close(self) -> None: ...


class UnsupportedDriver:
    """`apple-container` off macOS: the service starts, and every call fails as unsupported."""

    def __init__(self, name: str) -> None:
        self._failure = Unprocessable(f'the "{name}" sandbox driver is not supported on this host')

    async def ping(self) -> bool:
        return True

    async def prepare(self) -> None:
        return None

    async def ensure_image(self, image: str) -> bool:
        raise self._failure

    async def start(self, session_id: str, image: str) -> str:
        raise self._failure

    async def start_spare(self, image: str) -> str:
        raise self._failure

    async def running(self, sandbox_id: str) -> bool:
        raise self._failure

    async def exec(self, sandbox_id: str, command: str, timeout: float) -> ExecOutput:
        raise self._failure

    async def spawn(self, command: BackgroundCommand, script: str, stdin: bytes) -> None:
        raise self._failure

    async def kill(self, command: BackgroundCommand) -> None:
        raise self._failure

    async def stop(self, sandbox_id: str) -> bool:
        raise self._failure

    async def list(self) -> list[SandboxInfo]:
        raise self._failure

    async def remove_all(self) -> int:
        return 0

    async def close(self) -> None:
        return None
