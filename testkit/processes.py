"""Service processes for tests: `python -m <module>` as a child, its output in a log file."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

from bae.common.internal import InternalPlane
from bae.launcher.stack import grpc_serving
from testkit import ROOT

# The internal token of every service the tests start (unless a test sets its own),
# and the plane a test's own gRPC channels use to reach them.
INTERNAL_TOKEN = secrets.token_hex(32)
TEST_PLANE = InternalPlane(INTERNAL_TOKEN, keepalive=30.0)


def service_env(**variables: str) -> dict[str, str]:
    """This environment minus every BAE_* (a developer's own settings must not leak in), plus `variables`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("BAE_")}
    env["BAE_INTERNAL_TOKEN"] = INTERNAL_TOKEN
    env.update(variables)
    return env


class ServiceProcess:
    def __init__(self, module: str, *args: str, env: dict[str, str], log_path: Path) -> None:
        self.module = module
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_grpc_serving(self, address: str, service: str = "", timeout: float = 30.0) -> None:
        """Block until `address` reports `service` SERVING ("" is the server as a whole)."""
        deadline = time.monotonic() + timeout
        while not grpc_serving(address, service):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.module} exited: {self.log_path.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.module} did not become healthy at {address}")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then the exit code; past `timeout` it is killed and TimeoutExpired raised."""
        try:
            if self.process.poll() is None:
                self.process.terminate()
            return self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._log.close()


class PeakRss:
    """Samples a process's resident memory (VmRSS) from a thread while in use; `peak_kb` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self._path = f"/proc/{pid}/status"
        self.start_kb = self._read()
        self.peak_kb = self.start_kb
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _read(self) -> int:
        with open(self._path) as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, self._read())
            self._stop.wait(0.05)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
