"""`bae-config.toml`: loading, validation and the admin views (SERVER-SPEC §15, §8.1, §9.1, §4.5).

The file is read once at startup. Every problem is a UsageError (exit 2).
Secret-bearing values (`auth_token`, MCP `headers`, `otlp_headers`) stay as
written, `${VAR}` templates included: they are resolved by `resolve_env` only
at the moment of use, so resolved secrets never live in the Config.
"""

from __future__ import annotations

import math
import os
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from bae.common import serde
from bae.common.errors import UsageError, echo
from bae.common.limits import DEFAULT_LIMITS, Limits, LimitsError, read_limits
from bae.common.retention import DEFAULT_RETENTION, Retention, RetentionError, read_retention
from bae.common.secret_files import SecretFileError, file_variant
from bae.common.webhooks import DEFAULT_WEBHOOKS, WebhookConfigError, WebhookSettings, read_webhooks

REDACTED = "\u2022" * 8

PROVIDER_KINDS = ("anthropic", "openai")
DEFAULT_BASE_URLS = {
    "anthropic": "https://api.anthropic.com",
    "openai": "https://api.openai.com",
}
MCP_TRANSPORTS = ("stdio", "sse", "http")
DEFAULT_MAX_TOKENS = 4096
DEFAULT_SERVICE_NAME = "bae"

METRIC_NAMES = (
    "bae.sessions.open",
    "bae.sessions.total",
    "bae.events.total",
    "bae.profiles.count",
    "bae.keys.count",
    "bae.mcp.sessions.live",
    "bae.turns.pending",
    "bae.sandboxes.live",
    "bae.subagents.active",
    "bae.drivers.registered",
    "bae.turns.completed",
    "bae.provider.requests",
    "bae.provider.latency",
    "bae.tool.calls",
    "bae.tool.latency",
    # Retention (docs/observability.md): beyond TELEMETRY §4's fifteen.
    "bae.retention.sessions.deleted",
    "bae.retention.bytes.deleted",
    # Webhooks (docs/observability.md): one count per delivery attempt, by outcome, and its latency.
    "bae.webhook.deliveries",
    "bae.webhook.latency",
)


def _empty_map() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True)
class ProviderEntry:
    name: str
    provider: str  # "anthropic" | "openai": a wire format, not a vendor
    model: str
    auth_token: str = field(repr=False)  # may be a literal secret
    base_url: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    # USD per million tokens; both set or neither (then the entry's calls have no cost).
    price_input_per_mtok: float | None = None
    price_output_per_mtok: float | None = None

    @property
    def effective_base_url(self) -> str:
        if self.base_url:
            return self.base_url.rstrip("/")
        return DEFAULT_BASE_URLS[self.provider]

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float | None:
        """What a call cost at this entry's prices, None when it has none. `input_tokens` counts
        every input token, cache reads and writes included: they are priced as input."""
        if self.price_input_per_mtok is None or self.price_output_per_mtok is None:
            return None
        return (input_tokens * self.price_input_per_mtok + output_tokens * self.price_output_per_mtok) / 1_000_000


@dataclass(frozen=True)
class McpServer:
    name: str
    transport: str  # "stdio" | "sse" | "http"
    command: str | None = None
    args: tuple[str, ...] = ()
    url: str | None = None
    # Read-only mapping; left out of hash (mappings are unhashable) and repr (values are secrets).
    headers: Mapping[str, str] = field(default_factory=_empty_map, repr=False, hash=False)
    # stdio only: variables added to the child's minimal environment (values may hold secrets).
    env: Mapping[str, str] = field(default_factory=_empty_map, repr=False, hash=False)


@dataclass(frozen=True)
class Telemetry:
    enabled: bool = False
    otlp_endpoint: str | None = None
    otlp_headers: Mapping[str, str] = field(default_factory=_empty_map, repr=False, hash=False)
    sample_ratio: float = 1.0
    service_name: str = DEFAULT_SERVICE_NAME
    traces_enabled: bool = True
    metrics_enabled: bool = True
    metrics_disabled: tuple[str, ...] = ()


