"""`bae migrate` and `bae run` show the database URL they were given, never its password.

Checked on what the commands print, against the tests' real PostgreSQL server (which trusts local
users, so a URL with a password connects and the password is simply not checked).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import ROOT
from testkit.ports import free_port
from testkit.postgres_support import SUPERUSER, PostgresServer, postgres, postgres_url  # noqa: F401 - fixtures
from testkit.processes import service_env
from testkit.stack import stack_env

pytestmark = [pytest.mark.stack, pytest.mark.postgres]

PASSWORD = "pw-0f9c1e7d2b"


def with_password(url: str) -> str:
    return url.replace(f"//{SUPERUSER}@", f"//{SUPERUSER}:{PASSWORD}@", 1)


def migrate(url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bae", "migrate"], cwd=ROOT,
                          env=service_env(BAE_DATABASE_URL=url, BAE_LOG="debug"),
                          capture_output=True, text=True, timeout=60)


def test_migrate_prints_the_url_without_its_password(postgres_url: str) -> None:  # noqa: F811 - the fixture
    url = with_password(postgres_url)
    shown = url.replace(PASSWORD, "***")
    first, again = migrate(url), migrate(url)
    for done in (first, again):
        assert done.returncode == 0, done.stderr
        assert PASSWORD not in done.stdout + done.stderr
        assert done.stdout.endswith(f"): {shown}\n"), done.stdout
    assert first.stdout.startswith("database migrated (applied 0001 ")
    assert again.stdout.startswith("database migrated (already at ")


def test_a_failed_migrate_does_not_print_the_password(postgres: PostgresServer) -> None:  # noqa: F811
    # A database that does not exist, and a port nothing listens on.
    for url in (postgres.url("no_such_database"), f"postgresql://{SUPERUSER}@127.0.0.1:{free_port()}/bae"):
        done = migrate(with_password(url))
        assert done.returncode == 1, done.stdout + done.stderr
        assert "error: " in done.stderr
        assert PASSWORD not in done.stdout + done.stderr


def test_bae_run_shows_the_store_without_its_password(tmp_path: Path, postgres_url: str) -> None:  # noqa: F811
    url = with_password(postgres_url)
    env = stack_env(tmp_path, BAE_DATABASE_URL=url, BAE_LOG="debug")
    # Every service's output comes through the launcher's.
    launcher = subprocess.Popen([sys.executable, "-m", "bae", "run"], cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    banner = []
    try:
        assert launcher.stdout is not None
        for line in launcher.stdout:
            banner.append(line)
            if line.startswith("Press Ctrl-C"):
                break
    finally:
        launcher.send_signal(signal.SIGTERM)
        rest, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, "".join(banner) + rest
    assert f"  store      : {url.replace(PASSWORD, '***')}\n" in banner, "".join(banner)
    assert PASSWORD not in "".join(banner) + rest
