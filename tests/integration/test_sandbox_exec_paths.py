"""The docker driver's three exec paths against the real Docker daemon: a command handed to the
sandbox's resident shell (resident_shell.py, what a host on the default Docker socket uses), an exec
straight over the unix socket (docker_socket.py: no shell idle, or shells off), and an
exec through the SDK (any other Docker daemon address). All must answer alike: output, exit code,
caps, timeout kill, a missing sandbox.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bae.services.sandbox.config import SandboxConfig
from bae.services.sandbox.docker_driver import DockerDriver
from bae.services.sandbox.docker_socket import unix_socket_path
from bae.common.errors import DeadlineExceeded, NotFound
from bae.services.sandbox.resident_shell import ResidentShell, ResidentShells
from testkit.docker_support import TEST_IMAGE, containers_with, docker_client, require_docker

pytestmark = pytest.mark.docker

LIMIT = 64
KILL_SHELLS = "ps -o pid,args | grep '[b]ae resident shell' | while read pid rest; do kill -9 $pid; done"


async def shell_ready(driver: DockerDriver, sandbox_id: str) -> None:
    """Until the sandbox has an idle resident shell (one starts with its first command)."""
    for _ in range(500):
        if driver._shells is not None and driver._shells._idle.get(sandbox_id):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no resident shell became ready")


def idle_shell(driver: DockerDriver, sandbox_id: str) -> tuple[ResidentShells, ResidentShell]:
    """The driver's shell pool and the sandbox's idle shell (the fixture made it ready)."""
    shells = driver._shells
    assert shells is not None
    return shells, shells._idle[sandbox_id][-1]


@pytest.fixture(params=["shell", "socket", "sdk"])
async def sandbox(request):
    require_docker()
    host_id = f"test-exec-{uuid.uuid4().hex[:12]}"
    config = SandboxConfig(
        driver="docker", listen_addr="unused", host_id=host_id, memory="256m", cpus=1, pids_limit=64,
        network="none", read_only=False, exec_timeout=30, output_limit=LIMIT, health_interval=2,
        resident_shell=request.param == "shell",
    )
    driver = DockerDriver(config)
    sandbox_id = await driver.start("ses_paths", TEST_IMAGE)
    if request.param == "sdk":
        driver._socket = None  # what a host does when the Docker daemon is not on a unix socket
    else:
        assert driver._socket is not None, "the test Docker daemon is on a unix socket"
    if request.param == "shell":
        assert (await driver.exec(sandbox_id, "echo first", 10)).stdout == "first\n"
        await shell_ready(driver, sandbox_id)
    try:
        yield driver, sandbox_id
    finally:
        await driver.remove_all()
        await driver.close()
        assert containers_with(f"bae.host={host_id}") == []


async def test_output_and_exit_code(sandbox):
    driver, sandbox_id = sandbox
    output = await driver.exec(sandbox_id, "echo out; echo err >&2; exit 3", 10)
    assert (output.stdout, output.stderr, output.exit_code) == ("out\n", "err\n", 3)
    assert not output.stdout_truncated and not output.stderr_truncated


async def test_each_stream_is_capped(sandbox):
    driver, sandbox_id = sandbox
    output = await driver.exec(sandbox_id, "yes a | head -c 100000; yes b | head -c 300 >&2", 10)
    assert output.stdout == "a\n" * (LIMIT // 2) + "\n[output truncated: 99936 bytes omitted]\n"
    assert output.stderr.startswith("b\n" * (LIMIT // 2)) and output.stderr_truncated


async def test_a_timed_out_command_is_killed_with_its_children(sandbox):
    driver, sandbox_id = sandbox
    with pytest.raises(DeadlineExceeded) as caught:
        await driver.exec(sandbox_id, "sleep 300 & sleep 301", 0.5)
    assert caught.value.detail == "command timed out after 0.5s"
    left = await driver.exec(sandbox_id, "ps -o args | grep '^sleep 30' || true", 10)
    assert left.stdout == ""
    assert (await driver.exec(sandbox_id, "echo still usable", 10)).stdout == "still usable\n"


# Children that hide from a kill: `env -i` drops the environment, setsid the process group and session,
# and the subshell's exit leaves the second to PID 1. The command then waits.
HIDING = ("env -i sh -c 'while :; do sleep 1; done' & (setsid env -i sh -c 'while :; do sleep 2; done' &); wait")
LOOPS = "ps -o args | grep -c '^sh -c [w]hile :' || true"


async def test_a_timed_out_command_is_killed_with_the_children_that_hid(sandbox):
    driver, sandbox_id = sandbox
    with pytest.raises(DeadlineExceeded):
        await driver.exec(sandbox_id, HIDING, 0.5)
    assert (await driver.exec(sandbox_id, LOOPS, 10)).stdout == "0\n"


async def test_a_command_whose_caller_is_gone_is_killed_with_the_children_that_hid(sandbox):
    driver, sandbox_id = sandbox
    running = asyncio.create_task(driver.exec(sandbox_id, HIDING, 30))
    for _ in range(500):
        if (await driver.exec(sandbox_id, LOOPS, 10)).stdout == "2\n":
            break
        await asyncio.sleep(0.01)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert (await driver.exec(sandbox_id, LOOPS, 10)).stdout == "0\n"


async def test_a_command_cannot_drop_its_tag(sandbox):
    """The login uid a command is tagged with, which it cannot set again (docker_driver.py)."""
    driver, sandbox_id = sandbox
    output = await driver.exec(sandbox_id, 'cat /proc/$$/loginuid; echo; echo 0 >/proc/$$/loginuid', 10)
    assert output.stdout.strip().isdigit() and 0 < int(output.stdout) < 65534
    assert "Operation not permitted" in output.stderr and output.exit_code != 0


@pytest.mark.parametrize("sandbox", ["socket"], indirect=True)
async def test_an_untagged_command_is_killed_by_its_marker_with_a_warning(sandbox, caplog):
    """Where processes cannot be tagged (their login uid was set before: a Docker daemon started from a
    login session), a kill still finds those that kept the command's environment marker."""
    driver, sandbox_id = sandbox
    client = docker_client()
    try:
        untagged = "echo 9 >/proc/$$/loginuid; exec sh -c 'sleep 307 & wait'"
        client.containers.get(sandbox_id).exec_run(["sh", "-c", untagged], environment=["BAE_EXEC_ID=00077"],
                                                   detach=True)
    finally:
        client.close()
    for _ in range(500):
        if (await driver.exec(sandbox_id, "ps -o args | grep -c '^[s]leep 307' || true", 10)).stdout == "1\n":
            break
        await asyncio.sleep(0.01)
    await driver._kill_tagged(await driver._api(), sandbox_id, "00077")
    assert (await driver.exec(sandbox_id, "ps -o args | grep -c '^[s]leep 307' || true", 10)).stdout == "0\n"
    assert "carried no login uid tag" in caplog.text


