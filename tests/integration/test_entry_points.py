"""Every entry point answers --help and --version without starting anything; `bae` dispatches to them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testkit import ROOT
from testkit.processes import service_env

pytestmark = pytest.mark.stack

VERSION = "bae 0.1.0 (api v1)\n"


def run(*args: str) -> subprocess.CompletedProcess:
    # An unusable BAE_ADDR: an entry point that tried to start would fail, not answer.
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=service_env(BAE_ADDR="not-an-address"),
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("service", ["gateway", "session", "runner", "sandbox"])
def test_services_answer_help_and_version(service: str) -> None:
    helped = run("-m", f"services.{service}", "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage:")
    for command in (["-m", f"services.{service}", "--version"], ["-m", "bae", service, "-V"]):
        answered = run(*command)
        assert (answered.stdout, answered.returncode) == (VERSION, 0), answered.stderr
    assert run("-m", f"services.{service}", "--bogus").returncode == 2


def test_bae_command() -> None:
    assert run("-m", "bae", "version").stdout == VERSION
    assert run("-m", "bae", "--version").stdout == VERSION
    helped = run("-m", "bae", "help")
    assert helped.returncode == 0 and "migrate" in helped.stdout
    assert run("-m", "bae").stdout == helped.stdout
    unknown = run("-m", "bae", "frobnicate")
    assert unknown.returncode == 2 and unknown.stderr.startswith("bae: unknown command 'frobnicate'")
    assert run("-m", "bae", "run", "--help").stdout.startswith("usage: bae run")
    assert run("-m", "bae", "migrate", "--help").stdout.startswith("usage:")
    # Settings are read only once serving: a bad one is then a usage error (exit 2).
    assert run("-m", "bae", "gateway").returncode == 2


def test_a_sandbox_host_refuses_the_hosts_network_at_start() -> None:
    env = service_env(BAE_SANDBOX_LISTEN_ADDR="127.0.0.1:1", BAE_SANDBOX_NETWORK="host")
    result = subprocess.run([sys.executable, "-m", "bae.services.sandbox"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith('error: BAE_SANDBOX_NETWORK: "host" would give sandboxes the host\'s network')


def test_the_gateway_refuses_an_entry_of_bae_cors_origins_that_is_not_an_origin() -> None:
    env = service_env(BAE_CORS_ORIGINS="https://app.example.com/")
    result = subprocess.run([sys.executable, "-m", "bae.services.gateway"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith('error: BAE_CORS_ORIGINS: "https://app.example.com/" is not an origin (an origin '
                                    "has no path, query or fragment, not even a trailing /;"), result.stderr
