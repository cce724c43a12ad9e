"""The Docker daemon restarts under a live sandbox.

The test runs a Docker daemon of its own (its own socket, data and state
directories) in a network namespace of its own, so restarting it disturbs
nothing else on the machine (a `--bridge=none` daemon in the machine's
namespace would delete the machine's `docker0`). A restart kills the sandbox's container: the session records
the failed command as `session.sandbox.error`, an explicit stop still ends
with `session.sandbox.stopped` (a gone container counts as stopped), a new
sandbox starts, and nothing is left running afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import docker
import pytest

from bae.launcher.stack import grpc_serving
from testkit.checks import assert_each_event_once, event_log
from testkit.docker_support import TEST_IMAGE, require_docker
from testkit.live import new_session, register, result, rpc, session_state, terminal
from testkit.stack import mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.docker]

SANDBOX_SERVICE = "baeproto.v1.Sandbox"


class PrivateDockerd:
    """`dockerd` on a socket of its own, in a new network namespace (its sandboxes use network "none").

    Short paths: containerd's socket lives under them."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="baedk-", dir="/tmp"))
        self.url = f"unix://{self.root}/docker.sock"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> None:
        log = open(self.root / "dockerd.log", "ab")
        self.process = subprocess.Popen(
            ["unshare", "--net", "--", "dockerd", "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
             "--pidfile", str(self.root / "docker.pid"), "-H", self.url,
             "--bridge=none", "--iptables=false", "--ip6tables=false"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while not self.answers():
            assert self.process.poll() is None, (self.root / "dockerd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the private dockerd did not start"
            time.sleep(0.2)

    def answers(self) -> bool:
        try:
            client = docker.DockerClient(base_url=self.url, timeout=2)
        except docker.errors.DockerException:
            return False
        try:
            return client.ping()
        except Exception:
            return False
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def load(self, image: str) -> None:
        """Copy an image from the machine's Docker daemon (nothing can be pulled here)."""
        saved = subprocess.run(["docker", "save", image], capture_output=True, check=True).stdout
        subprocess.run(["docker", "-H", self.url, "load"], input=saved, capture_output=True, check=True)

    def containers(self) -> list:
        client = docker.DockerClient(base_url=self.url, timeout=30)
        try:
            return client.containers.list(all=True)
        finally:
            client.close()


@pytest.fixture
def dockerd():
    require_docker()
    if os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("unshare") is None:
        pytest.skip("a private Docker daemon needs root, dockerd and unshare")
    private = PrivateDockerd()
    try:
        private.start()
        private.load(TEST_IMAGE)
        yield private
    finally:
        private.stop()
        shutil.rmtree(private.root, ignore_errors=True)


def sandbox_events(events: list[dict]) -> list[tuple[str, dict]]:
    return [(e["event_type"], e["payload"]) for e in events if e["event_type"].startswith("session.sandbox.")]


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_dockerd_restarts_under_a_live_sandbox(start_stack, mock, dockerd):
    mock.reset()
    stack = start_stack(
        config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN="t0ken", DOCKER_HOST=dockerd.url,
        BAE_SANDBOX_NETWORK="none", BAE_SANDBOX_HOST_ID=f"test-dockerd-{uuid.uuid4().hex[:8]}",
    )
    sid, skey, _ = new_session(stack, available_sandboxes=[TEST_IMAGE])
    register(stack, sid, skey)

    def call(method: str, params: dict | None = None) -> dict:
        return terminal(rpc(stack.client, sid, skey, method, params))

    first = result([call("session.startRemoteSandbox", {"image": TEST_IMAGE})])["sandbox_id"]
    assert result([call("session.execRemoteSandbox", {"command": "echo before"})])["stdout"] == "before\n"
    before = len(event_log(stack, sid, skey))

    dockerd.restart()
    host = stack.stack.settings.sandbox_grpc_addrs[0]
    wait_until(lambda: grpc_serving(host, SANDBOX_SERVICE))
    time.sleep(3)  # the session service's next health poll sees the host again

    # The container died with the daemon: the command fails cleanly and is recorded.
    failed = call("session.execRemoteSandbox", {"command": "echo lost"})["error"]
    assert failed["code"] == -32000 and failed["message"].startswith("sandbox exec failed: "), failed
    (error,) = [p for kind, p in sandbox_events(event_log(stack, sid, skey)[before:]) if kind == "session.sandbox.error"]
    assert (error["phase"], error["sandbox_id"], error["image"]) == ("exec", first, TEST_IMAGE)
    assert dockerd.containers() == []
    assert session_state(stack, sid) == "open"  # a failed command is the sandbox's error, not the session's

    # The handle is still the session's: an explicit stop ends it the usual way.
    stopped = result([call("session.stopRemoteSandbox")])
    assert stopped == {"stopped": True, "image": TEST_IMAGE, "sandbox_id": first}
    stop = {"image": TEST_IMAGE, "sandbox_id": first, "reason": "explicit", "dispatch": "remote"}
    assert sandbox_events(event_log(stack, sid, skey))[-2:] == [
        ("session.sandbox.stop", stop), ("session.sandbox.stopped", {**stop, "unsandboxed": False}),
    ]
    second = result([call("session.startRemoteSandbox", {"image": TEST_IMAGE})])["sandbox_id"]
    assert second != first
    assert result([call("session.execRemoteSandbox", {"command": "echo after"})])["stdout"] == "after\n"

    closed = stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"})
    assert closed.status_code == 200, closed.text
    assert dockerd.containers() == []
    assert session_state(stack, sid) == "closed"
    events = event_log(stack, sid, skey)
    assert_each_event_once(events)
    assert [kind for kind, _ in sandbox_events(events)] == [
        "session.sandbox.available", "session.sandbox.start", "session.sandbox.running", "session.sandbox.error",
        "session.sandbox.stop", "session.sandbox.stopped", "session.sandbox.start", "session.sandbox.running",
        "session.sandbox.stop", "session.sandbox.stopped",
    ]