async def test_a_missing_sandbox_is_not_found(sandbox):
    driver, _ = sandbox
    with pytest.raises(NotFound) as caught:
        await driver.exec("0" * 64, "true", 10)
    assert caught.value.detail == f"no such sandbox: {'0' * 64}"


def test_the_socket_path_follows_docker_host():
    assert unix_socket_path({}) == "/var/run/docker.sock"
    assert unix_socket_path({"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}) == "/run/user/1000/docker.sock"
    assert unix_socket_path({"DOCKER_HOST": "tcp://10.0.0.2:2376", "DOCKER_TLS_VERIFY": "1"}) is None
    assert unix_socket_path({"DOCKER_HOST": "ssh://user@builder"}) is None


@pytest.mark.parametrize("sandbox", ["socket"], indirect=True)  # the SDK path keeps its own connections
async def test_connections_are_reused_and_one_the_daemon_closed_is_replaced(sandbox, tmp_path):
    driver, sandbox_id = sandbox
    docker_socket = driver._socket
    assert docker_socket is not None
    await driver.exec(sandbox_id, "true", 10)
    assert docker_socket._idle, "the create and inspect connection is kept for the next exec"

    async def hang_up(reader, writer) -> None:
        writer.close()

    # Stands in for an idle connection the Docker daemon closed: it answers nothing.
    server = await asyncio.start_unix_server(hang_up, path=str(tmp_path / "closed.sock"))
    try:
        docker_socket.close()
        docker_socket._idle.append(await asyncio.open_unix_connection(str(tmp_path / "closed.sock")))
        await asyncio.sleep(0.05)  # the hang-up has arrived
        assert (await driver.exec(sandbox_id, "echo again", 10)).stdout == "again\n"
    finally:
        server.close()


async def test_a_command_comes_back_byte_for_byte(sandbox):
    driver, sandbox_id = sandbox
    text = "t\tx  \\b\\s 'q' \"d\" $HOME %s %b \\0101 é✓\nl2  "  # within the 64-byte cap
    output = await driver.exec(sandbox_id, f"cat <<'EOF'\n{text}\nEOF", 10)
    assert output.stdout == text + "\n"


async def test_a_background_child_holding_the_output_holds_the_call(sandbox):
    driver, sandbox_id = sandbox
    output = await driver.exec(sandbox_id, "(sleep 0.3; echo late; echo late-err >&2) & echo early", 10)
    assert (output.stdout, output.stderr, output.exit_code) == ("early\nlate\n", "late-err\n", 0)


async def test_commands_at_once_each_get_their_own_output(sandbox):
    driver, sandbox_id = sandbox
    outputs = await asyncio.gather(*(
        driver.exec(sandbox_id, f"sleep 0.1; echo out{n}; echo err{n} >&2; exit {n}", 10) for n in range(7)
    ))
    assert [(o.stdout, o.stderr, o.exit_code) for o in outputs] == [
        (f"out{n}\n", f"err{n}\n", n) for n in range(7)
    ]


@pytest.mark.parametrize("sandbox", ["shell"], indirect=True)
async def test_the_shell_takes_every_command_in_turn(sandbox):
    driver, sandbox_id = sandbox
    shells, shell = idle_shell(driver, sandbox_id)
    for n in range(3):
        assert (await driver.exec(sandbox_id, f"echo {n}", 10)).stdout == f"{n}\n"
        assert shells._idle[sandbox_id] == [shell], "the same shell ran it and is idle again"
    # The shell's environment stays its own: the command's marker and the nonce are not in it.
    shown = await driver.exec(sandbox_id, "env | grep -c BAE_EXEC_ID; echo $nonce", 10)
    assert shown.stdout == "1\n\n"


@pytest.mark.parametrize("sandbox", ["shell"], indirect=True)
async def test_a_command_that_kills_its_shell_ends_without_a_status_and_the_next_gets_a_new_one(sandbox):
    driver, sandbox_id = sandbox
    output = await driver.exec(sandbox_id, f"echo before; {KILL_SHELLS}; sleep 0.2", 10)
    assert (output.stdout, output.exit_code) == ("before\n", -1)
    assert (await driver.exec(sandbox_id, "echo after", 10)).stdout == "after\n"
    await shell_ready(driver, sandbox_id)
    assert (await driver.exec(sandbox_id, "echo on a new shell", 10)).stdout == "on a new shell\n"


@pytest.mark.parametrize("sandbox", ["shell"], indirect=True)
async def test_a_shell_killed_while_idle_is_not_used(sandbox):
    driver, sandbox_id = sandbox
    _, idle = idle_shell(driver, sandbox_id)
    client = docker_client()
    try:
        await asyncio.to_thread(client.containers.get(sandbox_id).exec_run, ["sh", "-c", KILL_SHELLS])
    finally:
        client.close()
    for _ in range(100):
        if not idle.alive:
            break
        await asyncio.sleep(0.01)
    assert not idle.alive
    assert (await driver.exec(sandbox_id, "echo through the daemon", 10)).stdout == "through the daemon\n"


async def test_a_command_runs_in_a_session_of_its_own(sandbox):
    """As an exec's process does: `kill 0` ends the command and what it started, nothing else."""
    driver, sandbox_id = sandbox
    own = 'read pid comm state ppid group session rest < /proc/$$/stat; [ "$group $session" = "$$ $$" ] && echo own'
    assert (await driver.exec(sandbox_id, own, 10)).stdout == "own\n"
    killed = await driver.exec(sandbox_id, "echo before; kill 0; echo after", 10)
    assert (killed.stdout, killed.exit_code) == ("before\n", 143)
    assert (await driver.exec(sandbox_id, "echo next", 10)).stdout == "next\n"


@pytest.mark.parametrize("sandbox", ["shell"], indirect=True)
async def test_a_command_sees_the_environment_an_exec_would(sandbox):
    driver, sandbox_id = sandbox
    # A digest: the whole text is longer than the fixture's output cap.
    shown = "{ env | grep -v '^BAE_EXEC_ID=' | sort; umask; ulimit -a; pwd; trap; } | cksum"
    through_the_shell = await driver.exec(sandbox_id, shown, 10)
    shells, driver._shells = driver._shells, None
    try:
        as_an_exec = await driver.exec(sandbox_id, shown, 10)
    finally:
        driver._shells = shells
    assert through_the_shell.stdout == as_an_exec.stdout
