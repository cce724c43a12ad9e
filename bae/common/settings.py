"""Settings from the environment (SERVER-SPEC §16), parsed once at start.

Every invalid value raises UsageError with the one-line reason the process
prints before it exits with code 2.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Mapping

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from bae.common.errors import UsageError
from bae.common.secret_files import database_url, secret_setting


# Shared with baectl, which finds the admin port the way the server does.
DEFAULT_ADMIN_ADDR = "127.0.0.1:8081"
DEFAULT_ADMIN_KEY_FILE = "/var/lib/bae/admin-key.pem"
DEFAULT_DB_PATH = "/var/lib/bae/bae.db"


def admin_key_dir(env: Mapping[str, str]) -> str | None:
    """The directory of the SQLite store `env` names, where its admin key files go unless named; None when
    the store is no local file (PostgreSQL, an in-memory SQLite).

    A key belongs to one store: beside it, a second store (another BAE_DB_PATH) gets a key file of its own
    instead of finding, or replacing, the first one's.
    """
    url = database_url(env)
    if url is None:
        return os.path.dirname(os.path.abspath(env.get("BAE_DB_PATH") or DEFAULT_DB_PATH))
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None  # load_settings names the problem
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return os.path.dirname(os.path.abspath(parsed.database))


def default_admin_key_file(env: Mapping[str, str], name: str = "admin-key.pem") -> str:
    """BAE_ADMIN_KEY_FILE's default: beside the SQLite store, else /var/lib/bae (DEFAULT_ADMIN_KEY_FILE's)."""
    return os.path.join(admin_key_dir(env) or os.path.dirname(DEFAULT_ADMIN_KEY_FILE), name)


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback


def parse_address(var: str, value: str) -> Address:
    """An `ip:port` literal (IPv6 as `[::1]:8081`); hostnames are refused."""
    text = value.strip()
    try:
        if text.startswith("["):
            host, sep, port = text[1:].partition("]:")
            if not sep:
                raise ValueError("expected [ipv6]:port")
            ipaddress.IPv6Address(host)
        else:
            host, sep, port = text.rpartition(":")
            if not sep:
                raise ValueError("missing port")
            ipaddress.IPv4Address(host)
        number = int(port)
        if not 0 <= number <= 65535:
            raise ValueError("port out of range")
    except ValueError as exc:
        raise UsageError(f'{var}: "{value}" is not a valid host:port address ({exc})') from None
    return Address(host, number)


def parse_seconds(var: str, value: str) -> int:
    text = value.strip()
    if not text.isdigit():
        raise UsageError(f'{var}: "{value}" is not a whole number of seconds')
    return int(text)


def parse_timeout(var: str, value: str) -> float:
    """A deadline of this implementation's own (not in the spec): whole seconds, at least 1."""
    seconds = parse_seconds(var, value)
    if seconds < 1:
        raise UsageError(f'{var}: "{value}" must be at least 1 second')
    return float(seconds)


def parse_backoff_scale(value: str) -> float:
    """BAE_WEBHOOK_BACKOFF_SCALE (test-only): a number more than 0 and at most 1."""
    try:
        scale = float(value.strip())
    except ValueError:
        scale = math.nan
    if not 0 < scale <= 1:
        raise UsageError(f'BAE_WEBHOOK_BACKOFF_SCALE: "{value}" must be a number more than 0 and at most 1')
    return scale


# A day: a longer interval would leave a closed session's container running for days.
MAX_RECONCILE_INTERVAL = 86_400


def parse_reconcile_interval(value: str) -> float:
    """BAE_RECONCILE_INTERVAL: whole seconds, 1 to a day."""
    seconds = parse_timeout("BAE_RECONCILE_INTERVAL", value)
    if seconds > MAX_RECONCILE_INTERVAL:
        raise UsageError(f'BAE_RECONCILE_INTERVAL: "{value}" must be at most {MAX_RECONCILE_INTERVAL} seconds (a day)')
    return seconds


def parse_count(var: str, value: str) -> int:
    text = value.strip()
    if not text.isdigit():
        raise UsageError(f'{var}: "{value}" is not a non-negative integer')
    return int(text)


def is_truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true")


SQLITE_SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


def parse_sqlite_synchronous(value: str) -> str:
    mode = value.strip().upper()
    if mode not in SQLITE_SYNCHRONOUS_MODES:
        raise UsageError(
            f'BAE_SQLITE_SYNCHRONOUS: "{value}" is not one of {", ".join(SQLITE_SYNCHRONOUS_MODES)}'
        )
    return mode


