"""The docker driver: sandboxes are containers of the local Docker daemon, through the docker SDK.

The SDK is synchronous, so every call runs on a dedicated thread pool and the
event loop never blocks; an Exec, the hot path, goes straight over the Docker daemon's
unix socket from the event loop instead (docker_socket.py) when it has one. Two clients: `_control` has a bounded read timeout
for quick calls; `_long` has none, for exec output that may be silent for
minutes (our own deadline bounds it instead). A command's output is read from
the exec's attached socket as it comes and kept up to the output limit, so a
command printing gigabytes costs the host no more memory than one printing a line.
Each background command has a thread of its own that follows it to its end.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Coroutine, TypeAlias, TypeVar

import docker
import docker.errors
import requests
from docker.utils.socket import STDERR, frames_iter

from bae.common.errors import BaeError, DeadlineExceeded, Internal, NotFound, Unavailable, Unprocessable
from bae.services.sandbox.config import SandboxConfig
from bae.services.sandbox.driver import (
    LABEL_HOST,
    LABEL_SANDBOX,
    LABEL_SESSION,
    LABEL_SPARE,
    BackgroundCommand,
    ExecOutput,
    SandboxInfo,
    new_tag,
)
from bae.services.sandbox.docker_socket import DockerError, DockerSocket, unix_socket_path
from bae.services.sandbox.output import CappedOutput
from bae.services.sandbox.resident_shell import ResidentShell, ResidentShells, ShellLost, encode

log = logging.getLogger("bae.sandbox")

# The docker SDK ships no type stubs, so to mypy these are Any; the names say what the values are.
DockerApi: TypeAlias = docker.APIClient  # the low-level client of a docker.DockerClient (`.api`)
Attached: TypeAlias = Any  # an exec's attached stream: a socket, or the SDK's SocketIO around one
DockerJson = dict[str, Any]  # an object of the Docker Engine API's JSON

CONTROL_TIMEOUT = 30
PING_TIMEOUT = 5.0
# The long-running command of every sandbox; exec'd commands run beside it.
KEEPALIVE_COMMAND = ["sleep", "infinity"]
# Every sandbox drops all capabilities but these, which a shell workload as root needs to
# manage its own files and processes (docs/security.md says why each stays and what goes).
SHELL_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE")
# With a read-only root filesystem: the writable places, and the directory commands start in.
WORKSPACE = "/workspace"
TMPFS_OPTIONS = "rw,nosuid,nodev,mode=1777"
T = TypeVar("T")


def _unreachable(exc: Exception) -> Unavailable:
    return Unavailable(f"docker engine is not reachable: {exc}")


def _explain(exc: docker.errors.APIError) -> str:
    return str(exc.explanation or exc)


# Every command's processes carry a tag they cannot drop, by which a kill (its timeout, KillCommand, an
# Exec whose caller went away) finds all of them inside the container, wherever the sandbox host runs
# (its own container included, where host PIDs would not be visible): the audit login uid,
# /proc/<pid>/loginuid. A process whose login uid is unset may set its own, once, without privileges;
# changing it after that needs CAP_AUDIT_CONTROL, which no sandbox has. Every child inherits it, whatever
# it does: `env -i`, setsid, a double fork that leaves it to PID 1, exec, setuid. So the shell that becomes a
# command first sets its own to the command's tag (EXEC_SCRIPT; the resident shell's subshell likewise),
# named by its pid (Docker's AppArmor profile refuses writes under /proc/self); the resident shell
# itself and the host's kills never set theirs.
# What else was weighed: a PID namespace per command (`unshare --pid`) needs CAP_SYS_ADMIN, and Docker's
# seccomp profile refuses it without; a cgroup per command needs the container's cgroup tree writable,
# and a process that can write it can move itself out; a process group or session is left with setsid,
# the environment with `env -i`, and the parent links by a process whose parent exited; a container per
# command costs a container start each and would not share the sandbox's processes and files.
# The limit: the container's processes must start with an unset login uid, which they do when the
# Docker daemon runs as a system service (not from a login session), on a kernel with audit support
# (CONFIG_AUDITSYSCALL, as distributions build theirs). Where not, a command also carries its tag in
# its environment (EXEC_MARKER), and a kill finds the processes that kept it; the host logs a warning then.
EXEC_MARKER = "BAE_EXEC_ID"
# An exec's first process: it tags itself, gives back the shell level it took (so that the command sees
# the level an exec's own shell would), and becomes the command, `sh -c command` as Docker would run it.
EXEC_SCRIPT = r"""{ echo "$BAE_EXEC_ID" >"/proc/$$/loginuid"; } 2>/dev/null
if [ "${SHLVL:-0}" -gt 1 ] 2>/dev/null; then SHLVL=$((SHLVL - 1)); else unset SHLVL; fi
exec sh -c "$1"
"""
# The kill, run in the container with the tag ($1, as the login uid reads) and the marker ($2, a pattern
# that means itself: busybox's `grep -F` stops at the first NUL of an environment). Every
# tagged process is stopped, again until a scan finds none that was not (a stopped process forks no
# more, and a parent never sees a child die and carries on); then all are killed, again until none is
# left (the dead are listed until they are reaped). It says "untagged" when only the marker found
# processes, and "left" when some outlived its rounds.
KILL_TAGGED = r"""
tagged() {
  grep -l -s -x -F "$1" /proc/[0-9]*/loginuid
  grep -l -s "$2" /proc/[0-9]*/environ
}
found=$(tagged "$1" "$2")
case $found in *environ*) case $found in *loginuid*) ;; *) echo untagged ;; esac ;; esac
last='' round=0
while [ -n "$found" ] && [ $round -lt 200 ]; do
  pids=$(for file in $found; do file=${file#/proc/}; echo "${file%%/*}"; done)
  if [ "$found" = "$last" ]; then kill -KILL $pids; sleep 0.01; else kill -STOP $pids; fi 2>/dev/null
  last=$found round=$((round + 1))
  found=$(tagged "$1" "$2")
done
[ -z "$found" ] || echo left
exit 0
"""
KILL_TIMEOUT = 10.0
# The Docker daemon answers an exec's start before the process runs, and may close its streams
# a moment before it records the exit code: both are awaited by asking again, this often.
INSPECT_TRIES = 500
INSPECT_PAUSE = 0.01


def _marker(token: str) -> str:
    return f"{EXEC_MARKER}={token}"


def _exec_argv(command: str) -> list[str]:
    return ["sh", "-c", EXEC_SCRIPT, "sh", command]


def _feed(raw: socket.socket, data: bytes) -> None:
    """A command's stdin: write it all, then close our side so the command reads its end."""
    try:
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
    except OSError:  # the command ended without reading all of it
        pass


def _drain(attached: Attached, stdout: CappedOutput, stderr: CappedOutput) -> None:
    """Read an exec's multiplexed output until it closes, each chunk into its stream."""
    try:
        for stream, data in frames_iter(attached, tty=False):
            (stderr if stream == STDERR else stdout).append(data)
    finally:
        raw: Attached = getattr(attached, "_sock", attached)  # closing a SocketIO forgets its socket
        attached.close()
        raw.close()


def _inspect_until(api: DockerApi, exec_id: str, ready: Callable[[DockerJson], bool]) -> DockerJson:
    for _ in range(INSPECT_TRIES):
        info: DockerJson = api.exec_inspect(exec_id)
        if ready(info):
            break
        time.sleep(INSPECT_PAUSE)
    return info


def _exit_code(api: DockerApi, exec_id: str) -> int:
    """The exec's exit code; -1 when the Docker daemon has none to give."""
    code = _inspect_until(api, exec_id, lambda info: not info.get("Running")).get("ExitCode")
    return -1 if code is None else int(code)


def _started(api: DockerApi, exec_id: str) -> None:
    """Once the exec's process runs (or already ended), so that a kill right after finds it."""
    _inspect_until(api, exec_id, lambda info: info.get("Running") or info.get("ExitCode") is not None)


class DockerDriver:
    def __init__(self, config: SandboxConfig) -> None:
        self._config = config
        self._threads = ThreadPoolExecutor(max_workers=64, thread_name_prefix="docker")
        self._control: docker.DockerClient | None = None
        self._long: docker.DockerClient | None = None
        # The exec hot path when the Docker daemon is on a unix socket (docker_socket.py); else the SDK's.
        self._socket: DockerSocket | None = None
        # Shells kept running in each sandbox (resident_shell.py); only over the socket, when the config allows.
        self._shells: ResidentShells | None = None
        # Execs whose output is still being read after their caller stopped waiting (a timeout).
        self._draining: set[asyncio.Future[int]] = set()
        self._clients_lock = threading.Lock()
        # This host's containers: the only ones it lists, and its orphans at start.
        self._own_filters = {"label": [f"{LABEL_SANDBOX}=1", f"{LABEL_HOST}={config.host_id}"]}
        self._prepared = False
        self._prepare_lock = asyncio.Lock()

    # -- plumbing ---------------------------------------------------------------------------

    async def _run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, functools.partial(call, *args, **kwargs))

    def _connect(self) -> None:
        """Runs in a worker thread: creating a client asks the Docker daemon for its API version."""
        with self._clients_lock:
            if self._control is None:
                try:
                    control = docker.from_env(timeout=CONTROL_TIMEOUT)
                    self._long = docker.from_env(timeout=None, version=control.api.api_version)
                    path = unix_socket_path()
                    self._socket = None if path is None else DockerSocket(path, control.api.api_version)
                    if self._socket is not None and self._config.resident_shell:
                        self._shells = ResidentShells(self._socket)
                    self._control = control  # last: once it is set, both clients are
                except docker.errors.DockerException as exc:
                    raise _unreachable(exc) from None

    async def _docker(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run an SDK call in a thread; connection failures become UNAVAILABLE."""
        try:
            return await self._run(call, *args, **kwargs)
        except requests.exceptions.ConnectionError as exc:
            raise _unreachable(exc) from None

    async def _api(self) -> DockerApi:
        """The control client's API; both clients are created on first use."""
        if self._control is None:
            await self._run(self._connect)
        assert self._control is not None  # _connect set it or raised
        return self._control.api

    async def _long_api(self) -> DockerApi:
        await self._api()
        assert self._long is not None  # _connect sets it before the control client
        return self._long.api

    async def _own_containers(self, api: DockerApi) -> list[DockerJson]:
        return await self._docker(api.containers, all=True, filters=self._own_filters)

    # -- health and start-up ----------------------------------------------------------------

    async def ping(self) -> bool:
        try:
            api = await self._api()
            return bool(await asyncio.wait_for(self._docker(api.ping), PING_TIMEOUT))
        except (BaeError, docker.errors.DockerException, TimeoutError, OSError):
            return False

    async def prepare(self) -> None:
        """Remove every container labelled with this host id: a (re)started host owns no live handle."""
        async with self._prepare_lock:
            if self._prepared:
                return
            removed = await self._remove_own(await self._api())
            if removed:
                log.info("removed %d orphaned sandbox container(s) of host %s", removed, self._config.host_id)
            self._prepared = True

    async def remove_all(self) -> int:
        """Shutdown: remove this host's containers; once it exits nothing can reach or stop them."""
        if self._control is None:  # never connected, so never started one
            return 0
        return await self._remove_own(self._control.api)

    async def _remove_own(self, api: DockerApi) -> int:
        containers = await self._own_containers(api)
        await asyncio.gather(*(self._remove(api, item["Id"]) for item in containers))
        return len(containers)

    async def _ready_api(self) -> DockerApi:
        if not self._prepared:
            await self.prepare()
        return await self._api()

    # -- operations ---------------------------------------------------------------------------

    async def ensure_image(self, image: str) -> bool:
        api = await self._ready_api()
        try:
            await self._docker(api.inspect_image, image)
            return False
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:
            raise Unprocessable(f'invalid image "{image}": {_explain(exc)}') from None
        try:
            error = await self._docker(self._pull, await self._long_api(), image)
        except docker.errors.APIError as exc:
            error = _explain(exc)
        if error is not None:
            raise Unprocessable(f'cannot pull image "{image}": {error}')
        return True

    @staticmethod
    def _pull(api: DockerApi, image: str) -> str | None:
        """Pull; the Docker daemon reports some failures inside an HTTP 200 progress stream."""
        error = None
        for progress in api.pull(image, stream=True, decode=True):
            if isinstance(progress, dict) and progress.get("error"):
                error = str(progress["error"]).strip()
        if error is None:
            try:
                api.inspect_image(image)
            except docker.errors.ImageNotFound:
                error = "the image is still missing after the pull"
        return error

    async def start(self, session_id: str, image: str) -> str:
        sandbox_id = await self._create_started(image, {LABEL_SESSION: session_id})
        log.info("started sandbox %s (image %s) for session %s", sandbox_id[:12], image, session_id)
        return sandbox_id

    async def start_spare(self, image: str) -> str:
        sandbox_id = await self._create_started(image, {LABEL_SPARE: "1"})
        if self._shells is not None:  # ready before a session takes it, without holding up the pool
            self._shells.grow(sandbox_id)
        log.debug("started warm spare %s (image %s)", sandbox_id[:12], image)
        return sandbox_id

    async def running(self, sandbox_id: str) -> bool:
        api = await self._ready_api()
        try:
            info = await self._docker(api.inspect_container, sandbox_id)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            raise Internal(f"cannot inspect sandbox: {_explain(exc)}") from None
        return bool((info.get("State") or {}).get("Running"))

    async def _create_started(self, image: str, labels: dict[str, str]) -> str:
        """Create and start a container of `image`: every sandbox, a spare or not, gets these same limits."""
        api = await self._ready_api()
        config = self._config
        writable = {path: f"{TMPFS_OPTIONS},size={config.memory}" for path in (WORKSPACE, "/tmp")}
        host_config = api.create_host_config(
            auto_remove=True,
            mem_limit=config.memory,
            memswap_limit=config.memory,  # no swap beyond the memory limit
            nano_cpus=int(config.cpus * 1e9),
            pids_limit=config.pids_limit,
            network_mode=config.network,
            cap_drop=["ALL"],
            cap_add=list(SHELL_CAPABILITIES),
            security_opt=["no-new-privileges:true"],
            init=True,  # reaps the zombies of exec'd commands; forwards signals
            # Commands' output comes over their execs, never through the container's own stdout (the
            # keepalive's, which says nothing): no log is kept, so no command can fill the disk by
            # writing there (/proc/1/fd/1).
            log_config=docker.types.LogConfig(type=docker.types.LogConfig.types.NONE),
            read_only=config.read_only,
            tmpfs=writable if config.read_only else None,
        )
        try:
            created = await self._docker(
                api.create_container, image, KEEPALIVE_COMMAND,
                labels={LABEL_SANDBOX: "1", **labels, LABEL_HOST: config.host_id}, host_config=host_config,
                working_dir=WORKSPACE if config.read_only else None,
            )
        except docker.errors.ImageNotFound:
            raise Unprocessable(f'image "{image}" is not present on this host; ensure it first') from None
        except docker.errors.APIError as exc:
            raise Internal(f"cannot create sandbox: {_explain(exc)}") from None
        sandbox_id: str = created["Id"]
        try:
            await self._docker(api.start, sandbox_id)
        except docker.errors.APIError as exc:
            await self._remove(api, sandbox_id)
            raise Internal(f"cannot start sandbox: {_explain(exc)}") from None
        return sandbox_id

    async def _create_exec(self, api: DockerApi, sandbox_id: str, command: str, token: str, stdin: bool) -> str:
        try:
            created = await self._docker(
                api.exec_create, sandbox_id, _exec_argv(command), environment=[_marker(token)], stdin=stdin
            )
        except docker.errors.NotFound:
            raise NotFound(f"no such sandbox: {sandbox_id}") from None
        except docker.errors.APIError as exc:
            raise Unprocessable(f"cannot exec in sandbox: {_explain(exc)}") from None
        exec_id: str = created["Id"]
        return exec_id

    async def _attach(self, exec_id: str, stdin: bytes | None) -> Attached:
        """Start the exec and return its attached socket; `stdin` (None: not attached) is written, then closed."""
        api = await self._long_api()

        def attach() -> Attached:
            attached = api.exec_start(exec_id, socket=True)
            if stdin is not None:
                raw = getattr(attached, "_sock", attached)
                # Written beside the reads: a command may print before it reads its input.
                threading.Thread(target=_feed, args=(raw, stdin), name="docker-stdin", daemon=True).start()
            return attached

        try:
            return await self._docker(attach)
        except docker.errors.APIError as exc:
            raise Internal(f"exec failed: {_explain(exc)}") from None

    async def exec(self, sandbox_id: str, command: str, timeout: float) -> ExecOutput:
        api = await self._ready_api()
        token = new_tag()
        limit = self._config.output_limit
        stdout, stderr = CappedOutput(limit), CappedOutput(limit)
        run = await self._begin_exec(api, sandbox_id, command, token, stdout, stderr)
        # Shielded: past a timeout (or a caller gone) the output is still read until the streams
        # close, as the kill below (or the command's end) closes them, so the command never blocks on a full pipe.
        drained = asyncio.ensure_future(run)
        self._draining.add(drained)
        drained.add_done_callback(self._draining.discard)
        try:
            exit_code = await asyncio.wait_for(asyncio.shield(drained), timeout)
        except TimeoutError:
            await asyncio.shield(self._kill_tagged(api, sandbox_id, token))
            raise DeadlineExceeded(f"command timed out after {timeout:g}s") from None
        except asyncio.CancelledError:
            # The caller is gone (its turn cancelled, its deadline passed): nobody can have the result.
            await asyncio.shield(self._kill_tagged(api, sandbox_id, token))
            raise
        except OSError as exc:
            raise Internal(f"exec failed: {exc}") from None
        return ExecOutput(
            stdout=stdout.text(),
            stderr=stderr.text(),
            exit_code=exit_code,
            stdout_truncated=stdout.truncated,
            stderr_truncated=stderr.truncated,
        )

    async def _begin_exec(
        self, api: DockerApi, sandbox_id: str, command: str, token: str, stdout: CappedOutput, stderr: CappedOutput
    ) -> Coroutine[None, None, int]:
        """Whatever must happen before the deadline starts (creating the exec), and what runs under it: it returns the exit code."""
        docker_socket, shells = self._socket, self._shells
        line = None if shells is None else encode(command)
        if shells is not None and line is not None and (shell := await shells.take(sandbox_id)) is not None:
            return self._run_resident(shells, shell, line, token, stdout, stderr)
        if docker_socket is None:
            exec_id = await self._create_exec(api, sandbox_id, command, token, stdin=False)

            async def through_the_sdk() -> int:
                await self._docker(_drain, await self._attach(exec_id, None), stdout, stderr)
                try:
                    return await self._docker(_exit_code, api, exec_id)
                except docker.errors.APIError as exc:
                    raise Internal(f"exec failed: {_explain(exc)}") from None

            return through_the_sdk()
        exec_id = await self._socket_create(docker_socket, sandbox_id, command, token)

        async def through_the_socket() -> int:
            try:
                await docker_socket.run_exec(exec_id, stdout, stderr)
            except DockerError as exc:
                raise Internal(f"exec failed: {exc.explanation}") from None
            return await self._socket_exit_code(docker_socket, exec_id)

        return through_the_socket()

    async def _run_resident(
        self, shells: ResidentShells, shell: ResidentShell, line: bytes, token: str, stdout: CappedOutput, stderr: CappedOutput
    ) -> int:
        try:
            exit_code = await shell.run(line, token, stdout, stderr)
        except ShellLost as exc:
            shells.drop(shell)
            if not await self.running(shell.sandbox_id):
                raise NotFound(f"no such sandbox: {shell.sandbox_id}") from None
            # The command ended its resident shell (or the shell died under it): no exit status was reported.
            log.info("a command in sandbox %s ended its shell: %s", shell.sandbox_id[:12], exc)
            return -1
        shells.give_back(shell)
        return exit_code

    @staticmethod
    async def _socket_create(docker_socket: DockerSocket, sandbox_id: str, command: str, token: str) -> str:
        try:
            return await asyncio.wait_for(
                docker_socket.create_exec(sandbox_id, _exec_argv(command), [_marker(token)]), CONTROL_TIMEOUT
            )
        except DockerError as exc:
            if exc.status == 404:
                raise NotFound(f"no such sandbox: {sandbox_id}") from None
            raise Unprocessable(f"cannot exec in sandbox: {exc.explanation}") from None
        except TimeoutError:
            raise Internal(f"exec failed: no answer within {CONTROL_TIMEOUT}s") from None
        except OSError as exc:
            raise _unreachable(exc) from None

    @staticmethod
    async def _socket_exit_code(docker_socket: DockerSocket, exec_id: str) -> int:
        """As _exit_code: the Docker daemon may close the streams a moment before it records the exit code."""
        try:
            for _ in range(INSPECT_TRIES):
                info = await asyncio.wait_for(docker_socket.inspect_exec(exec_id), CONTROL_TIMEOUT)
                if not info.get("Running"):
                    break
                await asyncio.sleep(INSPECT_PAUSE)
        except DockerError as exc:
            raise Internal(f"exec failed: {exc.explanation}") from None
        except TimeoutError:
            raise Internal(f"exec failed: no answer within {CONTROL_TIMEOUT}s") from None
        except OSError as exc:
            raise _unreachable(exc) from None
        code = info.get("ExitCode")
        return -1 if code is None else int(code)

    async def spawn(self, command: BackgroundCommand, script: str, stdin: bytes) -> None:
        api = await self._ready_api()
        exec_id = await self._create_exec(api, command.sandbox_id, script, command.token, stdin=True)
        attached = await self._attach(exec_id, stdin)
        threading.Thread(
            target=self._follow, args=(api, command, exec_id, attached), name="docker-command", daemon=True
        ).start()
        try:
            await self._docker(_started, api, exec_id)
        except (BaeError, docker.errors.APIError) as exc:  # the follower records what became of it
            log.warning("could not see background command %s start: %s", command.command_id, exc)

    @staticmethod
    def _follow(api: DockerApi, command: BackgroundCommand, exec_id: str, attached: Attached) -> None:
        """A command's own thread: collect its output until its streams close, then record how it ended."""
        exit_code, failure = -1, None
        try:
            _drain(attached, command.stdout, command.stderr)
            exit_code = _exit_code(api, exec_id)
        except docker.errors.NotFound:
            failure = "the sandbox is gone"
        except Exception as exc:  # any socket or Docker error: the command can no longer be followed
            log.warning("lost background command %s in sandbox %s: %s", command.command_id, command.sandbox_id[:12], exc)
            failure = f"lost the command: {exc}"
        command.ended(exit_code, failure)

    async def kill(self, command: BackgroundCommand) -> None:
        await self._kill_tagged(await self._ready_api(), command.sandbox_id, command.token)

    async def _kill_tagged(self, api: DockerApi, sandbox_id: str, token: str) -> None:
        """Kill a command and every process it started (timed out, or killed) so they stop using the sandbox."""
        argv = ["sh", "-c", KILL_TAGGED, "sh", str(int(token)), _marker(token)]
        try:
            killer = await self._docker(api.exec_create, sandbox_id, argv)
            said: bytes = await asyncio.wait_for(self._docker(api.exec_start, killer["Id"]), KILL_TIMEOUT)
        except (BaeError, docker.errors.APIError, TimeoutError) as exc:
            log.warning("could not kill a command in sandbox %s (%s); it runs until the sandbox stops",
                        sandbox_id[:12], exc)
            return
        if b"untagged" in said:
            log.warning("a command in sandbox %s carried no login uid tag (the Docker daemon's processes have "
                        "one set, or the kernel has no audit support): a process of it that dropped its "
                        "environment was not killed", sandbox_id[:12])
        if b"left" in said:
            log.warning("some processes of a command in sandbox %s outlived its kill", sandbox_id[:12])

    async def stop(self, sandbox_id: str) -> bool:
        api = await self._ready_api()
        if self._shells is not None:
            self._shells.forget(sandbox_id)
        was_running = await self._remove(api, sandbox_id)
        log.info("stopped sandbox %s%s", sandbox_id[:12], "" if was_running else " (already gone)")
        return was_running

    async def _remove(self, api: DockerApi, sandbox_id: str) -> bool:
        """Kill and remove; "no such container" and a removal already under way count as done."""
        try:
            await self._docker(api.remove_container, sandbox_id, force=True)
            return True
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "already in progress" in _explain(exc):
                return False
            raise Internal(f"cannot stop sandbox: {_explain(exc)}") from None

    async def list(self) -> list[SandboxInfo]:
        containers = await self._own_containers(await self._ready_api())
        return [
            SandboxInfo(
                sandbox_id=item["Id"],
                session_id=labels.get(LABEL_SESSION, ""),
                image=item.get("Image", ""),
                state=item.get("State", ""),
                spare=LABEL_SPARE in labels,
            )
            for item in containers
            for labels in [item.get("Labels") or {}]
        ]

    async def close(self) -> None:
        if self._shells is not None:
            self._shells.close()
        if self._socket is not None:
            self._socket.close()
        for client in (self._control, self._long):
            if client is not None:
                client.close()
        self._threads.shutdown(wait=False, cancel_futures=True)
