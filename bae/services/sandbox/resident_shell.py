"""The resident shell: a shell started once in a sandbox, which runs later commands without a new exec.

An exec costs tens of milliseconds, as the Docker daemon has runc create a process in
the container's namespaces; a command handed to a shell already running there
costs about two. The resident shell runs the POSIX sh script below, on an exec whose stdin
stays attached, so it needs only `sh`, `cat` and `setsid` in the image. It
reads one command per line and runs it as an exec would: `sh -c command` in a
session of its own (so that `kill 0` ends the command, not the shell), stdin
/dev/null, tagged for a kill as an exec is (its login uid and the marker in its
environment, docker_driver.py), and stdout and stderr each
through a pipe that every writer must close before the command counts as ended
(the Docker daemon waits for an exec's streams the same way, so a background child
that keeps them open holds the call). Then it writes the line's nonce at the
end of both streams, with the exit status on stdout. The nonce is new per
command and never in the command's environment: it tells the host where one
command's output ends.

The rest is the host's, as for an exec: the deadline and the kill by tag
(docker_driver.py), and the output cap (CappedOutput). A shell runs one command
at a time. A sandbox gets its first with its first command (a warm spare, when
it is made) and has up to MAX_PER_SANDBOX; see ResidentShells.take. A shell that
died is dropped, and a sandbox's shells go when it stops.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid

from bae.services.sandbox.docker_socket import STDERR, DockerSocket, Frames
from bae.services.sandbox.output import CappedOutput

log = logging.getLogger("bae.sandbox")

# Shells per sandbox: concurrent execs beyond this many go through the Docker daemon.
MAX_PER_SANDBOX = 4
# How long a new shell has to report ready.
START_TIMEOUT = 10.0
# An encoded command longer than this goes through the Docker daemon: the shell reads its line a byte at a time.
MAX_LINE = 16 * 1024
READY = b"ready\n"
# Its first line names it in `ps`. fd 5 and fd 6 keep the shell's own stdout and stderr; the
# shells it starts write their own messages ("Terminated" when a command dies of a signal) to /dev/null, so
# only the command's output reaches the streams. Per command: fd 4 carries the exit status to
# `status`; the command's stdout goes through fd 3 to one cat, its stderr through a pipe to the
# other; a subshell tags itself with its own pid's login uid (docker_driver.py; `$$` would name this
# shell), applies the command's redirections and then becomes it, so that the shell
# waiting for it never writes into the command's pipe; every descriptor the command must not
# hold is closed for it.
SCRIPT = r"""# bae resident shell
for tool in cat setsid; do command -v "$tool" >/dev/null 2>&1 || exit 127; done
# An exec's shell would see the level this one started with.
if [ "${SHLVL:-0}" -gt 1 ] 2>/dev/null; then SHLVL=$((SHLVL - 1)); else unset SHLVL; fi
exec 5>&1 6>&2 2>/dev/null
printf 'ready\n'
while IFS= read -r line; do
  nonce=${line%% *}; rest=${line#* }; token=${rest%% *}
  command=$(printf '%bx' "${rest#* }"); command=${command%x}
  status=$( { { { (export BAE_EXEC_ID="$token"; read -r pid rest </proc/self/stat; echo "$token" >"/proc/$pid/loginuid"
    exec setsid sh -c "$command" </dev/null 2>&1 >&3 3>&- 4>&- 5>&- 6>&-)
    echo $? >&4; } | cat >&6 3>&- 4>&- 5>&- 6>&-; } 3>&1 | cat >&5 4>&- 5>&- 6>&-; } 4>&1 )
  printf '%s %s\n' "$nonce" "$status"
  printf '%s\n' "$nonce" >&6
done
"""


class ShellLost(Exception):
    """The resident shell ended before its command's end was reported."""


# Bytes a command line carries escaped: all but printable ASCII, and the backslash.
_ESCAPED = re.compile(rb"[^\x20-\x5b\x5d-\x7e]")


def encode(command: str) -> bytes | None:
    """The command as one line the shell's `printf %b` turns back into it; None when a shell cannot take it.

    A backslash, a control byte or a non-ASCII byte becomes an octal escape (`\\0ooo`).
    """
    data = command.encode()
    if b"\0" in data:  # a shell variable cannot hold it (nor can an exec's argv)
        return None
    line = _ESCAPED.sub(lambda match: b"\\0%03o" % match.group()[0], data)
    return None if len(line) > MAX_LINE else line


class _UntilNonce:
    """One stream of a command's output: passed on until the nonce, then the shell's trailer after it."""

    def __init__(self, output: CappedOutput, nonce: bytes) -> None:
        self._output = output
        self._nonce = nonce
        self._pending = bytearray()  # may end with the start of the nonce
        self.trailer: bytearray | None = None

    def feed(self, data: bytes) -> None:
        if self.trailer is not None:
            self.trailer += data
            return
        self._pending += data
        found = self._pending.find(self._nonce)
        if found >= 0:
            self._output.append(bytes(self._pending[:found]))
            self.trailer = self._pending[found + len(self._nonce):]
            self._pending.clear()
            return
        keep = len(self._nonce) - 1
        if len(self._pending) > keep:
            self._output.append(bytes(self._pending[:-keep]))
            del self._pending[:-keep]

    @property
    def ended(self) -> bool:
        return self.trailer is not None and b"\n" in self.trailer

    def flush(self) -> None:
        """The shell is gone before the nonce: what was held back was output after all."""
        self._output.append(bytes(self._pending))
        self._pending.clear()


class ResidentShell:
    def __init__(self, sandbox_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.sandbox_id = sandbox_id
        self._reader = reader
        self._writer = writer
        self._frames = Frames(reader)

    @property
    def alive(self) -> bool:
        return not self._reader.at_eof() and not self._writer.is_closing()

    async def ready(self) -> None:
        """Once the shell runs the script; ShellLost when it cannot (no `sh`, `cat` or `setsid` in the image)."""
        said = b""
        while len(said) < len(READY):
            frame = await self._frames.next()
            if frame is None:
                raise ShellLost("the sandbox's image has no sh, cat or setsid")
            stream, piece = frame
            if stream != STDERR:
                said += piece
        if said != READY:
            raise ShellLost(f"the shell started with {said[:80]!r}")

    async def run(self, line: bytes, token: str, stdout: CappedOutput, stderr: CappedOutput) -> int:
        """Run one encoded command to its end: its output into the two streams; returns its exit code."""
        nonce = uuid.uuid4().hex.encode()
        out, err = _UntilNonce(stdout, nonce), _UntilNonce(stderr, nonce)
        finished = False
        try:
            self._writer.write(b"%s %s %s\n" % (nonce, token.encode(), line))
            await self._writer.drain()
            while not (out.ended and err.ended):
                frame = await self._frames.next()
                if frame is None:
                    raise ShellLost("the resident shell ended")
                stream, piece = frame
                (err if stream == STDERR else out).feed(piece)
            finished = True
        except (ConnectionError, OSError) as exc:
            raise ShellLost(f"lost the shell: {exc}") from None
        finally:
            if not finished:  # cancelled or lost part-way: its stream is no longer in step
                out.flush()
                err.flush()
                self.close()
        status = bytes(out.trailer or b"").split(b"\n", 1)[0].strip()
        return int(status) if status.isdigit() else -1

    def close(self) -> None:
        self._writer.close()


async def start_shell(docker_socket: DockerSocket, sandbox_id: str) -> ResidentShell:
    exec_id = await docker_socket.create_exec(sandbox_id, ["sh", "-c", SCRIPT], [], stdin=True)
    reader, writer = await docker_socket.start_attached(exec_id)
    shell = ResidentShell(sandbox_id, reader, writer)
    try:
        await shell.ready()
    except BaseException:
        shell.close()
        raise
    return shell


class ResidentShells:
    """Each sandbox's idle shells: an exec takes one, and gives it back once its command ended."""

    def __init__(self, docker_socket: DockerSocket) -> None:
        self._docker_socket = docker_socket
        self._idle: dict[str, list[ResidentShell]] = {}
        # Shells per sandbox, idle, busy or starting.
        self._count: dict[str, int] = {}
        # Sandboxes where a shell failed to start: every exec of theirs goes through the Docker daemon.
        self._unable: set[str] = set()
        # The shell starting in a sandbox: one at a time each.
        self._booting: dict[str, asyncio.Task[None]] = {}

    async def take(self, sandbox_id: str) -> ResidentShell | None:
        """An idle shell of the sandbox, or None when the command had better be an exec of its own.

        A sandbox's first shell starts with its first command, which waits for it: that costs
        about one exec, and a sandbox that only runs background commands never has one. A shell
        that is starting is waited for too, as an exec beside its start would slow both. With every
        shell busy, another starts in the background and this command is an exec.
        """
        if (shell := self._idle_one(sandbox_id)) is not None:
            return shell
        if sandbox_id not in self._count:
            self.grow(sandbox_id)
        if (booting := self._booting.get(sandbox_id)) is not None:
            await asyncio.wait([booting])
            if (shell := self._idle_one(sandbox_id)) is not None:
                return shell
        self.grow(sandbox_id)
        return None

    def _idle_one(self, sandbox_id: str) -> ResidentShell | None:
        idle = self._idle.get(sandbox_id, [])
        while idle:
            shell = idle.pop()
            if shell.alive:
                return shell
            self.drop(shell)
        return None

    def give_back(self, shell: ResidentShell) -> None:
        if shell.alive and shell.sandbox_id in self._count:
            self._idle.setdefault(shell.sandbox_id, []).append(shell)
        else:
            self.drop(shell)

    def drop(self, shell: ResidentShell) -> None:
        shell.close()
        self._forget_one(shell.sandbox_id)

    def grow(self, sandbox_id: str) -> None:
        """Start one more shell in the background, unless one is starting or the sandbox has its share."""
        count = self._count.get(sandbox_id, 0)
        if sandbox_id in self._unable or sandbox_id in self._booting or count >= MAX_PER_SANDBOX:
            return
        self._count[sandbox_id] = count + 1
        self._booting[sandbox_id] = asyncio.create_task(self._start(sandbox_id), name=f"shell-{sandbox_id[:12]}")

    async def _start(self, sandbox_id: str) -> None:
        try:
            shell = await asyncio.wait_for(start_shell(self._docker_socket, sandbox_id), START_TIMEOUT)
        except Exception as exc:  # ShellLost, DockerError, OSError, TimeoutError or worse: no shell
            if sandbox_id in self._count:  # not stopped meanwhile
                # Whatever the cause (no shell, a full pids limit, a sandbox gone), the Docker daemon still runs every exec.
                log.info("sandbox %s runs each command as an exec: no resident shell (%s)", sandbox_id[:12], exc)
                self._unable.add(sandbox_id)
                self._forget_one(sandbox_id)
            return
        finally:
            self._booting.pop(sandbox_id, None)
        self.give_back(shell)

    def _forget_one(self, sandbox_id: str) -> None:
        count = self._count.get(sandbox_id)
        if count is None:
            return
        if count > 1:
            self._count[sandbox_id] = count - 1
        else:
            del self._count[sandbox_id]
            self._idle.pop(sandbox_id, None)

    def forget(self, sandbox_id: str) -> None:
        """The sandbox stopped: close its idle shells; a busy one closes when its command ends."""
        for shell in self._idle.pop(sandbox_id, []):
            shell.close()
        self._count.pop(sandbox_id, None)
        self._unable.discard(sandbox_id)

    def close(self) -> None:
        for task in self._booting.values():
            task.cancel()
        for shells in self._idle.values():
            for shell in shells:
                shell.close()
        self._idle.clear()
        self._count.clear()
