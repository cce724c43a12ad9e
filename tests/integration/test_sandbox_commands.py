"""Background commands and capped output of the sandbox host, over real gRPC against the real Docker daemon."""

from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import pytest

from bae.common import error_codes
from bae.common.errors import Conflict
from bae.common.grpcutil import channel as internal_channel
from bae.common.protos import sandbox_pb2, sandbox_pb2_grpc
from testkit.docker_support import TEST_IMAGE, SandboxHostProcess, containers_with, docker_client, require_docker
from testkit.processes import TEST_PLANE, PeakRss

pytestmark = [pytest.mark.stack, pytest.mark.docker]

State = sandbox_pb2.CommandStatus.State
MIB = 1024 * 1024
PRINTED = 300 * MIB  # what the memory tests print: far more than any limit
RSS_CEILING_KB = 150 * 1024


class Host:
    """A running sandbox host, a stub to it (allowed TEST_IMAGE) and one started sandbox."""

    def __init__(self, process: SandboxHostProcess) -> None:
        self.process = process
        self.channel = internal_channel(process.address, TEST_PLANE)
        self.stub = sandbox_pb2_grpc.SandboxStub(self.channel)
        self.sandbox_id = ""

    async def open(self) -> Host:
        await self.stub.AllowImages(sandbox_pb2.AllowImagesRequest(images=[TEST_IMAGE]), timeout=10)
        started = await self.stub.Start(sandbox_pb2.StartRequest(session_id="ses_cmd", image=TEST_IMAGE), timeout=30)
        self.sandbox_id = started.sandbox_id
        return self

    async def start(self, command: str, command_id: str | None = None, **fields) -> sandbox_pb2.CommandStatus:
        request = sandbox_pb2.StartCommandRequest(
            sandbox_id=fields.pop("sandbox_id", self.sandbox_id),
            command_id=command_id or f"cmd_{uuid.uuid4().hex[:8]}",
            command=command,
            **fields,
        )
        return await self.stub.StartCommand(request, timeout=30)

    async def wait(self, command_id: str, seconds: float = 30, **offsets: int) -> sandbox_pb2.CommandStatus:
        request = sandbox_pb2.WaitCommandRequest(command_id=command_id, wait_seconds=seconds, **offsets)
        return await self.stub.WaitCommand(request, timeout=seconds + 30)

    async def kill(self, command_id: str) -> sandbox_pb2.CommandStatus:
        return await self.stub.KillCommand(sandbox_pb2.KillCommandRequest(command_id=command_id), timeout=30)

    async def exec(self, command: str, timeout: float = 0) -> sandbox_pb2.ExecResponse:
        request = sandbox_pb2.ExecRequest(sandbox_id=self.sandbox_id, command=command, timeout_seconds=timeout)
        return await self.stub.Exec(request, timeout=120)

    async def processes(self) -> list[str]:
        """The command lines running in the sandbox, but for its own keepalive, this `ps` and the
        resident shell that runs it: the shells it starts, and the two `cat`s that carry the output (shown
        as `{exe} cat` while busybox starts the applet)."""
        lines = (await self.exec("ps -o args")).stdout.splitlines()[1:]
        return [line for line in lines
                if not any(own in line for own in OWN_PROCESSES) and line.split()[-1:] != ["cat"]]


OWN_PROCESSES = ("sleep infinity", "ps -o args", "bae resident shell")


@pytest.fixture
def open_host():
    """open_host(**env) -> a Host with a started sandbox; hosts stopped and containers checked afterwards."""
    require_docker()
    processes: list[SandboxHostProcess] = []
    hosts: list[Host] = []

    async def open_(**env: str) -> Host:
        process = SandboxHostProcess(f"test-cmd-{uuid.uuid4().hex[:12]}", **env)
        processes.append(process)
        process.wait_serving()
        host = Host(process)
        hosts.append(host)
        return await host.open()

    yield open_
    for process in processes:
        process.stop()
        assert containers_with(process.label) == [], "a test left a container behind"


@pytest.fixture
async def host(open_host):
    host = await open_host()
    yield host
    await host.channel.close()


