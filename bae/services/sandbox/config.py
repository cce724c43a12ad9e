"""Sandbox host settings from the environment; invalid values exit 2 (UsageError)."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Callable, Mapping, TypeVar

from bae.common.errors import UsageError
from bae.common.settings import Settings, is_truthy

_MEMORY = re.compile(r"^[0-9]+[bkmg]?$")
# Both streams of one capped output must fit in a gRPC message (64 MiB, bae/common/grpcutil.py).
MAX_OUTPUT_LIMIT = 16 * 1024 * 1024
# Warm spares per image: each is a running container holding its memory reservation.
MAX_WARM = 32
N = TypeVar("N", int, float)


@dataclass(frozen=True)
class SandboxConfig:
    driver: str
    listen_addr: str
    # Stable instance id; every container this host starts carries it as `bae.host`.
    host_id: str
    memory: str
    cpus: float
    pids_limit: int
    network: str
    # Root filesystem read-only; the workspace and /tmp are then writable tmpfs mounts.
    read_only: bool
    exec_timeout: float
    # Bytes kept of each output stream of a command; the rest is counted, not kept.
    output_limit: int
    health_interval: float
    # Started, unassigned containers kept per allowed image (bae/services/sandbox/warm.py); 0: none.
    warm: int = 0
    # Commands go to a shell kept running in each sandbox (bae/services/sandbox/resident_shell.py), not a new exec each.
    resident_shell: bool = True


def _positive(env: Mapping[str, str], var: str, default: str, kind: Callable[[str], N]) -> N:
    value = env.get(var, default)
    try:
        number = kind(value.strip())
    except ValueError:
        number = 0
    if number <= 0:
        raise UsageError(f'{var}: "{value}" is not a positive number')
    return number


def _output_limit(env: Mapping[str, str]) -> int:
    limit = _positive(env, "BAE_SANDBOX_OUTPUT_LIMIT", "1048576", int)
    if limit > MAX_OUTPUT_LIMIT:
        raise UsageError(f'BAE_SANDBOX_OUTPUT_LIMIT: "{limit}" is more than {MAX_OUTPUT_LIMIT} bytes (16 MiB)')
    return limit


def _warm(env: Mapping[str, str]) -> int:
    value = env.get("BAE_SANDBOX_WARM", "0")
    try:
        warm = int(value.strip())
    except ValueError:
        warm = -1
    if not 0 <= warm <= MAX_WARM:
        raise UsageError(f'BAE_SANDBOX_WARM: "{value}" is not a whole number from 0 to {MAX_WARM}')
    return warm


_NETWORK_CHOICES = ('use "bridge", "none" (no network), or the name of a Docker network '
                   "(e.g. one made with `docker network create --internal`)")


def _network(network: str) -> str:
    """BAE_SANDBOX_NETWORK: not the host's network nor another container's, which would hand a sandbox
    the host's loopback services (the internal plane included) or that container's connections."""
    if not network:
        raise UsageError("BAE_SANDBOX_NETWORK: must not be empty")
    if network.lower() == "host":
        raise UsageError(f'BAE_SANDBOX_NETWORK: "{network}" would give sandboxes the host\'s network, its loopback '
                         f"services included; {_NETWORK_CHOICES}")
    if network.lower().startswith("container:"):
        raise UsageError(f'BAE_SANDBOX_NETWORK: "{network}" would put sandboxes in another container\'s network; '
                         f"{_NETWORK_CHOICES}")
    return network


def _switch(env: Mapping[str, str], var: str, default: str) -> bool:
    value = env.get(var, default)
    setting = value.strip().lower()
    if setting not in ("1", "true", "0", "false"):
        raise UsageError(f'{var}: "{value}" is not one of 1, true, 0, false')
    return setting in ("1", "true")


def load_sandbox_config(settings: Settings, env: Mapping[str, str] | None = None) -> SandboxConfig:
    env = os.environ if env is None else env
    get = env.get
    listen_addr = get("BAE_SANDBOX_LISTEN_ADDR", "").strip()
    if not listen_addr:
        if not settings.sandbox_grpc_addrs:
            raise UsageError("BAE_SANDBOX_LISTEN_ADDR: not set and BAE_SANDBOX_GRPC_ADDRS is empty")
        listen_addr = settings.sandbox_grpc_addrs[0]
    memory = get("BAE_SANDBOX_MEMORY", "512m").strip().lower()
    if not _MEMORY.match(memory) or int(memory.rstrip("bkmg")) == 0:
        raise UsageError(f'BAE_SANDBOX_MEMORY: "{memory}" is not a memory size like 512m or 2g')
    network = _network(get("BAE_SANDBOX_NETWORK", "bridge").strip())
    return SandboxConfig(
        driver=settings.sandbox_driver,
        listen_addr=listen_addr,
        host_id=get("BAE_SANDBOX_HOST_ID", "").strip() or f"{socket.gethostname()}-{listen_addr}",
        memory=memory,
        cpus=_positive(env, "BAE_SANDBOX_CPUS", "1", float),
        pids_limit=_positive(env, "BAE_SANDBOX_PIDS_LIMIT", "256", int),
        network=network,
        read_only=is_truthy(get("BAE_SANDBOX_READ_ONLY")),
        exec_timeout=_positive(env, "BAE_SANDBOX_EXEC_TIMEOUT", "300", float),
        output_limit=_output_limit(env),
        health_interval=_positive(env, "BAE_SANDBOX_HEALTH_INTERVAL", "2", float),
        warm=_warm(env),
        resident_shell=_switch(env, "BAE_SANDBOX_RESIDENT_RUNNER", "1"),
    )
