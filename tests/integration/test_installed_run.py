"""`bae run` from a wheel installed into a clean venv, started in a directory of the user's.

Relative settings resolve against that directory, files land there (never in site-packages), the admin key
sits beside its store and is never replaced, and a taken port is one line before anything starts. The wheel
is built and installed as test_wheel.py does it (offline, from the wheelhouse), once for the module.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from test_wheel import INSTALL, OFFLINE, clean_env, clone, run, wheelhouse  # noqa: F401  (a fixture)
from testkit.ports import free_port

pytestmark = pytest.mark.stack

PROVIDER = '[[providers.entries]]\nname = "{name}"\nprovider = "anthropic"\nmodel = "m"\nauth_token = "t"\n'


@pytest.fixture(scope="module")
def installed(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The bin directory of a venv holding the wheel (and, once it exists, the bae-client wheel it needs)."""
    tmp = tmp_path_factory.mktemp("installed")
    source, dist, venv = tmp / "src", tmp / "dist", tmp / "venv"
    clone(source)
    sources = [source / "clients" / "python", source] if (source / "clients" / "python" / "pyproject.toml").is_file() \
        else [source]
    for directory in sources:
        built = run(sys.executable, "-m", "pip", "--isolated", "wheel", *OFFLINE, "--find-links", dist, "--no-deps",
                    "--quiet", "-w", dist, directory)
        assert built.returncode == 0, built.stderr
    created = run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert created.returncode == 0, created.stderr
    wheel = next(dist.glob("bae-[0-9]*.whl"))
    installed = run(sys.executable, "-m", "pip", "--isolated", "--python", venv / "bin" / "python", "install",
                    *INSTALL, "--find-links", dist, "--quiet", wheel)
    assert installed.returncode == 0, installed.stderr
    return venv / "bin"


def ports() -> dict[str, str]:
    return {name: f"127.0.0.1:{free_port()}" for name in (
        "BAE_ADDR", "BAE_ADMIN_ADDR", "BAE_SESSION_GRPC_ADDR", "BAE_RUNNER_GRPC_ADDR", "BAE_SANDBOX_GRPC_ADDRS")}


class Run:
    """`bae run` in `cwd`: started, its banner read until it is running or has exited."""

    def __init__(self, bin_dir: Path, cwd: Path, env: dict[str, str]) -> None:
        self.env = env
        self.process = subprocess.Popen([bin_dir / "bae", "run"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.banner = []
        for line in self.process.stdout:
            self.banner.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        self.running = "BAE is running.\n" in self.banner

    def banner_value(self, label: str) -> str:
        return next(line.split(":", 1)[1].strip() for line in self.banner if line.strip().startswith(label))

    def stop(self) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        _, stderr = self.process.communicate(timeout=60)
        return self.process.returncode, stderr


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    work = tmp_path / "work"
    work.mkdir()
    yield work


def files_under(directory: Path) -> set[str]:
    return {path.relative_to(directory).as_posix() for path in directory.rglob("*") if path.is_file()}


def test_relative_paths_land_in_the_callers_directory_and_a_key_is_never_replaced(
        installed: Path, workdir: Path, tmp_path: Path) -> None:
    venv = installed.parent
    before = files_under(venv)
    (workdir / "cfg.toml").write_text(PROVIDER.format(name="from-relative-config"))
    env = clean_env(installed, tmp_path, BAE_DB_PATH="stores/one.db", BAE_CONFIG="cfg.toml", **ports())
    first = Run(installed, workdir, env)
    try:
        assert first.running, "".join(first.banner) + first.stop()[1]
        key_file = workdir / "stores" / "admin-key.pem"
        assert first.banner_value("admin key") == str(key_file)
        assert first.banner_value("store") == f"sqlite:///{workdir / 'stores' / 'one.db'}"
        key = key_file.read_text().strip()
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        # The config was read from the caller's directory.
        providers = httpx.get(f"http://{env['BAE_ADMIN_ADDR']}/admin/v1/providers",
                              headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert providers.status_code == 200, providers.text
        assert [item["name"] for item in providers.json()["items"]] == ["from-relative-config"]
    finally:
        code, stderr = first.stop()
    assert code == 0, stderr
    assert {"stores/one.db", "stores/admin-key.pem", "cfg.toml"} <= files_under(workdir)
    assert not {name for name in files_under(workdir) if not name.startswith("stores/")} - {"cfg.toml"}
    # Nothing written into the install (site-packages or elsewhere in the venv), bytecode aside.
    assert {name for name in files_under(venv) - before if not name.endswith(".pyc")} == set()

    # Another store: a key file of its own beside it; the first one is untouched.
    kept = key_file.read_bytes(), key_file.stat().st_mtime_ns
    second = Run(installed, workdir, {**env, "BAE_DB_PATH": "stores2/two.db", **ports()})
    try:
        assert second.running, "".join(second.banner) + second.stop()[1]
        assert second.banner_value("admin key") == str(workdir / "stores2" / "admin-key.pem")
    finally:
        code, stderr = second.stop()
    assert code == 0, stderr
    assert (key_file.read_bytes(), key_file.stat().st_mtime_ns) == kept
    assert (workdir / "stores2" / "admin-key.pem").read_text().strip() != key

    # A key file that is not the store's: one line saying what to do, nothing started, the file untouched.
    mismatch = Run(installed, workdir, {**env, "BAE_DB_PATH": "stores2/two.db",
                                        "BAE_ADMIN_KEY_FILE": "stores/admin-key.pem", **ports()})
    code, stderr = mismatch.stop()
    assert not mismatch.running and code == 1
    assert (f"error: admin key file {key_file} holds no admin key of the store sqlite:///{workdir}/stores2/two.db: "
            "set BAE_ADMIN_KEY_FILE to this store's key file, or move the file aside and start once with "
            "--rotate-admin-key to write a new key\n") in stderr
    # A new store given an existing key file: it belongs to another store.
    foreign = Run(installed, workdir, {**env, "BAE_DB_PATH": "stores3/three.db",
                                       "BAE_ADMIN_KEY_FILE": "stores/admin-key.pem", **ports()})
    code, stderr = foreign.stop()
    assert not foreign.running and code == 1
    assert (f"error: admin key file {key_file} exists but the store sqlite:///{workdir}/stores3/three.db has no "
            "admin key yet, so the file belongs to another store; set BAE_ADMIN_KEY_FILE to a new path for this "
            "store's key (or move the file aside)\n") in stderr
    assert (key_file.read_bytes(), key_file.stat().st_mtime_ns) == kept


@pytest.mark.parametrize("variable", ["BAE_ADDR", "BAE_ADMIN_ADDR", "BAE_SESSION_GRPC_ADDR", "BAE_RUNNER_GRPC_ADDR",
                                      "BAE_SANDBOX_GRPC_ADDRS"])
def test_a_port_someone_else_holds_is_one_line_before_anything_starts(
        installed: Path, workdir: Path, tmp_path: Path, variable: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        address = "127.0.0.1:%d" % holder.getsockname()[1]
        env = clean_env(installed, tmp_path, **{**ports(), variable: address})
        result = subprocess.run([installed / "bae", "run"], cwd=workdir, env=env, capture_output=True, text=True,
                                timeout=60)
    assert result.returncode == 1
    assert result.stderr == (f"error: {address} is already in use ({variable}); stop what listens there or set "
                             f"{variable} to a free address\n")
    assert "running" not in result.stdout
    assert os.listdir(workdir) == []  # nothing started, nothing written
