"""The compose files pass every documented BAE_* setting to the services that read it.

A setting missing from a service's `environment` is silently dropped: set in .env, it does nothing.
Each one is a bare `BAE_X:` entry, which compose fills from the environment or .env and leaves out of
the container when unset, so the service's own default holds (an empty value would not).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from testkit import ROOT

pytestmark = pytest.mark.unit

EVERY_SERVICE = {"BAE_LOG", "BAE_LOG_FORMAT", "BAE_OTEL_LOG", "BAE_SHUTDOWN_TIMEOUT", "BAE_GRPC_KEEPALIVE_INTERVAL"}
READ_BY = {
    "gateway": EVERY_SERVICE | {"BAE_RPC_TIMEOUT", "BAE_MAX_BODY_BYTES", "BAE_HTTP_HEADER_TIMEOUT",
                                "BAE_HTTP_KEEPALIVE_TIMEOUT", "BAE_HTTP_MAX_CONNECTIONS", "BAE_CORS_ORIGINS",
                                "BAE_CONSOLE", "BAE_CONSOLE_PREFIX", "BAE_TRUSTED_PROXIES"},
    "session": EVERY_SERVICE | {
        "BAE_DATABASE_URL", "BAE_RPC_TIMEOUT", "BAE_TURN_TIMEOUT", "BAE_MCP_TIMEOUT", "BAE_MCP_OUTPUT_LIMIT",
        "BAE_SUBAGENT_TIMEOUT", "BAE_MAX_SUBAGENTS_PER_SESSION", "BAE_DANGEROUSLY_DISABLE_ADMIN_AUTH",
        "BAE_ADMIN_KEY_HASH_FILE", "BAE_SQLITE_SYNCHRONOUS", "BAE_SANDBOX_IDLE_TIMEOUT",
        "BAE_SESSION_LEASE_SECONDS", "BAE_SESSION_ADVERTISE_ADDR", "BAE_RETENTION_INTERVAL",
        "BAE_RECONCILE_INTERVAL", "BAE_WEBHOOK_MAX_AGE"},
    "runner": EVERY_SERVICE | {"BAE_RPC_TIMEOUT", "BAE_PROVIDER_TIMEOUT", "BAE_DEMO_PROVIDER_ADDR"},
    "sandbox": EVERY_SERVICE | {
        "BAE_SANDBOX_DRIVER", "BAE_SANDBOX_MEMORY", "BAE_SANDBOX_CPUS", "BAE_SANDBOX_PIDS_LIMIT",
        "BAE_SANDBOX_NETWORK", "BAE_SANDBOX_READ_ONLY", "BAE_SANDBOX_EXEC_TIMEOUT", "BAE_SANDBOX_OUTPUT_LIMIT",
        "BAE_SANDBOX_HEALTH_INTERVAL", "BAE_SANDBOX_WARM", "BAE_SANDBOX_RESIDENT_RUNNER"},
}
# Documented settings the compose files set themselves (addresses, paths inside the containers, the
# token), or that mean nothing there.
NOT_PASSED = {
    "BAE_ADDR", "BAE_ADMIN_ADDR", "BAE_DB_PATH", "BAE_CONFIG", "BAE_ADMIN_KEY_FILE", "BAE_INTERNAL_TOKEN",
    "BAE_SESSION_GRPC_ADDR", "BAE_SESSION_GRPC_ADDRS", "BAE_RUNNER_GRPC_ADDR", "BAE_SANDBOX_GRPC_ADDRS",
    "BAE_SANDBOX_LISTEN_ADDR",
    "BAE_SESSION_REPLICAS",  # `bae run` only; compose scales with --scale
    "BAE_SANDBOX_HOST_ID",  # one value for every scaled replica would have each remove the others' containers
    "BAE_SCHEDULE_TEST_SECONDS",  # test-only: never set in a deployment
    # Secrets as files: the compose files take secrets from .env; the Swarm stack and the Kubernetes
    # manifests mount them as files.
    "BAE_INTERNAL_TOKEN_FILE", "BAE_DATABASE_URL_FILE", "BAE_DATABASE_PASSWORD_FILE",
    "BAE_WEBHOOK_BACKOFF_SCALE",  # test-only
}
COMPOSE_FILES = ["docker-compose.yml", "docker-compose.replicas.yml"]


def documented() -> set[str]:
    text = (Path(ROOT) / "docs" / "configuration.md").read_text()
    return set(re.findall(r"^\| `(BAE_[A-Z0-9_]+)` \|", text, re.MULTILINE))


def test_every_documented_setting_is_placed() -> None:
    placed = set().union(*READ_BY.values()) | NOT_PASSED
    assert documented() - placed == set(), "a new setting: add it to the compose files and to READ_BY"
    assert placed - documented() == set()


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_each_service_takes_every_setting_it_reads(name: str) -> None:
    services = yaml.safe_load((Path(ROOT) / name).read_text())["services"]
    for service, settings in READ_BY.items():
        environment = services[service]["environment"]
        missing = sorted(setting for setting in settings if setting not in environment)
        assert missing == [], f"{name}: {service} drops {missing}"
        for setting in settings:
            # Bare (unset stays unset), or the file's own value; never an empty default.
            value = environment[setting]
            assert value is None or not str(value).startswith("${" + setting + "-"), (name, service, setting)