def _log_format(value: str) -> str:
    text = value.strip().lower()
    if text not in ("text", "json"):
        raise UsageError(f'BAE_LOG_FORMAT: "{value}" is not a log format (expected "text" or "json")')
    return text


DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# A body travels to the session service in one gRPC message (64 MiB at most), with room to spare.
MAX_BODY_BYTES_LIMIT = 48 * 1024 * 1024


def parse_body_limit(value: str) -> int:
    limit = parse_count("BAE_MAX_BODY_BYTES", value)
    if not 1 <= limit <= MAX_BODY_BYTES_LIMIT:
        raise UsageError(f'BAE_MAX_BODY_BYTES: "{value}" must be between 1 and {MAX_BODY_BYTES_LIMIT} bytes')
    return limit


DEFAULT_MCP_OUTPUT_LIMIT = 1024 * 1024
# A result travels in events and the provider request several times over, each under the
# internal message limit (64 MiB); the handshake's answers must still fit above the floor.
MCP_OUTPUT_LIMIT_RANGE = (1024, 16 * 1024 * 1024)


def parse_mcp_output_limit(value: str) -> int:
    limit = parse_count("BAE_MCP_OUTPUT_LIMIT", value)
    low, high = MCP_OUTPUT_LIMIT_RANGE
    if not low <= limit <= high:
        raise UsageError(f'BAE_MCP_OUTPUT_LIMIT: "{value}" must be between {low} and {high} bytes')
    return limit


DEFAULT_HTTP_MAX_CONNECTIONS = 4096
HTTP_MAX_CONNECTIONS_LIMIT = 1_000_000


def parse_max_connections(value: str) -> int:
    limit = parse_count("BAE_HTTP_MAX_CONNECTIONS", value)
    if not 1 <= limit <= HTTP_MAX_CONNECTIONS_LIMIT:
        raise UsageError(f'BAE_HTTP_MAX_CONNECTIONS: "{value}" must be between 1 and {HTTP_MAX_CONNECTIONS_LIMIT}')
    return limit


MIN_INTERNAL_TOKEN_CHARS = 32


def parse_internal_token(value: str | None) -> str | None:
    """BAE_INTERNAL_TOKEN: unset is allowed here (baectl needs none); a weak token is not."""
    if value is None or not value.strip():
        return None
    token = value.strip()
    if len(token) < MIN_INTERNAL_TOKEN_CHARS or not token.isascii() or not token.isprintable():
        raise UsageError(
            f"BAE_INTERNAL_TOKEN: must be at least {MIN_INTERNAL_TOKEN_CHARS} printable ASCII characters "
            "(e.g. `openssl rand -hex 32`)"
        )
    return token


def _replicas(value: str) -> int:
    count = parse_count("BAE_SESSION_REPLICAS", value)
    if not 1 <= count <= 64:
        raise UsageError(f'BAE_SESSION_REPLICAS: "{value}" must be between 1 and 64')
    return count


def _grpc_targets(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


# The ports a browser leaves out of the Origin it sends.
_DEFAULT_PORTS = {"http": 80, "https": 443}
# A host name as browsers send it in Origin (international names in their xn-- form).
_HOST_NAME = re.compile(r"[a-z0-9-]+(\.[a-z0-9-]+)*")


def _origin(entry: str) -> str:
    """One origin as a browser sends it in `Origin` (lower case, no default port), or ValueError."""
    parts = urllib.parse.urlsplit(entry)
    host = parts.hostname  # lower case
    if not parts.scheme or not host or not entry.lower().startswith(f"{parts.scheme}://"):
        raise ValueError("expected scheme://host[:port]")
    if parts.path or parts.query or parts.fragment or entry.endswith(("?", "#")):
        raise ValueError("an origin has no path, query or fragment, not even a trailing /")
    if parts.username is not None or parts.password is not None:
        raise ValueError("an origin has no user name or password")
    if ":" in host:
        ipaddress.IPv6Address(host)  # ValueError names what is wrong with it
        host = f"[{host}]"
    elif not _HOST_NAME.fullmatch(host):
        raise ValueError(f'"{host}" is not a host name')
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or parts.netloc.endswith(":"):
        raise ValueError("the port must be a number from 1 to 65535")
    scheme = parts.scheme.lower()
    return f"{scheme}://{host}" if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{scheme}://{host}:{port}"


def parse_cors_origins(value: str) -> tuple[str, ...]:
    """BAE_CORS_ORIGINS: comma-separated origins (`scheme://host[:port]`) or `*`; empty: no CORS."""
    origins: list[str] = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        try:
            origins.append("*" if entry == "*" else _origin(entry))
        except ValueError as exc:
            raise UsageError(
                f'BAE_CORS_ORIGINS: "{entry}" is not an origin ({exc}; e.g. https://app.example.com or '
                "http://localhost:5173, or * for any origin)"
            ) from None
    return tuple(dict.fromkeys(origins))


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# Entries of BAE_TRUSTED_PROXIES read at most: a list is a handful of proxies or subnets.
MAX_TRUSTED_PROXIES = 256


def parse_trusted_proxies(value: str) -> tuple[Network, ...]:
    """BAE_TRUSTED_PROXIES: comma-separated IP addresses or CIDR networks whose X-Forwarded-For the
    gateway believes (for the client address of its access log); empty: none, the socket's peer is it."""
    networks: list[Network] = []
    entries = [part.strip() for part in value.split(",") if part.strip()]
    if len(entries) > MAX_TRUSTED_PROXIES:
        raise UsageError(f"BAE_TRUSTED_PROXIES: {len(entries)} entries, at most {MAX_TRUSTED_PROXIES}")
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry))
        except ValueError as exc:
            raise UsageError(
                f'BAE_TRUSTED_PROXIES: "{entry[:100]}" is not an IP address or network ({exc}; '
                "e.g. 10.0.0.5, 10.0.0.0/8 or fd00::/8)"
            ) from None
    return tuple(dict.fromkeys(networks))