@dataclass(frozen=True)
class Config:
    mcp_servers: tuple[McpServer, ...] = ()
    providers: tuple[ProviderEntry, ...] = ()
    telemetry: Telemetry = Telemetry()
    # [limits]: the defaults of quotas, rate limits and budgets (bae.common.limits).
    limits: Limits = DEFAULT_LIMITS
    # [retention]: how long closed sessions are kept, and their archive (bae.common.retention).
    retention: Retention = DEFAULT_RETENTION
    # [webhooks]: the internal hosts webhook deliveries may reach (bae.common.webhooks).
    webhooks: WebhookSettings = DEFAULT_WEBHOOKS

    def provider(self, name: str) -> ProviderEntry | None:
        return next((entry for entry in self.providers if entry.name == name), None)

    def mcp_server(self, name: str) -> McpServer | None:
        return next((server for server in self.mcp_servers if server.name == name), None)


# --- ${ENV} resolution (§8.2) -------------------------------------------------


class EnvResolutionError(ValueError):
    """A `${NAME}` template that cannot be resolved; the message is the spec's text."""


def primary_not_configured(name: str) -> str:
    """Why a profile's primary provider cannot be resolved (the runner's and compaction's detail)."""
    return f'primary provider "{echo(name)}" is not configured in bae-config.toml'


def resolve_env(template: str, what: str = "provider config", env: Mapping[str, str] | None = None) -> str:
    """Replace every `${NAME}` with the variable's value; a `$` not followed by `{` is literal."""
    env = os.environ if env is None else env
    parts: list[str] = []
    position = 0
    while True:
        start = template.find("${", position)
        if start < 0:
            parts.append(template[position:])
            return "".join(parts)
        end = template.find("}", start + 2)
        if end < 0:
            raise EnvResolutionError(f"unterminated ${{...}} token in {what}")
        name = template[start + 2 : end]
        value = env.get(name)
        if value is None:
            value = _from_file(env, name, what)
        parts.append(template[position:start])
        parts.append(value)
        position = end + 1


def _from_file(env: Mapping[str, str], name: str, what: str) -> str:
    """An unset `${NAME}`'s value from the file NAME_FILE names (bae.common.secret_files)."""
    try:
        value = file_variant(env, name)
    except SecretFileError as exc:
        raise EnvResolutionError(f"{exc} (referenced by {what})") from None
    if value is None:
        raise EnvResolutionError(f"environment variable {name} referenced by {what} is not set")
    return value


# --- locating and loading (§15.1) --------------------------------------------


