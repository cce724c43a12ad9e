"""Docker for tests: is the Docker daemon usable here, which image to use, and cleanup by label.

CI runs .ci/docker-setup.sh first (it installs docker.io, starts dockerd and builds
TEST_IMAGE from busybox-static); elsewhere the Docker tests skip with a reason.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from testkit import ROOT
from testkit.ports import free_port
from testkit.processes import ServiceProcess, service_env
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

TEST_IMAGE = "bae-busybox:test"
SETUP_HINT = "run `bash .ci/docker-setup.sh` as root to set Docker up"


@functools.cache
def docker_skip_reason() -> str | None:
    """None when Docker works and TEST_IMAGE exists; otherwise why the Docker tests skip."""
    try:
        import docker
        import docker.errors

        client = docker.from_env(timeout=10)
    except Exception as exc:  # the Docker daemon is missing or unreachable
        return f"Docker daemon not reachable ({exc}); {SETUP_HINT}"
    try:
        client.ping()
        client.images.get(TEST_IMAGE)
    except docker.errors.ImageNotFound:
        return f"test image {TEST_IMAGE} is missing; {SETUP_HINT}"
    except Exception as exc:
        return f"Docker daemon not usable ({exc}); {SETUP_HINT}"
    finally:
        client.close()
    return None


def require_docker() -> None:
    """Skip without Docker, except in CI (BAE_REQUIRE_DOCKER=1), where a missing Docker daemon is a failure."""
    reason = docker_skip_reason()
    if reason is not None:
        if os.environ.get("BAE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"Docker is required here: {reason}")
        pytest.skip(reason)


def docker_client():
    import docker

    return docker.from_env(timeout=30)


def remove_containers(label: str) -> int:
    """Force-remove every container carrying `label` (`key=value`); returns how many."""
    client = docker_client()
    try:
        containers = client.containers.list(all=True, filters={"label": label}, ignore_removed=True)
        for container in containers:
            try:
                container.remove(force=True)
            except Exception:  # already gone (auto-remove) or going
                pass
        return len(containers)
    finally:
        client.close()


def containers_with(label: str) -> list:
    client = docker_client()
    try:
        # A container another test's host removes between the listing and its inspection is gone, not an error.
        return client.containers.list(all=True, filters={"label": label}, ignore_removed=True)
    finally:
        client.close()


def sandboxes_of_hosts(prefix: str) -> list:
    """Every sandbox container whose host id starts with `prefix` (labels filter on exact values only)."""
    return [c for c in containers_with("bae.sandbox=1") if c.labels.get("bae.host", "").startswith(prefix)]


class SandboxHostProcess(ServiceProcess):
    """`python -m bae.services.sandbox` as a child process on a free loopback port."""

    def __init__(self, host_id: str, address: str | None = None, **env: str) -> None:
        """`address`: listen there (e.g. to stand in for a host that was killed) instead of a free port."""
        self.address = address or f"127.0.0.1:{free_port()}"
        self.host_id = host_id
        self.label = f"bae.host={host_id}"
        log = tempfile.NamedTemporaryFile(prefix=f"sandbox-{host_id}-", suffix=".log", delete=False)
        log.close()
        super().__init__(
            "bae.services.sandbox",
            env=service_env(
                BAE_SANDBOX_LISTEN_ADDR=self.address,
                BAE_SANDBOX_HOST_ID=host_id,
                BAE_SHUTDOWN_TIMEOUT="3",
                BAE_SANDBOX_HEALTH_INTERVAL="0.5",
                **env,
            ),
            log_path=Path(log.name),
        )

    def wait_serving(self, timeout: float = 20.0) -> None:
        self.wait_grpc_serving(self.address, "baeproto.v1.Sandbox", timeout)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def terminate(self) -> None:
        """SIGTERM (SIGKILL after 10 s); needs no Docker."""
        try:
            super().stop(timeout=10)
        except subprocess.TimeoutExpired:
            pass  # killed by ServiceProcess.stop

    def stop(self) -> None:
        """terminate(), then remove whatever the host left behind."""
        self.terminate()
        remove_containers(self.label)


HARNESS_SCRIPT = ROOT / "tests" / "harness" / "fake-harness"


def ensure_harness_image() -> str:
    """TEST_IMAGE plus /bin/fake-harness (the subagent tests' CLI), built once from local images; tagged
    by the script's content, so that a changed script is built anew."""
    import hashlib
    import io
    import tarfile

    import docker.errors

    data = HARNESS_SCRIPT.read_bytes()
    image = f"bae-harness:{hashlib.sha256(data).hexdigest()[:12]}"
    client = docker_client()
    try:
        try:
            client.images.get(image)
            return image
        except docker.errors.ImageNotFound:
            pass
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo("fake-harness")
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        container = client.containers.create(TEST_IMAGE, ["true"])
        try:
            container.put_archive("/bin", archive.getvalue())
            repository, tag = image.split(":")
            container.commit(repository, tag)
        finally:
            container.remove(force=True)
        return image
    finally:
        client.close()


@contextmanager
def stack_with_sandbox_hosts(tmp: Path, provider_url: str, host_prefix: str, **env: str) -> Iterator[RunningStack]:
    """A stack for sandbox tests; once it has stopped, no host whose id starts with `host_prefix` holds a container."""
    running = launch_stack(tmp, mock_provider_toml(provider_url), **env)
    try:
        yield running
    finally:
        running.close()
        if docker_skip_reason() is None:
            assert sandboxes_of_hosts(host_prefix) == []


@pytest.fixture
def start_host():
    """start_host(host_id=None, **env) -> a serving sandbox host (a unique id unless given); none of its
    containers outlives the test."""
    require_docker()
    hosts: list[SandboxHostProcess] = []

    def start(host_id: str | None = None, **env: str) -> SandboxHostProcess:
        host = SandboxHostProcess(host_id or f"test-{uuid.uuid4().hex[:12]}", **env)
        hosts.append(host)
        host.wait_serving()
        return host

    yield start
    for host in hosts:
        host.stop()
        assert containers_with(host.label) == [], "a test left a container behind"
