"""Sandbox hosts named by DNS: every address of each name, re-resolved periodically.

BAE_SANDBOX_GRPC_ADDRS may name a host (`sandbox:50053`) instead of an address.
Under docker-compose the service name resolves to every replica, so
`--scale sandbox=N` adds and removes hosts while the session service runs:
each refresh hands the pool one `ip:port` per address. A name that fails to
resolve keeps the addresses it had, so a DNS hiccup never drops live hosts.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from typing import Awaitable, Callable, Protocol

log = logging.getLogger("bae.session.sandbox_discovery")

DEFAULT_INTERVAL = 5.0

# (host, port) -> the IP addresses of host; raises OSError when it cannot.
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve_all(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def split_target(target: str) -> tuple[str, int] | None:
    """(name, port) for a `name:port` target; None for an IP literal or anything else gRPC takes as is."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host or host.startswith("["):
        return None
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        return host, int(port)


def format_address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def needs_discovery(targets: list[str]) -> bool:
    return any(split_target(target) is not None for target in targets)


class AddressSink(Protocol):
    """What discovery keeps up to date (remote.sandbox_pool.SandboxPool)."""

    def set_addrs(self, addrs: list[str]) -> None: ...


class SandboxDiscovery:
    """Keeps `pool` pointed at every address of `targets`; literals pass through unchanged."""

    def __init__(self, pool: AddressSink, targets: list[str], *, interval: float = DEFAULT_INTERVAL,
                 resolve: Resolver = resolve_all) -> None:
        self._pool = pool
        self._targets = list(targets)
        self._interval = interval
        self._resolve = resolve
        self._known: dict[str, list[str]] = {}
        self._current: list[str] | None = None
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> list[str]:
        """Resolve every target once and give the pool the result when it changed."""
        addrs: list[str] = []
        for target in self._targets:
            addrs.extend(await self._addresses(target))
        addrs = list(dict.fromkeys(addrs))
        if addrs != self._current:
            log.info("sandbox hosts: %s", ", ".join(addrs) or "none")
            self._pool.set_addrs(addrs)
            self._current = addrs
        return addrs

    async def _addresses(self, target: str) -> list[str]:
        named = split_target(target)
        if named is None:
            return [target]
        host, port = named
        try:
            resolved = sorted(format_address(ip, port) for ip in await self._resolve(host, port))
        except OSError as exc:
            resolved = []
            log.warning("cannot resolve sandbox host %s: %s", host, exc)
        if resolved:
            self._known[target] = resolved
        # Until a name first resolves, gRPC may still resolve it on its own.
        return self._known.get(target, [target])

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh()
            except Exception:  # keeps discovery alive; the next round retries
                log.exception("sandbox host discovery failed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
