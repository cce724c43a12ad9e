"""Outbound HTTP for webhook deliveries (engine/ports.py, WebhookTransport), with httpx.

The deliverer resolves a URL's host and checks every address before an attempt; `post` then connects
to the checked address itself (the URL's host stays in the Host header and TLS's SNI and certificate
check), so a name that resolves elsewhere between the check and the connection cannot redirect it.
Redirects are never followed: a 3xx is an answer like any other non-2xx.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import urllib.parse

import httpx

from bae.services.session.engine.ports import WebhookAnswer

# Seconds an attempt may take, connection included; below the deliverer's claim (CLAIM_SECONDS).
TIMEOUT = 15.0
# Seconds a host name may take to resolve: an admin request waits for it, within the gateway's deadline.
RESOLVE_TIMEOUT = 5.0


class WebhookSender:
    def __init__(self, timeout: float = TIMEOUT) -> None:
        self._client = httpx.AsyncClient(
            timeout=timeout, follow_redirects=False, trust_env=False,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )

    async def resolve(self, host: str, port: int) -> list[str]:
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            pass
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT):
                found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, TimeoutError, UnicodeError):
            return []
        return list(dict.fromkeys(str(info[4][0]) for info in found))

    async def post(self, url: str, address: str, headers: dict[str, str], body: bytes) -> WebhookAnswer:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        literal = f"[{address}]" if ":" in address else address
        netloc = literal if parts.port is None else f"{literal}:{parts.port}"
        pinned = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
        host_header = host if parts.port is None else f"{host}:{parts.port}"
        try:
            response = await self._client.post(
                pinned, content=body, headers={**headers, "host": host_header},
                extensions={"sni_hostname": host} if parts.scheme == "https" else None,
            )
        except httpx.HTTPError as exc:
            return WebhookAnswer(None, f"{type(exc).__name__}: {exc}"[:500])
        return WebhookAnswer(response.status_code)

    async def close(self) -> None:
        await self._client.aclose()
