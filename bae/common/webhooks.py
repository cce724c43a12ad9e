"""Webhooks: the `[webhooks]` table of bae-config.toml, which outbound addresses a delivery may reach,
the retry schedule, and Standard Webhooks signatures (https://www.standardwebhooks.com).

A webhook URL must not let an admin (or whoever holds the admin key) make the server call its own
network: loopback, private, link-local, multicast, reserved and cloud metadata addresses are refused
unless their host is listed in `allow_hosts`. The check runs on the resolved addresses, at create time
and again before every delivery (a name may resolve elsewhere since).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import math
import secrets
import urllib.parse
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

KEYS = ("allow_hosts",)
# Bounds on input, so a body or a config file cannot make the store or a loop large.
MAX_URL_CHARS = 2048
MAX_EVENT_TYPES = 64
MAX_EVENT_TYPE_CHARS = 64
MAX_ALLOW_HOSTS = 256
SECRET_PREFIX = "whsec_"
# The schedule's first wait and its growth: 5 s, 10 s, 20 s, ... capped at MAX_WAIT, until BAE_WEBHOOK_MAX_AGE.
FIRST_WAIT = 5.0
GROWTH = 2.0
MAX_WAIT = 3600.0
DEFAULT_MAX_AGE = 86400.0
# A rotated secret stays valid this long, deliveries signed with both meanwhile.
PREVIOUS_SECRET_SECONDS = 86400.0


class WebhookConfigError(ValueError):
    """A `[webhooks]` value that does not read; the message names the key."""


@dataclass(frozen=True)
class WebhookSettings:
    # Hosts (names or IP literals, lowercase) a webhook may reach even at an internal address.
    allow_hosts: frozenset[str] = frozenset()


DEFAULT_WEBHOOKS = WebhookSettings()


def read_webhooks(table: Mapping[str, Any]) -> WebhookSettings:
    """The `[webhooks]` table, checked; unknown keys are refused so a misspelt one never silently does nothing."""
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise WebhookConfigError(f"webhooks: unknown key `{unknown[0]}`; the keys are {', '.join(KEYS)}")
    hosts = table.get("allow_hosts", [])
    if not isinstance(hosts, list) or len(hosts) > MAX_ALLOW_HOSTS:
        raise WebhookConfigError(f"webhooks.allow_hosts must be an array of at most {MAX_ALLOW_HOSTS} host names")
    for index, host in enumerate(hosts):
        if not isinstance(host, str) or not host.strip() or len(host) > 253:
            raise WebhookConfigError(f"webhooks.allow_hosts[{index}] must be a host name or an IP address")
    return WebhookSettings(allow_hosts=frozenset(_host_key(host) for host in hosts))


def _host_key(host: str) -> str:
    return host.strip().strip("[]").lower().rstrip(".")


class RefusedAddress(ValueError):
    """A webhook URL that may not be called; the message says why (a problem's detail)."""


@dataclass(frozen=True)
class Target:
    """Where a webhook URL points: its scheme, host (as written, lowercase) and port."""

    scheme: str
    host: str
    port: int


def parse_url(url: str) -> Target:
    """The target of a webhook URL: http or https, a host, no credentials; RefusedAddress otherwise."""
    if len(url) > MAX_URL_CHARS:
        raise RefusedAddress(f"url must be at most {MAX_URL_CHARS} characters")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise RefusedAddress("url is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RefusedAddress("url must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise RefusedAddress("url must not carry credentials")
    return Target(parts.scheme, _host_key(parts.hostname), port or (443 if parts.scheme == "https" else 80))


def internal_reason(address: str) -> str | None:
    """Why an IP address is internal (loopback, private, ...), or None for a public one."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for reason, hit in (
        ("loopback", ip.is_loopback),
        ("unspecified", ip.is_unspecified),
        ("link-local (cloud metadata)", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
        ("not globally routable", not ip.is_global),
    ):
        if hit:
            return reason
    return None


def check_addresses(target: Target, addresses: Sequence[str], settings: WebhookSettings) -> None:
    """Refuse a target any of whose addresses is internal, unless its host is in allow_hosts.

    Every address counts, not just the first: a connection may go to any of them."""
    if target.host in settings.allow_hosts:
        return
    if not addresses:
        raise RefusedAddress(f"host {target.host} does not resolve")
    for address in addresses:
        reason = internal_reason(address)
        if reason is not None:
            raise RefusedAddress(
                f"host {target.host} resolves to {address}, a {reason} address; "
                "list the host in [webhooks] allow_hosts to allow it"
            )


def retry_delay(attempts: int, scale: float = 1.0) -> float:
    """Seconds to wait after the `attempts`-th failed attempt: 5, 10, 20, ... at most an hour (times `scale`)."""
    return min(MAX_WAIT, FIRST_WAIT * GROWTH ** max(0, attempts - 1)) * scale


def schedule(max_age: float, scale: float = 1.0) -> list[float]:
    """The seconds after the first attempt at which each retry runs, within `max_age` (the docs' table)."""
    at, attempts = 0.0, 1
    times: list[float] = []
    while True:
        at += retry_delay(attempts, scale)
        if at > max_age or not math.isfinite(at):
            return times
        times.append(at)
        attempts += 1


def new_secret() -> str:
    """A signing secret: `whsec_` + base64 of 24 CSPRNG bytes (the form Standard Webhooks libraries read)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256>` of `id.timestamp.body` under the secret's key bytes."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def signature_header(secrets_in_use: Sequence[str], message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: one signature per secret, space-separated (rotation overlap)."""
    return " ".join(signature(secret, message_id, timestamp, body) for secret in secrets_in_use)


def matches(event_types: Sequence[str], event_type: str) -> bool:
    return "*" in event_types or event_type in event_types
