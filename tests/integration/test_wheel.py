"""A fresh clone installs with `pip install` and with `pipx install`, dependencies and all.

Each install goes into a new environment that sees nothing of this venv or this repository. Its
dependencies, and the build's own requirements (pip builds in isolation, as `pip install .` does),
come from the wheelhouse the container images install from (deploy/wheels) with `--no-index`: the
declared dependencies must be enough, and the tests run offline once the wheelhouse is filled. A test
session fills it when a pinned wheel is missing, with the command `make compose-test` uses
(deploy/compose-test/run.sh) plus pip itself, which pipx installs into its shared environment; pip's
cache keeps that quick.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from testkit import ROOT

pytestmark = pytest.mark.stack

VERSION = "bae 0.1.0 (api v1)\n"
CONSOLE_STATIC = "bae/services/gateway/console/static"


def console_files(source: Path) -> set[str]:
    return {path.relative_to(source).as_posix() for path in (source / CONSOLE_STATIC).rglob("*") if path.is_file()}
SERVICES = ("gateway", "session", "runner", "sandbox")
WHEELHOUSE = ROOT / "deploy" / "wheels"
FILL = ("-m", "pip", "wheel", "--quiet", "-w", str(WHEELHOUSE), "-r", "requirements.txt", "-c", "constraints.txt",
        "setuptools>=70.1", "pip")
# Only the wheelhouse: no index, and (--isolated) none of this machine's pip settings from the environment.
OFFLINE = ("--no-index", "--find-links", str(WHEELHOUSE))
# Byte-compiling is most of an install's time, and nothing here depends on it.
INSTALL = (*OFFLINE, "--no-compile")

# Imports every module of the installed packages. Skipped: the migration scripts (they run only
# under Alembic) and the two __main__ modules that run their command when imported.
IMPORT_ALL = """
import importlib, pkgutil
import bae
skipped = ("bae.__main__", "bae.ctl.__main__")
names = [info.name for info in pkgutil.walk_packages(bae.__path__, "bae.")
         if ".migrations" not in info.name and info.name not in skipped]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(arg) for arg in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def clone(target: Path) -> None:
    """The tracked files, plus the ones added but not yet committed."""
    listed = run("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    assert not (target / "bae" / "proto").exists()  # generated at build time, as on a fresh clone


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_wheels() -> list[str]:
    """What the installs may need that the wheelhouse lacks: a pinned version, setuptools or pip."""
    held = {(canonical(wheel.name.split("-")[0]), wheel.name.split("-")[1]) for wheel in WHEELHOUSE.glob("*.whl")}
    pins = [line.strip().split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    missing = [f"{name}=={version}" for name, version in pins if (canonical(name), version) not in held]
    return missing + [name for name in ("setuptools", "pip") if name not in {held_name for held_name, _ in held}]


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    descriptor = os.open(WHEELHOUSE, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # another test session may be filling it
        if missing_wheels():
            filled = run(sys.executable, *FILL, cwd=ROOT, timeout=900)
            assert filled.returncode == 0, filled.stderr
        assert not missing_wheels()
    finally:
        os.close(descriptor)
    return WHEELHOUSE


def build_client(source: Path, dist: Path) -> Path:
    """The bae-client wheel (clients/python), which the server's distribution depends on: built from the same
    clone, it is found beside the wheelhouse."""
    built = run(sys.executable, "-m", "pip", "--isolated", "wheel", *OFFLINE, "--no-deps", "--quiet", "-w", dist,
                source / "clients" / "python")
    assert built.returncode == 0, built.stderr
    return next(dist.glob("bae_client-*.whl"))


def clean_env(bin_dir: Path, tmp: Path, **extra: str) -> dict[str, str]:
    """No BAE_* settings, no PYTHONPATH: only the install's commands on PATH."""
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp), "LANG": "C.UTF-8", **extra}


def assert_commands_work(bin_dir: Path, tmp: Path) -> None:
    """The console scripts answer, and `bae migrate` sets up a store (SQLAlchemy, Alembic, the scripts)."""
    for command in (["bae", "version"], *(["bae", service, "--version"] for service in SERVICES)):
        answered = run(bin_dir / command[0], *command[1:], cwd=tmp, env=clean_env(bin_dir, tmp))
        assert (answered.returncode, answered.stdout) == (0, VERSION), (command, answered.stderr)
    helped = run(bin_dir / "baectl", "--help", cwd=tmp, env=clean_env(bin_dir, tmp))
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: baectl")

    store = tmp / "store" / "bae.db"
    migrated = run(bin_dir / "bae", "migrate", cwd=tmp,
                   env=clean_env(bin_dir, tmp, BAE_DATABASE_URL=f"sqlite:///{store}"))
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("database migrated (applied 0001 "), migrated.stdout
    assert migrated.stdout.endswith(f": sqlite:///{store}\n")


def test_pip_installs_the_wheel_and_its_dependencies_into_a_clean_venv(wheelhouse: Path, tmp_path: Path) -> None:
    source, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "venv"
    clone(source)
    build_client(source, dist)
    built = run(sys.executable, "-m", "pip", "--isolated", "wheel", *OFFLINE, "--no-deps", "--quiet", "-w", dist,
                source)
    assert built.returncode == 0, built.stderr
    wheel = next(dist.glob("bae-0*.whl"))
    # The web console's pages, scripts and vendored libraries ship in the wheel: it fetches nothing at runtime.
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.startswith(f"{CONSOLE_STATIC}/")}
    assert shipped == console_files(source), "console files missing from the wheel"

    created = run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert created.returncode == 0, created.stderr
    python = venv / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--isolated", "--python", python)
    installed = run(*pip, "install", *INSTALL, "--find-links", dist, "--quiet", wheel)
    assert installed.returncode == 0, installed.stderr
    consistent = run(*pip, "check")
    assert consistent.returncode == 0, consistent.stdout
    assert_commands_work(venv / "bin", tmp_path)

    # Everything comes from the new venv: nothing from this repository or its venv.
    env = clean_env(venv / "bin", tmp_path)
    paths = run(python, "-c", "import sys, bae, bae.proto; print(bae.__file__, bae.proto.__file__, *sys.path)",
                cwd=tmp_path, env=env)
    assert paths.returncode == 0, paths.stderr
    assert not [path for path in paths.stdout.split() if path.startswith(str(ROOT))], paths.stdout
    assert all(path.startswith(f"{venv}/") for path in paths.stdout.split()[:2]), paths.stdout
    # Every module imports with only the declared dependencies installed.
    imported = run(python, "-c", IMPORT_ALL, cwd=tmp_path, env=env)
    assert imported.returncode == 0, imported.stderr
    assert int(imported.stdout) > 100


