"""Every guide in docs/guides/ runs as written (testkit/guides.py): one test per guide, against `bae run --demo`
started from the venv's own entry point in a fresh directory, the way the guide tells a reader to."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from testkit import ROOT, guides, postgres_support
from testkit.docker_support import require_docker
from testkit.ports import free_port
from testkit.stack import stack_env

pytestmark = pytest.mark.stack

GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
BIN = Path(sys.executable).parent
GUIDE_TIMEOUT = 300.0
START_TIMEOUT = 60.0
BIND_ATTEMPTS = 3


def marks(path: Path) -> list[pytest.MarkDecorator]:
    needs = guides.read(path).needs
    return [getattr(pytest.mark, need) for need in sorted(needs)]


def python_path() -> str:
    """This checkout first: the stack and the guide run the code under test (the repository, and the
    client library's source beside it), whatever else the venv has installed."""
    paths = [str(ROOT), str(ROOT / "clients" / "python")]
    inherited = os.environ.get("PYTHONPATH")
    return os.pathsep.join([*paths, *([inherited] if inherited else [])])


def base_env(work: Path) -> dict[str, str]:
    """The stack's environment: every port free, the store and its key files under ./data."""
    env = stack_env(work / "data")
    env.pop("BAE_CONFIG", None)
    env["BAE_DEMO_PROVIDER_ADDR"] = f"127.0.0.1:{free_port()}"
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env["PYTHONPATH"] = python_path()
    env.pop("VIRTUAL_ENV", None)
    return env


class DemoStack:
    """`bae run --demo` as a reader runs it, in `work`; its output in work/bae-run.log."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work, self.env = work, env
        self.log_path = work / "bae-run.log"
        with open(self.log_path, "ab") as log:
            # A session of its own: stopping it stops every service it started, even if it dies first.
            self.process = subprocess.Popen([str(BIN / "bae"), "run", "--demo"], cwd=work, env=env,
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        url = f"http://{self.env['BAE_ADDR']}/healthz"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"`bae run --demo` exited with {self.process.returncode}:\n{self.log()}")
            if "BAE is running" in self.log():
                try:
                    if httpx.get(url, timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"`bae run --demo` was not ready in {START_TIMEOUT:.0f} s:\n{self.log()}")

    def stop(self) -> None:
        """As Ctrl-C would; what is left past its shutdown is killed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)


@contextmanager
def demo_stack(work: Path, env: dict[str, str]) -> Iterator[DemoStack]:
    attempts = BIND_ATTEMPTS
    while True:
        stack = DemoStack(work, env)
        try:
            stack.wait_ready()
            break
        except RuntimeError:
            stack.stop()
            attempts -= 1
            # A port free_port found may be taken before the service binds it: new ports, once more.
            if attempts and "bind" in stack.log():
                env = {**base_env(work), **{k: v for k, v in env.items() if k == "BAE_CONFIG"}}
                continue
            raise
    try:
        yield stack
    finally:
        stack.stop()


def guide_env(stack_env_: dict[str, str], standalone: bool) -> dict[str, str]:
    """What the guide's program sees: the client and admin addresses and the admin key file, the venv's bin
    first on PATH; a guide that starts its own processes gets the whole stack's environment (its free ports)."""
    if standalone:
        env = {key: value for key, value in stack_env_.items() if key != "BAE_INTERNAL_TOKEN"}
    else:
        env = {key: value for key, value in stack_env_.items() if not key.startswith("BAE_")}
        env.update({key: stack_env_[key] for key in ("BAE_ADDR", "BAE_ADMIN_ADDR")})
    env["BAE_ADMIN_KEY_FILE"] = "data/admin-key.pem"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.mark.parametrize("path", [pytest.param(path, id=path.stem, marks=marks(path)) for path in GUIDES])
def test_guide(path: Path, tmp_path: Path) -> None:
    guide = guides.read(path)
    if "docker" in guide.needs:
        require_docker()
    work = tmp_path / "guide"
    (work / "data").mkdir(parents=True)
    env = base_env(work)
    if "postgres" in guide.needs:
        # The guide's own database, as DATABASE_URL (a guide says in its text what it uses it for).
        env["DATABASE_URL"] = postgres_support.server().database_url(str(work))
    guides.write_files(guide, work)
    if "bae-config.toml" in guide.files:
        env["BAE_CONFIG"] = "bae-config.toml"

    def run_guide(stack_environment: dict[str, str]) -> None:
        try:
            done = subprocess.run([sys.executable, "-m", "testkit.guides", str(path)], cwd=work,
                                  env=guide_env(stack_environment, guide.stack == "none"), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=GUIDE_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            output = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            pytest.fail(f"{path.name} did not finish in {GUIDE_TIMEOUT:.0f} s; its output:\n{output}")
        if done.returncode != 0:
            pytest.fail(f"{path.name} failed (exit {done.returncode}); its output:\n{done.stdout}", pytrace=False)
        print(done.stdout)  # shown with `pytest -rP`: what a reader would see

    if guide.stack == "none":
        run_guide(env)
        return
    with demo_stack(work, env) as stack:
        try:
            run_guide(stack.env)
        except BaseException:
            print(f"--- bae run --demo\n{stack.log()[-6000:]}")
            raise


RUNNER_GUIDE = """\
```python
import os
value = open("note.txt").read().strip()
os.environ["GUIDE_VALUE"] = value
```

```sh
echo "sh sees $GUIDE_VALUE" > seen.txt
```

```python
assert value == "from a file"
print("second block")
```

```text file=note.txt
from a file
```

```sh
echo "to stderr" >&2
false
```

```python
print("never")
```
"""


def test_the_runner_shares_one_namespace_and_the_environment_and_stops_at_the_first_failure(tmp_path: Path) -> None:
    guide = tmp_path / "runner.md"
    guide.write_text(RUNNER_GUIDE)
    done = subprocess.run([sys.executable, "-m", "testkit.guides", str(guide)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": python_path()}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (tmp_path / "seen.txt").read_text() == "sh sees from a file\n"
    assert "second block" in done.stdout and "never" not in done.stdout
    assert "to stderr\nFAILED: runner.md:21: the sh block exited with 1" in done.stdout
    assert done.stderr == ""


def test_a_traceback_names_the_guide_and_its_line(tmp_path: Path) -> None:
    guide = tmp_path / "raises.md"
    guide.write_text("# A guide\n\n```python\nx = 1\nraise ValueError(f'boom {x}')\n```\n")
    done = subprocess.run([sys.executable, "-m", "testkit.guides", str(guide)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": python_path()}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f'File "{guide}", line 5, in <module>' in done.stdout
    assert "ValueError: boom 1" in done.stdout and "FAILED: raises.md:4: the python block raised" in done.stdout