_PREFIX = re.compile(r"(/[A-Za-z0-9._~-]+)+")
MAX_PREFIX_CHARS = 200


def parse_console_prefix(value: str) -> str:
    """BAE_CONSOLE_PREFIX: "" or a path such as "/ops/bae" (segments of unreserved URL characters, no
    trailing slash), so it can be put into a page, a URL and a cookie path as it is."""
    value = value.strip()
    if value and (len(value) > MAX_PREFIX_CHARS or not _PREFIX.fullmatch(value)):
        raise UsageError(
            f"BAE_CONSOLE_PREFIX={value[:MAX_PREFIX_CHARS]!r} is not a path prefix such as /bae: segments of "
            "letters, digits and . _ ~ -, each after a /, with no trailing slash"
        )
    return value


@dataclass(frozen=True)
class Settings:
    addr: Address
    admin_addr: Address
    db_path: str
    database_url: str | None
    log: str
    shutdown_timeout: int
    turn_timeout: int
    config_path: str | None
    admin_key_file: str
    admin_key_hash_file: str
    disable_admin_auth: bool
    sandbox_driver: str
    subagent_timeout: int
    max_subagents_per_session: int
    session_grpc_addr: str
    runner_grpc_addr: str
    sandbox_grpc_addrs: list[str]
    rpc_timeout: float
    provider_timeout: float
    mcp_timeout: float
    # Bytes read of each message of an MCP server (BAE_MCP_OUTPUT_LIMIT).
    mcp_output_limit: int = DEFAULT_MCP_OUTPUT_LIMIT
    # The built-in demo provider's listen address (runner); None: no demo provider.
    demo_provider_addr: Address | None = None
    # PRAGMA synchronous of the SQLite store (BAE_SQLITE_SYNCHRONOUS).
    sqlite_synchronous: str = "FULL"
    # Seconds without a call after which a remote sandbox is stopped; 0 = never.
    sandbox_idle_timeout: int = 0
    # Largest request body the gateway reads (BAE_MAX_BODY_BYTES).
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Seconds a request head may take to arrive, and a request body may go without a byte (BAE_HTTP_HEADER_TIMEOUT).
    http_header_timeout: float = 10.0
    # Seconds a gateway connection may stay idle between requests (BAE_HTTP_KEEPALIVE_TIMEOUT).
    http_keepalive_timeout: float = 5.0
    # Connections each gateway port holds at once; more are answered 503 (BAE_HTTP_MAX_CONNECTIONS).
    http_max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS
    # The shared token of the internal gRPC plane (bae.common.internal); None: not configured.
    internal_token: str | None = None
    # Seconds between keepalive pings on internal connections (BAE_GRPC_KEEPALIVE_INTERVAL).
    grpc_keepalive: float = 30.0
    # stderr lines as "text" or "json" (BAE_LOG_FORMAT).
    log_format: str = "text"
    # Session-service replicas `bae run` starts (BAE_SESSION_REPLICAS); more than one needs PostgreSQL.
    session_replicas: int = 1
    # Where the gateway finds the session replicas (BAE_SESSION_GRPC_ADDRS; host names resolve to all
    # their addresses). Empty: BAE_SESSION_GRPC_ADDR alone.
    session_grpc_addrs: list[str] = field(default_factory=list)
    # How long a replica's hold on its sessions outlives its last heartbeat (BAE_SESSION_LEASE_SECONDS).
    session_lease_seconds: float = 10.0
    # Seconds between retention sweeps (BAE_RETENTION_INTERVAL); [retention] says what they delete.
    retention_interval: float = 300.0
    # Seconds after it was queued that a webhook delivery is retried for (BAE_WEBHOOK_MAX_AGE).
    webhook_max_age: float = 86400.0
    # Test-only: multiplies every webhook retry wait (BAE_WEBHOOK_BACKOFF_SCALE), so a test sees a
    # schedule of hours in seconds. 1 in production.
    webhook_backoff_scale: float = 1.0
    # Seconds between two passes comparing the sandbox hosts with the store (BAE_RECONCILE_INTERVAL).
    reconcile_interval: float = 60.0
    # The address other replicas and gateways reach this replica at (BAE_SESSION_ADVERTISE_ADDR);
    # None: BAE_SESSION_GRPC_ADDR, with a wildcard host replaced by this machine's address.
    session_advertise_addr: str | None = None
    # Test-only (BAE_SCHEDULE_TEST_SECONDS): schedules also take a 6-field cron whose first field counts
    # seconds, and a ticker gap of 5 s (not 60 s) counts as downtime; docs/configuration.md.
    schedule_test_seconds: bool = False
    # Browser origins the client port answers CORS for (BAE_CORS_ORIGINS; "*": any); empty: no CORS.
    cors_origins: tuple[str, ...] = ()
    # The web console at /console/ on the admin port (BAE_CONSOLE=0 turns it off: its routes are 404).
    console_enabled: bool = True
    # The path a reverse proxy serves the admin port under (BAE_CONSOLE_PREFIX, e.g. "/bae"): the proxy
    # strips it, the console puts it back in the links, requests and cookie path it makes. "": none.
    console_prefix: str = ""
    # Proxies whose X-Forwarded-For names the client in the access log (BAE_TRUSTED_PROXIES); empty: none.
    trusted_proxies: tuple[Network, ...] = ()

    @property
    def session_targets(self) -> list[str]:
        """The session replicas the gateway sends to."""
        return self.session_grpc_addrs or [self.session_grpc_addr]

    @property
    def sqlalchemy_url(self) -> str:
        return self.database_url or f"sqlite:///{self.db_path}"

    @property
    def printable_database_url(self) -> str:
        """`sqlalchemy_url` as printed for an operator: never with its password."""
        return make_url(self.sqlalchemy_url).render_as_string(hide_password=True)


