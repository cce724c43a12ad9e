"""Services named by DNS: every address of each name, re-resolved periodically.

BAE_SANDBOX_GRPC_ADDRS and BAE_SESSION_GRPC_ADDRS may name a host
(`sandbox:50053`, `session:50051`) instead of an address. Under compose, a
Swarm `dnsrr` service or a Kubernetes headless service the name resolves to
every replica, so scaling adds and removes addresses while the caller runs:
each refresh hands the sink one `ip:port` per address. Each address is then a
peer of its own that the caller can health-check and route around, which a
name balanced inside gRPC is not. A name that fails to resolve keeps the
addresses it had, so a DNS hiccup never drops live peers; `localhost` stays a
name (gRPC tries its addresses), as one machine is one peer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from typing import Awaitable, Callable, Protocol

log = logging.getLogger("bae.discovery")

DEFAULT_INTERVAL = 5.0

# (host, port) -> the IP addresses of host; raises OSError when it cannot.
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve_all(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def split_target(target: str) -> tuple[str, int] | None:
    """(name, port) for a `name:port` target; None for an IP literal, localhost or anything else gRPC
    takes as is."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host or host.startswith("[") or host.lower() == "localhost":
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
    """What discovery keeps up to date (the session service's sandbox pool, the gateway's upstream)."""

    def set_addrs(self, addrs: list[str]) -> None: ...


class Discovery:
    """Keeps `sink` pointed at every address of `targets`; literals pass through unchanged.
    `what` names the peers in the log ("sandbox hosts")."""

    def __init__(self, sink: AddressSink, targets: list[str], *, what: str, interval: float = DEFAULT_INTERVAL,
                 resolve: Resolver = resolve_all) -> None:
        self._sink = sink
        self._what = what
        self._targets = list(targets)
        self._interval = interval
        self._resolve = resolve
        self._known: dict[str, list[str]] = {}
        self._unresolved: set[str] = set()  # names whose last lookup failed: warned once, not each round
        self._current: list[str] | None = None
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> list[str]:
        """Resolve every target once and give the sink the result when it changed."""
        addrs: list[str] = []
        for target in self._targets:
            addrs.extend(await self._addresses(target))
        addrs = list(dict.fromkeys(addrs))
        if addrs != self._current:
            log.info("%s: %s", self._what, ", ".join(addrs) or "none")
            self._sink.set_addrs(addrs)
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
            if target not in self._unresolved:
                log.warning("%s: cannot resolve %s (%s); keeping its last addresses, trying again every %g s",
                            self._what, host, exc, self._interval)
            self._unresolved.add(target)
        else:
            self._unresolved.discard(target)
        if resolved:
            self._known[target] = resolved
        # Until a name first resolves, gRPC may still resolve it on its own.
        return self._known.get(target, [target])

    def start(self, *, resolve_now: bool = False) -> None:
        """Resolve every `interval` seconds from now on; first at once with `resolve_now`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(resolve_now))

    async def _run(self, resolve_now: bool) -> None:
        if not resolve_now:
            await asyncio.sleep(self._interval)
        while True:
            try:
                await self.refresh()
            except Exception:  # keeps discovery alive; the next round retries
                log.exception("%s: discovery failed", self._what)
            await asyncio.sleep(self._interval)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
