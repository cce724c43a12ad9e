"""`pip install` of the built wheel gives working `bae` and `baectl` commands.

Offline and quick: the wheel is built from the tracked files (as a fresh clone
has them, without generated code) with this venv's setuptools and grpcio-tools,
and installed without dependencies into a new venv that sees this venv's
packages through a path entry (which does not pull in the repository itself).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from conftest import ROOT


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(arg) for arg in args], cwd=cwd, capture_output=True, text=True, timeout=120)


def clone(target: Path) -> None:
    """The tracked files, plus the ones added but not yet committed."""
    listed = run("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def test_wheel_installs_working_commands(tmp_path: Path) -> None:
    source, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "venv"
    clone(source)
    assert not (source / "baeproto").exists()
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                "-w", dist, source)
    assert built.returncode == 0, built.stderr
    wheel = next(dist.glob("bae-*.whl"))

    created = run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert created.returncode == 0, created.stderr
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    (site / "project-venv.pth").write_text(sysconfig.get_path("purelib") + "\n")
    installed = run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--quiet", wheel)
    assert installed.returncode == 0, installed.stderr

    version = run(venv / "bin" / "bae", "version", cwd=tmp_path)
    assert (version.returncode, version.stdout) == (0, "bae 0.1.0 (api v1)\n"), version.stderr
    where = run(python, "-c", "import bae, baeproto; print(bae.__file__); print(baeproto.__file__)", cwd=tmp_path)
    assert where.stdout.count(str(site)) == 2, where.stdout + where.stderr
    assert run(python, "-c", "import bae.protos", cwd=tmp_path).returncode == 0

    helped = run(venv / "bin" / "baectl", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: baectl")
    for service in ("gateway", "session", "runner", "sandbox"):
        answered = run(venv / "bin" / "bae", service, "--version", cwd=tmp_path)
        assert (answered.returncode, answered.stdout) == (0, "bae 0.1.0 (api v1)\n"), (service, answered.stderr)


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ ;\[]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
            for line in requirements if line.strip() and not line.lstrip().startswith("#")}


def test_pyproject_declares_what_requirements_pin() -> None:
    """`pip install .` gets every runtime dependency the venv pins, and the test extra the rest."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = names((ROOT / "requirements.txt").read_text().splitlines())
    runtime = names(project["dependencies"])
    test_extra = names(project["optional-dependencies"]["test"])
    assert runtime | test_extra == pinned
    assert not runtime & test_extra