def load_config(path: str | None, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate the config file; `env` (default os.environ) serves the telemetry header checks."""
    if path is None:
        return Config()
    try:
        with open(path, "rb") as file:
            raw = file.read()
    except FileNotFoundError:
        return Config()
    except OSError as exc:
        raise UsageError(f'cannot read config file "{path}": {_os_error_text(exc)}') from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f'cannot read config file "{path}": stream did not contain valid UTF-8') from None
    try:
        document = tomllib.loads(text)
        mcp_servers = _parse_mcp(document.get("mcp"))
        providers = _parse_providers(document.get("providers"))
        telemetry = _parse_telemetry(document.get("telemetry"))
        limits = _parse_limits(document.get("limits"))
        retention = read_retention(_table(document.get("retention", {}), "retention"))
        webhooks = read_webhooks(_table(document.get("webhooks", {}), "webhooks"))
    except (tomllib.TOMLDecodeError, _SchemaError, LimitsError, RetentionError, WebhookConfigError) as exc:
        raise UsageError(f'invalid config file "{path}": {exc}') from None
    # Startup order (§1.2): telemetry first, then the MCP and provider registries.
    _check_telemetry(telemetry, os.environ if env is None else env)
    _check_mcp_registry(mcp_servers)
    _check_provider_registry(providers)
    return Config(mcp_servers=mcp_servers, providers=providers, telemetry=telemetry, limits=limits,
                  retention=retention, webhooks=webhooks)


def _os_error_text(exc: OSError) -> str:
    # The path is already in our message; keep only the reason, e.g. "Is a directory (os error 21)".
    if exc.strerror and exc.errno is not None:
        return f"{exc.strerror} (os error {exc.errno})"
    return str(exc)


# --- schema (§15.2): types, required and unknown fields -----------------------


class _SchemaError(ValueError):
    """A schema violation; reported as `invalid config file "<path>": <message>`."""


def _invalid_type(where: str, value: Any, expected: str) -> _SchemaError:
    return _SchemaError(f"{where}: {serde.invalid_type(value, expected)}")


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _invalid_type(where, value, "a table")
    return value


def _reject_unknown(table: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            expected = ", ".join(f"`{name}`" for name in allowed)
            raise _SchemaError(f"{where}: unknown field `{key}`, expected one of {expected}")


def _string(table: dict[str, Any], key: str, where: str, *, required: bool = False) -> str | None:
    if key not in table:
        if required:
            raise _SchemaError(f"{where}: missing field `{key}`")
        return None
    value = table[key]
    if not isinstance(value, str):
        raise _invalid_type(f"{where}.{key}", value, "a string")
    return value


def _choice(table: dict[str, Any], key: str, where: str, choices: tuple[str, ...]) -> str:
    value = _string(table, key, where, required=True)
    if value not in choices:
        names = [f"`{choice}`" for choice in choices]
        expected = " or ".join(names) if len(names) == 2 else "one of " + ", ".join(names)
        raise _SchemaError(f"{where}.{key}: unknown variant `{value}`, expected {expected}")
    return value


def _bool(table: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise _invalid_type(f"{where}.{key}", value, "a boolean")
    return value


def _required_string(table: dict[str, Any], key: str, where: str) -> str:
    value = _string(table, key, where, required=True)
    assert value is not None  # _string raised for a missing required field
    return value


def _string_list(table: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list):
        raise _invalid_type(f"{where}.{key}", value, "a sequence of strings")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise _invalid_type(f"{where}.{key}[{index}]", item, "a string")
    return tuple(value)


def _string_map(table: dict[str, Any], key: str, where: str) -> Mapping[str, str]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise _invalid_type(f"{where}.{key}", value, "a map of strings")
    for name, item in value.items():
        if not isinstance(item, str):
            raise _invalid_type(f"{where}.{key}.{name}", item, "a string")
    return MappingProxyType(dict(value))


def _table_list(value: Any, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _invalid_type(where, value, "an array of tables")
    return [_table(item, f"{where}[{index}]") for index, item in enumerate(value)]


def _parse_mcp(section: Any) -> tuple[McpServer, ...]:
    if section is None:
        return ()
    mcp = _table(section, "mcp")
    _reject_unknown(mcp, ("servers",), "mcp")
    servers = []
    for index, entry in enumerate(_table_list(mcp.get("servers"), "mcp.servers")):
        where = f"mcp.servers[{index}]"
        _reject_unknown(entry, ("name", "transport", "command", "args", "url", "headers", "env"), where)
        servers.append(
            McpServer(
                name=_required_string(entry, "name", where),
                transport=_choice(entry, "transport", where, MCP_TRANSPORTS),
                command=_string(entry, "command", where),
                args=_string_list(entry, "args", where),
                url=_string(entry, "url", where),
                headers=_string_map(entry, "headers", where),
                env=_string_map(entry, "env", where),
            )
        )
    return tuple(servers)


def _parse_providers(section: Any) -> tuple[ProviderEntry, ...]:
    # Unknown keys in [providers] and its entries are ignored (§15.1 lists only mcp and telemetry as strict).
    if section is None:
        return ()
    providers = _table(section, "providers")
    entries = []
    for index, entry in enumerate(_table_list(providers.get("entries"), "providers.entries")):
        where = f"providers.entries[{index}]"
        entries.append(
            ProviderEntry(
                name=_required_string(entry, "name", where),
                provider=_choice(entry, "provider", where, PROVIDER_KINDS),
                model=_required_string(entry, "model", where),
                auth_token=_required_string(entry, "auth_token", where),
                base_url=_string(entry, "base_url", where),
                max_tokens=_max_tokens(entry, where),
                **_prices(entry, where),
            )
        )
    return tuple(entries)


PRICE_KEYS = ("price_input_per_mtok", "price_output_per_mtok")


def _prices(entry: dict[str, Any], where: str) -> dict[str, float]:
    """The entry's prices (USD per million tokens): both or neither, each a finite number >= 0."""
    given = [key for key in PRICE_KEYS if key in entry]
    if not given:
        return {}
    if len(given) == 1:
        missing = next(key for key in PRICE_KEYS if key not in given)
        raise _SchemaError(f"{where}: `{given[0]}` is set but `{missing}` is not; set both prices or neither")
    prices = {}
    for key in PRICE_KEYS:
        value, expected = entry[key], "a number of US dollars per million tokens, 0 or more"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _invalid_type(f"{where}.{key}", value, expected)
        if not math.isfinite(value) or value < 0:
            raise _SchemaError(f"{where}.{key}: invalid value: `{value}`, expected {expected}")
        prices[key] = float(value)
    return prices


def _max_tokens(entry: dict[str, Any], where: str) -> int:
    value = entry.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid_type(f"{where}.max_tokens", value, "a positive integer")
    if value <= 0:
        raise _SchemaError(
            f"{where}.max_tokens: invalid value: integer `{value}`, expected a positive integer"
        )
    return value


def _parse_limits(section: Any) -> Limits:
    if section is None:
        return DEFAULT_LIMITS
    return DEFAULT_LIMITS.overridden(read_limits(_table(section, "limits"), "limits"))


def _parse_telemetry(section: Any) -> Telemetry:
    if section is None:
        return Telemetry()
    telemetry = _table(section, "telemetry")
    _reject_unknown(
        telemetry,
        ("enabled", "otlp_endpoint", "otlp_headers", "sample_ratio", "service_name", "traces", "metrics"),
        "telemetry",
    )
    traces = _table(telemetry.get("traces", {}), "telemetry.traces")
    _reject_unknown(traces, ("enabled",), "telemetry.traces")
    metrics = _table(telemetry.get("metrics", {}), "telemetry.metrics")
    _reject_unknown(metrics, ("enabled", "disabled"), "telemetry.metrics")
    return Telemetry(
        enabled=_bool(telemetry, "enabled", "telemetry", False),
        otlp_endpoint=_string(telemetry, "otlp_endpoint", "telemetry"),
        otlp_headers=_string_map(telemetry, "otlp_headers", "telemetry"),
        sample_ratio=_sample_ratio(telemetry),
        service_name=_string(telemetry, "service_name", "telemetry") or DEFAULT_SERVICE_NAME,
        traces_enabled=_bool(traces, "enabled", "telemetry.traces", True),
        metrics_enabled=_bool(metrics, "enabled", "telemetry.metrics", True),
        metrics_disabled=_string_list(metrics, "disabled", "telemetry.metrics"),
    )


def _sample_ratio(telemetry: dict[str, Any]) -> float:
    value = telemetry.get("sample_ratio", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid_type("telemetry.sample_ratio", value, "a number")
    return float(value)


# --- startup validation with dedicated messages (§15.3) ----------------------


def _check_telemetry(telemetry: Telemetry, env: Mapping[str, str]) -> None:
    if not telemetry.enabled:
        return
    endpoint = telemetry.otlp_endpoint
    if endpoint is None or not endpoint.strip():
        raise UsageError("[telemetry] enabled = true requires a non-empty otlp_endpoint")
    if not _is_http_url(endpoint):
        raise UsageError(f'[telemetry] otlp_endpoint "{endpoint}" must be a valid http:// or https:// URL')
    ratio = telemetry.sample_ratio
    if not 0.0 <= ratio <= 1.0:
        raise UsageError(f"[telemetry] sample_ratio {_format_ratio(ratio)} must be between 0.0 and 1.0")
    for metric in telemetry.metrics_disabled:
        if metric not in METRIC_NAMES:
            raise UsageError(f'[telemetry.metrics] disabled contains unknown metric "{metric}"')
    for name in sorted(telemetry.otlp_headers):
        if not _is_header_name(name):
            raise UsageError(f"otlp_headers[{name}]: invalid HTTP header name")
        try:
            # The spec's §8.2 texts name "provider config" for every ${VAR} error, telemetry included.
            value = resolve_env(telemetry.otlp_headers[name], env=env)
        except EnvResolutionError as exc:
            raise UsageError(f"otlp_headers[{name}]: {exc}") from None
        if not _is_header_value(value):
            raise UsageError(f"otlp_headers[{name}]: failed to parse header value")


def _is_http_url(text: str) -> bool:
    if any(char.isspace() or not char.isprintable() for char in text):
        return False  # urlsplit tolerates these; no URL parser that dials out does
    try:
        parts = urllib.parse.urlsplit(text)
        _ = parts.port  # raises ValueError on a malformed port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _format_ratio(ratio: float) -> str:
    # Integral values print like the TOML literal a user most likely wrote ("2", not "2.0").
    return str(int(ratio)) if math.isfinite(ratio) and ratio.is_integer() else repr(ratio)


_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _is_header_name(name: str) -> bool:
    """An RFC 9110 token."""
    return bool(name) and all(char in _TOKEN_CHARS for char in name)


def _is_header_value(value: str) -> bool:
    """Visible characters, spaces and tabs; no control characters (CR/LF would split the header)."""
    return all(char == "\t" or (" " <= char and char != "\x7f") for char in value)


def _check_mcp_registry(servers: tuple[McpServer, ...]) -> None:
    seen: set[str] = set()
    for server in servers:
        if not server.name.strip():
            raise UsageError("an [[mcp.servers]] entry has an empty name")
        if server.name in seen:
            raise UsageError(f'duplicate MCP server name "{server.name}" in [mcp.servers]')
        seen.add(server.name)
        required = "command" if server.transport == "stdio" else "url"
        value = server.command if required == "command" else server.url
        if value is None or not value.strip():
            raise UsageError(
                f'MCP server "{server.name}" uses transport "{server.transport}" '
                f'but is missing required field "{required}"'
            )


def _check_provider_registry(providers: tuple[ProviderEntry, ...]) -> None:
    seen: set[str] = set()
    for entry in providers:
        if not entry.name.strip():
            raise UsageError("a [[providers.entries]] entry has an empty name")
        if entry.name in seen:
            raise UsageError(f'duplicate provider name "{entry.name}" in [providers.entries]')
        seen.add(entry.name)


# --- admin views (§4.5) -------------------------------------------------------


def _by_name(config: Config) -> tuple[list[McpServer], list[ProviderEntry]]:
    """The registries in the order every admin view lists them: by name."""
    return (sorted(config.mcp_servers, key=lambda server: server.name),
            sorted(config.providers, key=lambda entry: entry.name))


def mcp_servers_view(config: Config) -> dict[str, Any]:
    servers, _ = _by_name(config)
    return {"items": [{"name": server.name, "transport": server.transport} for server in servers]}


def providers_view(config: Config) -> dict[str, Any]:
    _, entries = _by_name(config)
    return {
        "items": [
            {
                "name": entry.name,
                "provider": entry.provider,
                "model": entry.model,
                "base_url": entry.effective_base_url,
                **_price_view(entry),
            }
            for entry in entries
        ]
    }


def _price_view(entry: ProviderEntry) -> dict[str, float]:
    """An entry's prices, for the views that show entries; nothing when it has none."""
    if entry.price_input_per_mtok is None or entry.price_output_per_mtok is None:
        return {}
    return {"price_input_per_mtok": entry.price_input_per_mtok, "price_output_per_mtok": entry.price_output_per_mtok}


def _redacted(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: REDACTED for name in sorted(headers)}


def config_view(config: Config) -> dict[str, Any]:
    """GET /admin/v1/config: the loaded config with every secret value replaced by REDACTED."""
    telemetry = config.telemetry
    servers, entries = _by_name(config)
    return {
        "mcp": {
            "servers": [
                {
                    "name": server.name,
                    "transport": server.transport,
                    "command": server.command,
                    "args": list(server.args),
                    "url": server.url,
                    "headers": _redacted(server.headers),
                    "env": _redacted(server.env),
                }
                for server in servers
            ]
        },
        "providers": {
            "entries": [
                {
                    "name": entry.name,
                    "provider": entry.provider,
                    "model": entry.model,
                    # The URL requests go to, as /admin/v1/providers shows it: the configured one, else the default.
                    "base_url": entry.effective_base_url,
                    "auth_token": REDACTED,
                    **_price_view(entry),
                }
                for entry in entries
            ]
        },
        "telemetry": {
            "enabled": telemetry.enabled,
            "otlp_endpoint": telemetry.otlp_endpoint,
            "otlp_headers": _redacted(telemetry.otlp_headers),
            "sample_ratio": telemetry.sample_ratio,
            "service_name": telemetry.service_name,
            "traces": {"enabled": telemetry.traces_enabled},
            "metrics": {"enabled": telemetry.metrics_enabled, "disabled": list(telemetry.metrics_disabled)},
        },
    }