async def _rpc_error(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def test_a_command_runs_in_the_background_and_reports_how_it_ended(host):
    started = await host.start("echo out; echo err >&2; exit 3", "cmd_exit")
    assert (started.command_id, started.sandbox_id) == ("cmd_exit", host.sandbox_id)
    status = await host.wait("cmd_exit")
    assert (status.state, status.exit_code, status.stdout, status.stderr) == (State.EXITED, 3, b"out\n", b"err\n")
    assert not status.stdout_truncated and not status.stderr_truncated and status.detail == ""
    # Waiting on an ended command answers at once, the same again.
    assert await host.wait("cmd_exit", 0) == status


async def test_output_is_read_incrementally_while_the_command_runs(host):
    await host.start("echo one; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo two; echo late >&2", "cmd_steps")
    async with asyncio.timeout(20):
        while (status := await host.wait("cmd_steps", 0)).stdout != b"one\n":
            await asyncio.sleep(0.05)
    assert status.state == State.RUNNING
    began = time.monotonic()
    assert (await host.wait("cmd_steps", 0.5)).state == State.RUNNING  # waited the time out, then answered
    assert time.monotonic() - began >= 0.4
    await host.exec("touch /tmp/go")
    status = await host.wait("cmd_steps", stdout_offset=4)
    assert (status.state, status.exit_code, status.stdout, status.stderr) == (State.EXITED, 0, b"two\n", b"late\n")
    assert (await host.wait("cmd_steps", 0, stdout_offset=100, stderr_offset=2)).stdout == b""
    assert (await host.wait("cmd_steps", 0, stderr_offset=2)).stderr == b"te\n"


# A child that hides from a kill: no environment, a session of its own, and PID 1 for a parent.
HIDDEN = "(setsid env -i sleep 303 &)"


async def test_kill_ends_the_command_and_every_process_it_started(host):
    await host.start(f"sleep 300 & (sleep 301 &) ; {HIDDEN}; sh -c 'sleep 302; echo never'; echo never", "cmd_tree")
    async with asyncio.timeout(20):
        while len([p for p in await host.processes() if p.startswith("sleep 30")]) < 4:
            await asyncio.sleep(0.1)
    killed = await host.kill("cmd_tree")
    assert (killed.state, killed.exit_code, killed.stdout) == (State.KILLED, -1, b"")
    assert await host.processes() == []
    # Killing an ended command leaves it as it was.
    assert await host.kill("cmd_tree") == killed
    await host.start("exit 4", "cmd_done")
    assert (await host.wait("cmd_done")).state == State.EXITED
    again = await host.kill("cmd_done")
    assert (again.state, again.exit_code) == (State.EXITED, 4)


async def test_a_command_past_its_timeout_is_killed_with_its_children(host):
    began = time.monotonic()
    await host.start(f"echo started; sleep 300 & {HIDDEN}; sleep 301", "cmd_slow", timeout_seconds=1)
    status = await host.wait("cmd_slow")
    assert time.monotonic() - began < 10
    assert (status.state, status.exit_code, status.stdout) == (State.TIMED_OUT, -1, b"started\n")
    assert await host.processes() == []


async def test_list_shows_every_command_without_output(host):
    await host.start("echo done", "cmd_a")
    await host.wait("cmd_a")
    await host.start("echo running; sleep 300", "cmd_b")
    listed = (await host.stub.ListCommands(sandbox_pb2.ListCommandsRequest(), timeout=10)).commands
    assert [(c.command_id, c.sandbox_id, c.state, c.stdout) for c in listed] == [
        ("cmd_a", host.sandbox_id, State.EXITED, b""),
        ("cmd_b", host.sandbox_id, State.RUNNING, b""),
    ]
    await host.kill("cmd_b")


async def test_ids_duplicate_unknown_and_invalid(host):
    await host.start("true", "cmd_dup")
    await host.wait("cmd_dup")
    error = await _rpc_error(host.start("true", "cmd_dup"))
    assert (error.code(), error.details()) == (grpc.StatusCode.ABORTED, 'command "cmd_dup" already exists')
    assert isinstance(error_codes.raised_by(error), Conflict)  # the session service gets the kind back
    for call in (host.wait("cmd_nope", 0), host.kill("cmd_nope")):
        error = await _rpc_error(call)
        assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, 'no such command: "cmd_nope"')
    # A sandbox that does not exist: nothing is tracked, and the id stays free.
    error = await _rpc_error(host.start("true", "cmd_nowhere", sandbox_id="0" * 64))
    assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, f"no such sandbox: {'0' * 64}")
    assert (await host.wait("cmd_dup", 0)).state == State.EXITED
    await _rpc_error(host.wait("cmd_nowhere", 0))
    for bad, detail in (
        (host.start("true", "x" * 129), "command_id must be 1 to 128 characters"),
        (host.start("true", "cmd_neg", timeout_seconds=-1), "timeout_seconds must be a non-negative number of seconds"),
        (host.stub.WaitCommand(sandbox_pb2.WaitCommandRequest(command_id="cmd_dup", wait_seconds=float("nan")),
                               timeout=10), "wait_seconds must be a non-negative number of seconds"),
    ):
        error = await _rpc_error(bad)
        assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, detail)


