"""bae-client installs alone: its wheel and httpx (with httpx's own dependencies) into a clean venv, well
under 40 MB, nothing of the server. Then the README's client example, as the README shows it, runs with
that venv's python against a stack with the demo provider.

The dependencies come from the wheelhouse the images install from (deploy/wheels, filled as
test_wheel.py fills it) when it holds them, else from the package index.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from testkit import ROOT
from testkit.ports import free_port
from testkit.stack import RunningStack, launch_demo_stack

pytestmark = pytest.mark.stack

LIMIT = 40 * 1024 * 1024
WHEELHOUSE = ROOT / "deploy" / "wheels"


def run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(arg) for arg in args], capture_output=True, text=True, timeout=600,
                          **kwargs)  # type: ignore[call-overload]


def readme_example() -> str:
    """The Python block of the README's "Driving a session from a program" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Driving a session from a program\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, "the section shows one Python example"
    return str(blocks[0])


def size(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file() and not file.is_symlink())


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = launch_demo_stack(tmp_path_factory.mktemp("demo"))
    yield running
    running.close()


def test_bae_client_installs_alone_and_runs_the_readme_example(tmp_path: Path, demo: RunningStack) -> None:
    source, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "venv"
    # Built from a copy: a build writes its egg-info and build/ beside the sources.
    shutil.copytree(ROOT / "clients" / "python", source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info",
                                                                                       "build"))
    # Nothing of this process's environment (PYTHONPATH) reaches pip or the new venv.
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    built = run(sys.executable, "-m", "pip", "--isolated", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                "-w", dist, source, env=clean)
    assert built.returncode == 0, built.stderr
    wheel = next(dist.glob("bae_client-0.1.0-*.whl"))

    created = run(sys.executable, "-m", "venv", "--without-pip", venv, env=clean)
    assert created.returncode == 0, created.stderr
    python = venv / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--isolated", "--python", python, "install", "--quiet", "--no-compile")
    installed = run(*pip, "--no-index", "--find-links", WHEELHOUSE, wheel, env=clean)
    if installed.returncode != 0:  # a wheelhouse without httpx yet: from the index
        installed = run(*pip, wheel, env=clean)
    assert installed.returncode == 0, installed.stderr
    listed = run(sys.executable, "-m", "pip", "--isolated", "--python", python, "list", "--format=freeze", env=clean)
    names = {line.split("==")[0].lower() for line in listed.stdout.split()}
    assert {"bae-client", "httpx"} <= names and not names & {"bae", "grpcio", "protobuf", "sqlalchemy"}, names
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert size(site) < LIMIT, f"bae-client installs {size(site) / 1e6:.1f} MB"

    profile = demo.create_profile(f"readme-{free_port()}", primary="demo", allowed_tools=["get_current_time"])
    key = demo.create_key(profile["id"])["key"]
    example = tmp_path / "example.py"
    example.write_text(readme_example())
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "BAE_ADDR": demo.client_url.removeprefix("http://"), "BAE_CLIENT_KEY": key}
    ran = run(python, "-I", example, cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert "· tool.call" in lines and "· server.message.send" in lines
    assert lines[-1] == "[demo] get_current_time returned: 18:26 UTC"
    where = run(python, "-I", "-c", "import bae_client; print(bae_client.__file__)", cwd=tmp_path, env=env)
    assert where.stdout.startswith(str(site)), where.stdout