def test_pipx_installs_a_fresh_clone(wheelhouse: Path, tmp_path: Path) -> None:
    source, home = tmp_path / "src", tmp_path / "pipx"
    clone(source)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "PIPX_HOME": str(home),
           "PIPX_BIN_DIR": str(home / "bin"), "PIPX_MAN_DIR": str(home / "man")}
    # As the README says: the client library, which the server depends on, from its directory first.
    installed = run(sys.executable, "-m", "pipx", "install", "--preinstall", source / "clients" / "python",
                    "--pip-args", shlex.join(("--isolated", *INSTALL)), ".", cwd=source, env=env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "installed package bae 0.1.0" in installed.stdout
    assert_commands_work(home / "bin", tmp_path)


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ ;\[]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
            for line in requirements if line.strip() and not line.lstrip().startswith("#")}


def test_pyproject_declares_what_requirements_pin() -> None:
    """`pip install .` gets every runtime dependency the venv pins, and the test extra the rest (bae-client is
    built from this repository, clients/python, and installed from there)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = names((ROOT / "requirements.txt").read_text().splitlines())
    runtime = names(project["dependencies"]) - {"bae-client"}
    test_extra = names(project["optional-dependencies"]["test"])
    assert runtime | test_extra == pinned
    assert not runtime & test_extra
