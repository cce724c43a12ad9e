"""Stacks of real service processes for tests and benchmarks: their environment, and clients of their ports."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Callable

import httpx

from bae.common.settings import Settings
from bae.launcher.stack import Stack, demo_config
from testkit import postgres_support, stack_logs
from testkit.openapi_check import OpenApiCheck
from testkit.ports import free_port
from testkit.processes import service_env


def store_url(tmp: Path) -> str:
    """The store a stack or a test with files in `tmp` uses: SQLite in `tmp`, or with BAE_TEST_STORE=postgresql
    a PostgreSQL database of its own (the same one for the same `tmp`, so a restarted stack finds its data)."""
    if postgres_support.on_postgres():
        return postgres_support.server().database_url(str(tmp))
    return f"sqlite:///{tmp / 'bae.db'}"


def database_url_of(env: dict[str, str]) -> str:
    """The store URL a service started with `env` uses."""
    return env.get("BAE_DATABASE_URL") or f"sqlite:///{env['BAE_DB_PATH']}"


def stack_env(tmp: Path, **overrides: str) -> dict[str, str]:
    """An environment for one isolated stack: its own ports, store and key files.

    BAE_TEST_STORE=postgresql gives it a PostgreSQL database unless the test names its SQLite file.
    """
    defaults = {
        "BAE_ADDR": f"127.0.0.1:{free_port()}",
        "BAE_ADMIN_ADDR": f"127.0.0.1:{free_port()}",
        "BAE_SESSION_GRPC_ADDR": f"127.0.0.1:{free_port()}",
        "BAE_RUNNER_GRPC_ADDR": f"127.0.0.1:{free_port()}",
        "BAE_SANDBOX_GRPC_ADDRS": f"127.0.0.1:{free_port()}",
        # Unique per stack: a sandbox host removes its id's containers at start-up,
        # and other test runs may share this Docker daemon.
        "BAE_SANDBOX_HOST_ID": f"test-{uuid.uuid4().hex[:12]}",
        "BAE_DB_PATH": str(tmp / "bae.db"),
        "BAE_ADMIN_KEY_FILE": str(tmp / "admin-key.pem"),
        "BAE_ADMIN_KEY_HASH_FILE": str(tmp / "admin-key-hash.pem"),
        "BAE_SHUTDOWN_TIMEOUT": "5",
        "BAE_LOG": "info",
    }
    if postgres_support.on_postgres() and not {"BAE_DB_PATH", "BAE_DATABASE_URL"} & overrides.keys():
        defaults["BAE_DATABASE_URL"] = store_url(tmp)
    return service_env(**{**defaults, **overrides})


class StackClients:
    """Authenticated HTTP clients for a stack's two ports, and the admin calls most tests begin with."""

    def __init__(self, client_url: str, admin_url: str, admin_key: str) -> None:
        self.client_url, self.admin_url, self.admin_key = client_url, admin_url, admin_key
        # Each answer is checked against its port's OpenAPI document (testkit/openapi_check.py).
        self.client = httpx.Client(base_url=client_url, timeout=30,
                                   event_hooks={"response": [OpenApiCheck("client")]})
        self.admin = httpx.Client(
            base_url=admin_url,
            timeout=30,
            headers={"Authorization": f"Bearer {admin_key}"},
            event_hooks={"response": [OpenApiCheck("admin")]},
        )

    def create_profile(self, name: str, primary: str = "mock", **fields) -> dict:
        body = {"name": name, "primary_provider": primary, **fields}
        response = self.admin.post("/admin/v1/profiles", json=body)
        assert response.status_code == 201, response.text
        return response.json()

    def create_key(self, profile_id: str, name: str = "k") -> dict:
        response = self.admin.post("/admin/v1/keys", json={"name": name, "profile_id": profile_id})
        assert response.status_code == 201, response.text
        return response.json()

    def open_session(self, client_key: str, **body) -> dict:
        response = self.client.post(
            "/api/v1/sessions", json=body, headers={"Authorization": f"Bearer {client_key}"}
        )
        assert response.status_code == 201, response.text
        return response.json()

    def close(self) -> None:
        self.client.close()
        self.admin.close()


class RunningStack(StackClients):
    """A started stack of service processes, and clients of its ports."""

    def __init__(self, stack: Stack, tmp: Path) -> None:
        self.stack = stack
        self.tmp = tmp
        super().__init__(stack.client_url, stack.admin_url, Path(stack.settings.admin_key_file).read_text().strip())
        if stack.log_dir is not None:
            stack_logs.started(stack.log_dir)

    @property
    def settings(self) -> Settings:
        return self.stack.settings

    def close(self) -> dict[str, int]:  # type: ignore[override]
        super().close()
        if self.stack.log_dir is not None:
            stack_logs.stopped(self.stack.log_dir)
        return self.stack.stop()


# free_port's ports come from the ephemeral range, so a connection made meanwhile may take one
# before the service binds it (every service says "cannot bind"): rare, but it once failed a
# module's shared stack and all its tests.
BIND_ATTEMPTS = 3


# The [limits] of a test stack whose config sets none: quotas and the rate limit far above what any
# test does with one key (the tests of limits set their own table).
TEST_LIMITS = """
[limits]
max_open_sessions_per_key = 100000
max_sandboxes_per_key = 1000
max_subscribers_per_session = 10000
requests_per_second_per_key = 1000000.0
burst = 1000000
"""


def with_test_limits(config_toml: str | None) -> str:
    """`config_toml` (none: an empty config) with TEST_LIMITS unless it has a [limits] table."""
    config_toml = config_toml or ""
    return config_toml if "[limits]" in config_toml else config_toml + TEST_LIMITS


def launch_stack(tmp: Path, config_toml: str | None = None, session_args: list[str] | None = None,
                 **env: str) -> RunningStack:
    """Start a stack whose files live in `tmp`; its logs are printed if it fails to start."""
    overrides = dict(env)
    if "BAE_CONFIG" not in overrides:
        config = tmp / "bae-config.toml"
        config.write_text(with_test_limits(config_toml))
        overrides["BAE_CONFIG"] = str(config)
    attempts = BIND_ATTEMPTS
    while True:
        stack = Stack(env=stack_env(tmp, **overrides), session_args=session_args or [], log_dir=tmp / "logs")
        try:
            stack.start()
            return RunningStack(stack, tmp)
        except Exception:
            stack.stop()
            attempts -= 1
            logs = {log.name: log.read_text() for log in sorted((tmp / "logs").glob("*.log"))}
            if attempts and any("cannot bind" in text for text in logs.values()):
                continue  # a port free_port found was taken before the service bound it: new ports
            for name, text in logs.items():
                print(f"--- {name}\n{text[-4000:]}")
            raise


def launch_demo_stack(tmp: Path) -> RunningStack:
    """A stack whose one provider is the built-in demo model (`bae run --demo`'s), on a port of its own."""
    address = f"127.0.0.1:{free_port()}"
    return launch_stack(tmp, demo_config(address), BAE_DEMO_PROVIDER_ADDR=address)


StackFactory = Callable[..., RunningStack]


def mock_provider_toml(base_url: str, *, name: str = "mock", kind: str = "anthropic",
                       token_var: str = "MOCK_LLM_TOKEN") -> str:
    """A bae-config.toml provider entry for a mock LLM at `base_url`, its token read from `token_var`."""
    return (
        "[[providers.entries]]\n"
        f'name = "{name}"\nprovider = "{kind}"\nmodel = "mock-model"\n'
        f'base_url = "{base_url}"\nauth_token = "${{{token_var}}}"\n'
    )
