"""A real PostgreSQL server for the tests, started from the Debian `postgresql` package's binaries.

`initdb` and `pg_ctl` run as an unprivileged user (PostgreSQL refuses root), into
a temporary directory, on a free port, with the socket in that directory. One
server per test process, started on first use and stopped at exit; every caller
gets a database of its own (`database_url`).

No binaries: tests skip, unless BAE_REQUIRE_POSTGRES=1 makes that a failure.
BAE_TEST_STORE=postgresql makes every stack the tests launch use PostgreSQL
(testkit.stack.stack_env).
"""

from __future__ import annotations

import atexit
import glob
import hashlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

SUPERUSER = "postgres"
SERVICE_USER = "baetest"  # the system user the server runs as when the tests run as root


def on_postgres() -> bool:
    """Whether BAE_TEST_STORE asks every launched stack to use PostgreSQL."""
    return os.environ.get("BAE_TEST_STORE", "sqlite").strip().lower() == "postgresql"


def sqlite_only(reason: str) -> pytest.MarkDecorator:
    """Skip a test that is about the SQLite file itself when the suite runs on PostgreSQL."""
    return pytest.mark.skipif(on_postgres(), reason=f"SQLite only: {reason}")


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _unavailable(reason: str) -> None:
    if os.environ.get("BAE_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"PostgreSQL is required (BAE_REQUIRE_POSTGRES=1) but {reason}")
    pytest.skip(f"no PostgreSQL for this test: {reason} (install the Debian postgresql package)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _service_user() -> str | None:
    """The user to run the server as: None when we are not root (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
                       check=True, capture_output=True)
    return SERVICE_USER


class PostgresServer:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.user = _service_user()
        self.root = Path(tempfile.mkdtemp(prefix="bae-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._created: set[str] = set()
        self._lock = threading.Lock()

    def _as_user(self, *command: str) -> subprocess.CompletedProcess:
        argv = [str(self.bin_dir / command[0]), *command[1:]]
        if self.user is not None:
            argv = ["runuser", "-u", self.user, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        if not self.data.exists():
            if self.user is not None:
                shutil.chown(self.root, self.user)
            self._check(self._as_user("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                                      "--encoding=UTF8", "--locale=C.UTF-8"))
        # Listens on loopback only, trusts local users: a throwaway server for tests. Durability
        # is not under test here, so fsync is off (the SQLite tests cover that).
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300")
        self._check(self._as_user("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                                  "-o", options, "-w", "-t", "60", "start"))

    def halt(self) -> None:
        """Stop the server, keeping its data (`start` brings it back): connections are cut, commits kept."""
        self._check(self._as_user("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop"))

    def stop(self) -> None:
        self._as_user("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def _check(self, done: subprocess.CompletedProcess) -> None:
        if done.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{done.args[:6]} failed: {done.stdout}{done.stderr}{tail}")

    def url(self, database: str) -> str:
        """The URL as users write it; the store picks the driver."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def database_url(self, name: str) -> str:
        """A database of its own for `name` (made on first use), as a URL."""
        database = "t_" + hashlib.sha256(name.encode()).hexdigest()[:20]
        with self._lock:
            if database not in self._created:
                psql = [str(self.bin_dir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER,
                        "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-qc", f'CREATE DATABASE "{database}"']
                self._check(subprocess.run(psql, capture_output=True, text=True, timeout=60))
                self._created.add(database)
        return self.url(database)


_server: PostgresServer | None = None
_failure: str | None = None


def bin_dir_or_skip() -> Path:
    bin_dir = _bin_dir()
    if bin_dir is None:
        _unavailable("no /usr/lib/postgresql/*/bin/initdb")
    assert bin_dir is not None
    return bin_dir


def server() -> PostgresServer:
    """The test process's PostgreSQL server, started on first use (skips or fails without one)."""
    global _server, _failure
    if _server is None and _failure is None:
        bin_dir = _bin_dir()
        if bin_dir is None:
            _failure = "no /usr/lib/postgresql/*/bin/initdb"
        else:
            candidate = PostgresServer(bin_dir)
            try:
                candidate.start()
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                candidate.stop()
                _failure = f"the server did not start: {exc}"
            else:
                _server = candidate
                atexit.register(candidate.stop)
    if _server is None:
        _unavailable(_failure or "it is not running")
    assert _server is not None
    return _server


@pytest.fixture(scope="session")
def postgres() -> PostgresServer:
    return server()


@pytest.fixture
def postgres_url(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    """A fresh database for this test."""
    return postgres.database_url(request.node.nodeid)


# The stores a store test runs on: a SQLite file, in this process (unit), and a database on the tests'
# PostgreSQL server (postgres). A module runs each of its tests on both with
#     pytestmark = pytest.mark.parametrize("store_url", STORES, indirect=True)
STORES = [pytest.param("sqlite", marks=pytest.mark.unit), pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of the kind the test is parametrized with (STORES)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/nested/bae.db"
    return server().database_url(request.node.nodeid)