async def test_stdin_is_delivered_then_closed(host):
    data = b"first line\nsecond \xff\x00 line\n" + bytes(range(256)) * 4000  # binary, just under 1 MiB
    await host.start("cat", "cmd_cat", stdin=data)
    status = await host.wait("cmd_cat")
    assert (status.state, status.exit_code, status.stdout == data) == (State.EXITED, 0, True)
    # No input: the command reads its end at once instead of waiting for one.
    await host.start("wc -c", "cmd_empty")
    assert (await host.wait("cmd_empty")).stdout.strip() == b"0"
    # A command that never reads its input still ends normally.
    await host.start("echo ignored", "cmd_ignores", stdin=b"x" * MIB)
    assert (await host.wait("cmd_ignores")).state == State.EXITED


async def test_stopping_the_sandbox_kills_its_commands_and_forgets_them(host):
    await host.start("sleep 300", "cmd_stop")
    waiting = asyncio.create_task(host.wait("cmd_stop", 60))
    await asyncio.sleep(0.2)
    await host.stub.Stop(sandbox_pb2.StopRequest(sandbox_id=host.sandbox_id), timeout=30)
    status = await waiting
    assert (status.state, status.detail) == (State.KILLED, "the sandbox was stopped")
    assert (await _rpc_error(host.wait("cmd_stop", 0))).code() == grpc.StatusCode.NOT_FOUND


async def test_a_sandbox_removed_under_a_command_ends_it(host):
    await host.start("sleep 300", "cmd_orphan")
    client = docker_client()
    try:
        client.containers.get(host.sandbox_id).remove(force=True)
    finally:
        client.close()
    status = await host.wait("cmd_orphan")
    # Killed with its container: the Docker daemon reports SIGKILL's 137, or no longer knows the exec at all.
    assert (status.state, status.exit_code, status.detail) in (
        (State.EXITED, 137, ""), (State.FAILED, -1, "the sandbox is gone")
    )


async def test_command_output_is_capped_per_stream(open_host):
    host = await open_host(BAE_SANDBOX_OUTPUT_LIMIT="4096")
    await host.start("yes | head -c 10000; echo small >&2", "cmd_host_limit")
    status = await host.wait("cmd_host_limit")
    assert (len(status.stdout), status.stdout_truncated) == (4096, True)
    assert (status.stderr, status.stderr_truncated) == (b"small\n", False)
    # A smaller limit of the caller's applies; a larger one is lowered to the host's.
    await host.start("yes | head -c 10000", "cmd_small", output_limit_bytes=1000)
    await host.start("yes | head -c 10000", "cmd_large", output_limit_bytes=MIB)
    assert len((await host.wait("cmd_small")).stdout) == 1000
    assert len((await host.wait("cmd_large")).stdout) == 4096
    # Exactly the limit is not a cut.
    await host.start("yes | head -c 4096", "cmd_exact")
    assert (await host.wait("cmd_exact")).stdout_truncated is False
    await host.channel.close()


async def test_exec_output_is_capped_at_a_utf8_boundary_with_a_marker(open_host):
    host = await open_host(BAE_SANDBOX_OUTPUT_LIMIT="10")
    # Nine bytes, then "é" (two bytes) across the limit: the cut goes before it.
    reply = await host.exec("printf 'aaaaaaaaa\\303\\251bbb'; printf 'short' >&2")
    assert reply.stdout == "aaaaaaaaa\n[output truncated: 5 bytes omitted]\n"
    assert (reply.stdout_truncated, reply.stderr, reply.stderr_truncated, reply.exit_code) == (True, "short", False, 0)
    reply = await host.exec("printf 0123456789")
    assert (reply.stdout, reply.stdout_truncated) == ("0123456789", False)
    await host.channel.close()


async def test_exec_default_timeout_is_the_hosts(open_host):
    host = await open_host(BAE_SANDBOX_EXEC_TIMEOUT="2")
    assert (await host.exec("sleep 1; echo in time")).stdout == "in time\n"
    began = time.monotonic()
    error = await _rpc_error(host.exec("sleep 300 & sleep 301"))
    assert (error.code(), error.details()) == (grpc.StatusCode.DEADLINE_EXCEEDED, "command timed out after 2s")
    assert time.monotonic() - began < 10
    assert await host.processes() == []
    await host.channel.close()


async def test_printing_300_mb_keeps_the_host_memory_flat(host):
    with PeakRss(host.process.process.pid) as rss:
        await host.start(f"yes | head -c {PRINTED}", "cmd_flood")
        status = await host.wait("cmd_flood", 240)
        reply = await host.exec(f"yes | head -c {PRINTED}")
    assert (status.state, len(status.stdout), status.stdout_truncated) == (State.EXITED, MIB, True)
    assert reply.stdout_truncated and reply.stdout.endswith(f"\n[output truncated: {PRINTED - MIB} bytes omitted]\n")
    assert len(reply.stdout.encode()) < MIB + 100
    assert 0 < rss.peak_kb < RSS_CEILING_KB, f"sandbox host peaked at {rss.peak_kb} kB"
