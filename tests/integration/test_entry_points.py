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
    for command in (["-m", f"bae.services.{service}", "--help"], ["-m", "bae", service, "--help"]):
        helped = run(*command)
        assert helped.returncode == 0, helped.stderr
        # The command a user types, whichever way the module was started.
        assert helped.stdout.startswith(f"usage: bae {service} "), helped.stdout
    for command in (["-m", f"bae.services.{service}", "--version"], ["-m", "bae", service, "-V"]):
        answered = run(*command)
        assert (answered.stdout, answered.returncode) == (VERSION, 0), answered.stderr
    assert run("-m", f"bae.services.{service}", "--bogus").returncode == 2


def test_every_baectl_command_names_itself_in_its_help() -> None:
    from bae.ctl import build_parser

    _, parsers = build_parser()
    commands = [(), *sorted(parsers)]
    # A few at a time: each is a process of its own, through the real entry point.
    for start in range(0, len(commands), 8):
        batch = commands[start:start + 8]
        started = [(path, subprocess.Popen([sys.executable, "-m", "bae.ctl", *path, "--help"], cwd=ROOT,
                                           env=service_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True)) for path in batch]
        for path, process in started:
            stdout, stderr = process.communicate(timeout=60)
            assert process.returncode == 0, (path, stderr)
            assert " ".join(stdout.split()).startswith(" ".join(("usage: baectl", *path))), (path, stdout)


def test_bae_command() -> None:
    assert run("-m", "bae", "version").stdout == VERSION
    assert run("-m", "bae", "--version").stdout == VERSION
    helped = run("-m", "bae", "help")
    assert helped.returncode == 0 and "migrate" in helped.stdout
    assert run("-m", "bae").stdout == helped.stdout
    unknown = run("-m", "bae", "frobnicate")
    assert unknown.returncode == 2 and unknown.stderr.startswith("bae: unknown command 'frobnicate'")
    assert run("-m", "bae", "run", "--help").stdout.startswith("usage: bae run")
    assert run("-m", "bae", "migrate", "--help").stdout.startswith("usage: bae migrate ")
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