def _demo_provider_addr(value: str) -> Address | None:
    """BAE_DEMO_PROVIDER_ADDR, loopback only: the demo model answers whoever reaches it, with no key."""
    if not value:
        return None
    address = parse_address("BAE_DEMO_PROVIDER_ADDR", value)
    if not address.is_loopback:
        raise UsageError(
            f"BAE_DEMO_PROVIDER_ADDR: {address} is not a loopback address; the demo provider answers anyone "
            "who reaches it, so it binds to localhost only (e.g. 127.0.0.1:8089)"
        )
    return address


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    get = env.get
    driver = get("BAE_SANDBOX_DRIVER", "docker").strip()
    if driver not in ("docker", "apple-container"):
        raise UsageError(
            f'BAE_SANDBOX_DRIVER: "{driver}" is not a supported sandbox driver '
            '(expected "docker" or "apple-container")'
        )
    admin_addr = parse_address("BAE_ADMIN_ADDR", get("BAE_ADMIN_ADDR", DEFAULT_ADMIN_ADDR))
    if not admin_addr.is_loopback:
        raise UsageError(
            f"BAE_ADMIN_ADDR: {admin_addr} is not a loopback address; "
            "the admin port must bind to localhost only"
        )
    log = get("BAE_LOG", "info").strip().lower()
    return Settings(
        addr=parse_address("BAE_ADDR", get("BAE_ADDR", "0.0.0.0:8080")),
        admin_addr=admin_addr,
        db_path=get("BAE_DB_PATH", DEFAULT_DB_PATH),
        database_url=database_url(env),
        log=log if log in ("trace", "debug", "info", "warn", "warning", "error") else "info",
        log_format=_log_format(get("BAE_LOG_FORMAT", "text")),
        shutdown_timeout=parse_seconds("BAE_SHUTDOWN_TIMEOUT", get("BAE_SHUTDOWN_TIMEOUT", "30")),
        turn_timeout=parse_seconds("BAE_TURN_TIMEOUT", get("BAE_TURN_TIMEOUT", "120")),
        config_path=get("BAE_CONFIG") or None,
        admin_key_file=get("BAE_ADMIN_KEY_FILE") or default_admin_key_file(env),
        admin_key_hash_file=get("BAE_ADMIN_KEY_HASH_FILE") or default_admin_key_file(env, "admin-key-hash.pem"),
        disable_admin_auth=is_truthy(get("BAE_DANGEROUSLY_DISABLE_ADMIN_AUTH")),
        sandbox_driver=driver,
        subagent_timeout=parse_seconds("BAE_SUBAGENT_TIMEOUT", get("BAE_SUBAGENT_TIMEOUT", "600")),
        max_subagents_per_session=parse_count(
            "BAE_MAX_SUBAGENTS_PER_SESSION", get("BAE_MAX_SUBAGENTS_PER_SESSION", "8")
        ),
        session_grpc_addr=get("BAE_SESSION_GRPC_ADDR", "127.0.0.1:50051"),
        runner_grpc_addr=get("BAE_RUNNER_GRPC_ADDR", "127.0.0.1:50052"),
        sandbox_grpc_addrs=_grpc_targets(get("BAE_SANDBOX_GRPC_ADDRS", "127.0.0.1:50053")),
        rpc_timeout=parse_timeout("BAE_RPC_TIMEOUT", get("BAE_RPC_TIMEOUT", "10")),
        provider_timeout=parse_timeout("BAE_PROVIDER_TIMEOUT", get("BAE_PROVIDER_TIMEOUT", "300")),
        mcp_timeout=parse_timeout("BAE_MCP_TIMEOUT", get("BAE_MCP_TIMEOUT", "30")),
        mcp_output_limit=parse_mcp_output_limit(get("BAE_MCP_OUTPUT_LIMIT", str(DEFAULT_MCP_OUTPUT_LIMIT))),
        demo_provider_addr=_demo_provider_addr(get("BAE_DEMO_PROVIDER_ADDR", "")),
        sqlite_synchronous=parse_sqlite_synchronous(get("BAE_SQLITE_SYNCHRONOUS", "FULL")),
        sandbox_idle_timeout=parse_seconds("BAE_SANDBOX_IDLE_TIMEOUT", get("BAE_SANDBOX_IDLE_TIMEOUT", "0")),
        max_body_bytes=parse_body_limit(get("BAE_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY_BYTES))),
        http_header_timeout=parse_timeout("BAE_HTTP_HEADER_TIMEOUT", get("BAE_HTTP_HEADER_TIMEOUT", "10")),
        http_keepalive_timeout=parse_timeout("BAE_HTTP_KEEPALIVE_TIMEOUT", get("BAE_HTTP_KEEPALIVE_TIMEOUT", "5")),
        http_max_connections=parse_max_connections(
            get("BAE_HTTP_MAX_CONNECTIONS", str(DEFAULT_HTTP_MAX_CONNECTIONS))
        ),
        internal_token=parse_internal_token(secret_setting(env, "BAE_INTERNAL_TOKEN")),
        grpc_keepalive=parse_timeout("BAE_GRPC_KEEPALIVE_INTERVAL", get("BAE_GRPC_KEEPALIVE_INTERVAL", "30")),
        session_replicas=_replicas(get("BAE_SESSION_REPLICAS", "1")),
        session_grpc_addrs=_grpc_targets(get("BAE_SESSION_GRPC_ADDRS", "")),
        session_lease_seconds=parse_timeout("BAE_SESSION_LEASE_SECONDS", get("BAE_SESSION_LEASE_SECONDS", "10")),
        retention_interval=parse_timeout("BAE_RETENTION_INTERVAL", get("BAE_RETENTION_INTERVAL", "300")),
        webhook_max_age=parse_timeout("BAE_WEBHOOK_MAX_AGE", get("BAE_WEBHOOK_MAX_AGE", "86400")),
        webhook_backoff_scale=parse_backoff_scale(get("BAE_WEBHOOK_BACKOFF_SCALE", "1")),
        session_advertise_addr=get("BAE_SESSION_ADVERTISE_ADDR", "").strip() or None,
        reconcile_interval=parse_reconcile_interval(get("BAE_RECONCILE_INTERVAL", "60")),
        cors_origins=parse_cors_origins(get("BAE_CORS_ORIGINS", "")),
        console_enabled=get("BAE_CONSOLE", "1").strip() != "0",
        console_prefix=parse_console_prefix(get("BAE_CONSOLE_PREFIX", "")),
        trusted_proxies=parse_trusted_proxies(get("BAE_TRUSTED_PROXIES", "")),
        schedule_test_seconds=is_truthy(get("BAE_SCHEDULE_TEST_SECONDS")),
    )
