"""bae-config.toml loading, validation, ${ENV} resolution and the admin views (SERVER-SPEC §15, §4.5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bae.common.config import (
    REDACTED,
    Config,
    EnvResolutionError,
    McpServer,
    ProviderEntry,
    Telemetry,
    config_view,
    load_config,
    mcp_servers_view,
    providers_view,
    resolve_env,
)
from bae.common.errors import UsageError
from bae.common.limits import Limits

pytestmark = pytest.mark.unit

PROVIDER = """
[[providers.entries]]
name = "main"
provider = "anthropic"
model = "claude-sonnet-4-6"
auth_token = "${ANTHROPIC_API_KEY}"
"""

FULL = """
title = "unknown top-level keys are ignored"
[other]
anything = 1

[mcp]
[[mcp.servers]]
name = "search"
transport = "sse"
url = "https://mcp.example/sse"
headers = { X-Zeta = "literal-secret", Authorization = "Bearer ${SEARCH_MCP_TOKEN}", Empty = "" }

[[mcp.servers]]
name = "filesystem"
transport = "stdio"
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "${DATA_DIR}"]

[providers]
ignored_key = true
[[providers.entries]]
name = "openai-mini"
provider = "openai"
model = "gpt-4o-mini"
auth_token = "sk-literal-secret"
base_url = "http://127.0.0.1:9999/"
unknown_provider_field = "ignored"

[[providers.entries]]
name = "anthropic-sonnet"
provider = "anthropic"
model = "claude-sonnet-4-6"
auth_token = "${ANTHROPIC_API_KEY}"
max_tokens = 8096

[[providers.entries]]
name = "filesystem"
provider = "anthropic"
model = "m"
auth_token = ""

[telemetry]
enabled = true
otlp_endpoint = "http://otel-collector:4317"
otlp_headers = { authorization = "Bearer ${OTEL_TOKEN}", x-tenant = "acme" }
sample_ratio = 0.25
service_name = "bae-test"
[telemetry.traces]
enabled = false
[telemetry.metrics]
enabled = true
disabled = ["bae.tool.latency", "bae.sessions.open"]
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bae-config.toml"
    path.write_text(text)
    return str(path)


def load_text(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Config:
    return load_config(write(tmp_path, text), env=env or {})


def usage_error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(UsageError) as caught:
        load_text(tmp_path, text, env)
    return str(caught.value)


# --- loading -----------------------------------------------------------------


def test_no_path_and_missing_file_give_empty_config(tmp_path: Path) -> None:
    assert load_config(None) == Config()
    assert load_config(str(tmp_path / "absent.toml")) == Config()
    empty = load_config(None)
    assert empty.mcp_servers == () and empty.providers == ()
    assert empty.telemetry == Telemetry(enabled=False, service_name="bae")


def test_unreadable_path_is_a_usage_error(tmp_path: Path) -> None:
    # Tests run as root, so chmod 000 would still be readable: a directory is the unreadable path.
    with pytest.raises(UsageError) as caught:
        load_config(str(tmp_path))
    assert str(caught.value) == f'cannot read config file "{tmp_path}": Is a directory (os error 21)'


def test_non_utf8_file_is_a_read_error(tmp_path: Path) -> None:
    path = tmp_path / "bae-config.toml"
    path.write_bytes(b'title = "\xff"\n')
    with pytest.raises(UsageError) as caught:
        load_config(str(path))
    assert str(caught.value) == f'cannot read config file "{path}": stream did not contain valid UTF-8'


def test_malformed_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[mcp\nname = 1\n")
    with pytest.raises(UsageError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f'invalid config file "{path}": ')
    assert "line 1" in str(caught.value)


def test_full_config_is_parsed_with_templates_kept(tmp_path: Path) -> None:
    config = load_text(tmp_path, FULL, env={"OTEL_TOKEN": "t"})

    search = config.mcp_server("search")
    assert search == McpServer(
        name="search",
        transport="sse",
        url="https://mcp.example/sse",
        headers={"X-Zeta": "literal-secret", "Authorization": "Bearer ${SEARCH_MCP_TOKEN}", "Empty": ""},
    )
    filesystem = config.mcp_server("filesystem")
    assert filesystem is not None
    assert filesystem.command == "npx"
    assert filesystem.args == ("-y", "@modelcontextprotocol/server-filesystem", "${DATA_DIR}")
    assert filesystem.url is None and dict(filesystem.headers) == {}
    assert config.mcp_server("missing") is None

    sonnet = config.provider("anthropic-sonnet")
    assert sonnet == ProviderEntry(
        name="anthropic-sonnet",
        provider="anthropic",
        model="claude-sonnet-4-6",
        auth_token="${ANTHROPIC_API_KEY}",
        max_tokens=8096,
    )
    mini = config.provider("openai-mini")
    assert mini is not None and mini.max_tokens == 4096 and mini.base_url == "http://127.0.0.1:9999/"
    # MCP and provider names are separate namespaces.
    assert config.provider("filesystem") is not None and config.mcp_server("filesystem") is not None
    assert config.provider("search") is None

    assert config.telemetry == Telemetry(
        enabled=True,
        otlp_endpoint="http://otel-collector:4317",
        otlp_headers={"authorization": "Bearer ${OTEL_TOKEN}", "x-tenant": "acme"},
        sample_ratio=0.25,
        service_name="bae-test",
        traces_enabled=False,
        metrics_enabled=True,
        metrics_disabled=("bae.tool.latency", "bae.sessions.open"),
    )
    # Validation resolved the header, but memory keeps the template.
    assert config.telemetry.otlp_headers["authorization"] == "Bearer ${OTEL_TOKEN}"


def test_secrets_are_not_in_repr(tmp_path: Path) -> None:
    config = load_text(tmp_path, FULL, env={"OTEL_TOKEN": "t"})
    text = repr(config)
    assert "sk-literal-secret" not in text and "literal-secret" not in text and "acme" not in text


def test_effective_base_url() -> None:
    def entry(kind: str, base_url: str | None) -> ProviderEntry:
        return ProviderEntry(name="p", provider=kind, model="m", auth_token="t", base_url=base_url)

    assert entry("anthropic", None).effective_base_url == "https://api.anthropic.com"
    assert entry("openai", None).effective_base_url == "https://api.openai.com"
    assert entry("openai", "http://127.0.0.1:9/v/").effective_base_url == "http://127.0.0.1:9/v"
    assert entry("anthropic", "https://proxy.example").effective_base_url == "https://proxy.example"


# --- §15.3 dedicated messages ----------------------------------------------------


@pytest.mark.parametrize("name", ["", "   "])
def test_mcp_empty_name(tmp_path: Path, name: str) -> None:
    text = f'[[mcp.servers]]\nname = "{name}"\ntransport = "stdio"\ncommand = "x"\n'
    assert usage_error(tmp_path, text) == "an [[mcp.servers]] entry has an empty name"


def test_mcp_duplicate_name(tmp_path: Path) -> None:
    entry = '[[mcp.servers]]\nname = "fs"\ntransport = "stdio"\ncommand = "x"\n'
    assert usage_error(tmp_path, entry * 2) == 'duplicate MCP server name "fs" in [mcp.servers]'


@pytest.mark.parametrize(
    ("transport", "extra", "field"),
    [
        ("stdio", "", "command"),
        ("stdio", 'command = "  "', "command"),
        ("stdio", 'url = "http://x"', "command"),
        ("sse", "", "url"),
        ("http", 'url = ""', "url"),
        ("http", 'command = "npx"', "url"),
    ],
)
def test_mcp_missing_transport_field(tmp_path: Path, transport: str, extra: str, field: str) -> None:
    text = f'[[mcp.servers]]\nname = "s"\ntransport = "{transport}"\n{extra}\n'
    assert usage_error(tmp_path, text) == (
        f'MCP server "s" uses transport "{transport}" but is missing required field "{field}"'
    )


@pytest.mark.parametrize("name", ["", " \t"])
def test_provider_empty_name(tmp_path: Path, name: str) -> None:
    text = PROVIDER.replace('name = "main"', f'name = "{name}"')
    assert usage_error(tmp_path, text) == "a [[providers.entries]] entry has an empty name"


def test_provider_duplicate_name(tmp_path: Path) -> None:
    assert usage_error(tmp_path, PROVIDER * 2) == 'duplicate provider name "main" in [providers.entries]'


TELEMETRY_ON = '[telemetry]\nenabled = true\notlp_endpoint = "https://otel.example:4318"\n'


@pytest.mark.parametrize("endpoint", [None, "", "   "])
def test_telemetry_requires_endpoint(tmp_path: Path, endpoint: str | None) -> None:
    text = "[telemetry]\nenabled = true\n"
    if endpoint is not None:
        text += f'otlp_endpoint = "{endpoint}"\n'
    assert usage_error(tmp_path, text) == "[telemetry] enabled = true requires a non-empty otlp_endpoint"


@pytest.mark.parametrize(
    "endpoint",
    ["otel:4317", "grpc://otel:4317", "http://", "http://:4317", "http://otel:99999", "http://ot el:4317", "ftp://x"],
)
def test_telemetry_endpoint_must_be_http_url(tmp_path: Path, endpoint: str) -> None:
    text = f'[telemetry]\nenabled = true\notlp_endpoint = "{endpoint}"\n'
    assert usage_error(tmp_path, text) == (
        f'[telemetry] otlp_endpoint "{endpoint}" must be a valid http:// or https:// URL'
    )


@pytest.mark.parametrize(("literal", "shown"), [("1.5", "1.5"), ("-0.1", "-0.1"), ("2", "2"), ("2.0", "2")])
def test_telemetry_sample_ratio_range(tmp_path: Path, literal: str, shown: str) -> None:
    text = TELEMETRY_ON + f"sample_ratio = {literal}\n"
    assert usage_error(tmp_path, text) == f"[telemetry] sample_ratio {shown} must be between 0.0 and 1.0"


@pytest.mark.parametrize("literal", ["0.0", "1.0", "0", "1"])
def test_telemetry_sample_ratio_bounds_are_inclusive(tmp_path: Path, literal: str) -> None:
    config = load_text(tmp_path, TELEMETRY_ON + f"sample_ratio = {literal}\n")
    assert config.telemetry.sample_ratio == float(literal)
    assert isinstance(config.telemetry.sample_ratio, float)


def test_telemetry_unknown_metric(tmp_path: Path) -> None:
    text = TELEMETRY_ON + '[telemetry.metrics]\ndisabled = ["bae.turns.pending", "bae.nope"]\n'
    assert usage_error(tmp_path, text) == '[telemetry.metrics] disabled contains unknown metric "bae.nope"'


def test_telemetry_header_unset_variable(tmp_path: Path) -> None:
    text = TELEMETRY_ON + 'otlp_headers = { authorization = "Bearer ${OTEL_TOKEN}" }\n'
    assert usage_error(tmp_path, text) == (
        "otlp_headers[authorization]: environment variable OTEL_TOKEN referenced by provider config is not set"
    )
    assert load_text(tmp_path, text, env={"OTEL_TOKEN": "abc"}).telemetry.enabled


def test_telemetry_header_unterminated_token(tmp_path: Path) -> None:
    text = TELEMETRY_ON + 'otlp_headers = { x-token = "${OTEL_TOKEN" }\n'
    assert usage_error(tmp_path, text) == "otlp_headers[x-token]: unterminated ${...} token in provider config"


@pytest.mark.parametrize("name", ["bad name", "", "x:y", "caf\u00e9"])
def test_telemetry_header_invalid_name(tmp_path: Path, name: str) -> None:
    text = TELEMETRY_ON + f'otlp_headers = {{ "{name}" = "v" }}\n'
    assert usage_error(tmp_path, text) == f"otlp_headers[{name}]: invalid HTTP header name"


@pytest.mark.parametrize("value", ["a\\nb", "a\\rb", "\\u0000", "\\u007f"])
def test_telemetry_header_invalid_value(tmp_path: Path, value: str) -> None:
    text = TELEMETRY_ON + f'otlp_headers = {{ x-token = "{value}" }}\n'
    assert usage_error(tmp_path, text) == "otlp_headers[x-token]: failed to parse header value"


def test_telemetry_header_value_checked_after_resolution(tmp_path: Path) -> None:
    text = TELEMETRY_ON + 'otlp_headers = { x-token = "${OTEL_TOKEN}" }\n'
    message = usage_error(tmp_path, text, env={"OTEL_TOKEN": "line\nbreak"})
    assert message == "otlp_headers[x-token]: failed to parse header value"
    assert load_text(tmp_path, text, env={"OTEL_TOKEN": "tab\tand caf\u00e9"}).telemetry.enabled


def test_telemetry_checks_only_when_enabled(tmp_path: Path) -> None:
    text = """
[telemetry]
enabled = false
otlp_endpoint = "not a url"
otlp_headers = { "bad name" = "${UNSET_VAR}" }
sample_ratio = 7.5
[telemetry.metrics]
disabled = ["bae.nope"]
"""
    telemetry = load_text(tmp_path, text).telemetry
    assert not telemetry.enabled
    assert telemetry.sample_ratio == 7.5
    assert telemetry.metrics_disabled == ("bae.nope",)


# --- schema violations -> invalid config file -------------------------------------


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ('[[mcp.servers]]\nname = "s"\ntransport = "ws"\nurl = "x"\n',
         "mcp.servers[0].transport: unknown variant `ws`, expected one of `stdio`, `sse`, `http`"),
        ('[[mcp.servers]]\nname = "s"\nurl = "x"\n', "mcp.servers[0]: missing field `transport`"),
        ('[[mcp.servers]]\ntransport = "stdio"\ncommand = "x"\n', "mcp.servers[0]: missing field `name`"),
        ('[[mcp.servers]]\nname = "s"\ntransport = "stdio"\ncommand = "x"\ncwd = "/"\n',
         "mcp.servers[0]: unknown field `cwd`, expected one of `name`, `transport`, `command`, `args`, `url`, "
         "`headers`, `env`"),
        ('[mcp]\nextra = 1\n', "mcp: unknown field `extra`, expected one of `servers`"),
        ('[[mcp.servers]]\nname = "s"\ntransport = "stdio"\ncommand = "x"\nargs = ["a", 1]\n',
         "mcp.servers[0].args[1]: invalid type: integer `1`, expected a string"),
        ('[[mcp.servers]]\nname = "s"\ntransport = "sse"\nurl = "x"\nheaders = { A = true }\n',
         "mcp.servers[0].headers.A: invalid type: boolean `true`, expected a string"),
        ('[[mcp.servers]]\nname = 5\ntransport = "stdio"\ncommand = "x"\n',
         "mcp.servers[0].name: invalid type: integer `5`, expected a string"),
        ("mcp = 3\n", "mcp: invalid type: integer `3`, expected a table"),
        ("[mcp]\nservers = 1\n", "mcp.servers: invalid type: integer `1`, expected an array of tables"),
        (PROVIDER.replace('"anthropic"', '"gemini"'),
         "providers.entries[0].provider: unknown variant `gemini`, expected `anthropic` or `openai`"),
        (PROVIDER.replace('model = "claude-sonnet-4-6"', ""), "providers.entries[0]: missing field `model`"),
        (PROVIDER.replace('auth_token = "${ANTHROPIC_API_KEY}"', ""),
         "providers.entries[0]: missing field `auth_token`"),
        (PROVIDER.replace('name = "main"', ""), "providers.entries[0]: missing field `name`"),
        (PROVIDER.replace('provider = "anthropic"', ""), "providers.entries[0]: missing field `provider`"),
        (PROVIDER + "max_tokens = 0\n",
         "providers.entries[0].max_tokens: invalid value: integer `0`, expected a positive integer"),
        (PROVIDER + 'max_tokens = "8096"\n',
         'providers.entries[0].max_tokens: invalid type: string "8096", expected a positive integer'),
        (PROVIDER + "max_tokens = true\n",
         "providers.entries[0].max_tokens: invalid type: boolean `true`, expected a positive integer"),
        (PROVIDER + "base_url = 1.5\n",
         "providers.entries[0].base_url: invalid type: floating point `1.5`, expected a string"),
        ("[telemetry]\nenabled = true\nendpoint = \"http://x\"\n",
         "telemetry: unknown field `endpoint`, expected one of `enabled`, `otlp_endpoint`, `otlp_headers`, "
         "`sample_ratio`, `service_name`, `traces`, `metrics`"),
        ("[telemetry.traces]\nenabled = true\nratio = 1\n",
         "telemetry.traces: unknown field `ratio`, expected one of `enabled`"),
        ("[telemetry.metrics]\nexcluded = []\n",
         "telemetry.metrics: unknown field `excluded`, expected one of `enabled`, `disabled`"),
        ('[telemetry]\nenabled = "yes"\n', 'telemetry.enabled: invalid type: string "yes", expected a boolean'),
        ('[telemetry]\nsample_ratio = "1"\n', 'telemetry.sample_ratio: invalid type: string "1", expected a number'),
        ("[telemetry.metrics]\ndisabled = \"bae.tool.calls\"\n",
         'telemetry.metrics.disabled: invalid type: string "bae.tool.calls", expected a sequence of strings'),
    ],
)
def test_schema_violations(tmp_path: Path, text: str, detail: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as caught:
        load_config(path, env={})
    assert str(caught.value) == f'invalid config file "{path}": {detail}'


def test_schema_errors_win_over_registry_checks(tmp_path: Path) -> None:
    # A blank MCP name is a registry check; a bad provider kind is a parse error and is reported first.
    text = '[[mcp.servers]]\nname = ""\ntransport = "stdio"\n' + PROVIDER.replace('"anthropic"', '"x"')
    assert usage_error(tmp_path, text).startswith("invalid config file ")


def test_unknown_top_level_and_provider_fields_are_ignored(tmp_path: Path) -> None:
    text = '[server]\nport = 1\n[providers]\nextra = "x"\n' + PROVIDER.replace(
        "[[providers.entries]]", "[[providers.entries]]\nnote = 1"
    )
    config = load_text(tmp_path, text)
    assert [entry.name for entry in config.providers] == ["main"]


# --- ${ENV} resolution -----------------------------------------------------------


def test_resolve_env() -> None:
    env = {"A": "one", "B": "two", "EMPTY": "", "NESTED": "${A}"}
    assert resolve_env("plain", env=env) == "plain"
    assert resolve_env("", env=env) == ""
    assert resolve_env("${A}", env=env) == "one"
    assert resolve_env("Bearer ${A}-${B}${A}", env=env) == "Bearer one-twoone"
    assert resolve_env("x${EMPTY}y", env=env) == "xy"
    assert resolve_env("$A $ $$ a$b {A} $", env=env) == "$A $ $$ a$b {A} $"
    assert resolve_env("$${A}", env=env) == "$one"
    assert resolve_env("${NESTED}", env=env) == "${A}"  # values are not re-scanned
    assert resolve_env("${A}}", env=env) == "one}"


def test_resolve_env_uses_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAE_TEST_CONFIG_TOKEN", "from-os")
    assert resolve_env("t=${BAE_TEST_CONFIG_TOKEN}") == "t=from-os"


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("${A", "unterminated ${...} token in provider config"),
        ("ok ${A} then ${", "unterminated ${...} token in provider config"),
        ("${MISSING}", "environment variable MISSING referenced by provider config is not set"),
        ("${A}${MISSING}", "environment variable MISSING referenced by provider config is not set"),
        ("${}", "environment variable  referenced by provider config is not set"),
    ],
)
def test_resolve_env_errors(template: str, message: str) -> None:
    with pytest.raises(EnvResolutionError) as caught:
        resolve_env(template, env={"A": "one"})
    assert str(caught.value) == message
    assert isinstance(caught.value, ValueError)


def test_resolve_env_names_what_it_resolves() -> None:
    with pytest.raises(EnvResolutionError, match="^environment variable X referenced by MCP config is not set$"):
        resolve_env("${X}", "MCP config", env={})


# --- admin views -------------------------------------------------------------------


def test_registry_views_are_sorted_with_effective_base_url(tmp_path: Path) -> None:
    config = load_text(tmp_path, FULL, env={"OTEL_TOKEN": "t"})
    assert mcp_servers_view(config) == {
        "items": [{"name": "filesystem", "transport": "stdio"}, {"name": "search", "transport": "sse"}]
    }
    assert providers_view(config) == {
        "items": [
            {"name": "anthropic-sonnet", "provider": "anthropic", "model": "claude-sonnet-4-6",
             "base_url": "https://api.anthropic.com"},
            {"name": "filesystem", "provider": "anthropic", "model": "m", "base_url": "https://api.anthropic.com"},
            {"name": "openai-mini", "provider": "openai", "model": "gpt-4o-mini", "base_url": "http://127.0.0.1:9999"},
        ]
    }


def test_config_view_redacts_every_secret(tmp_path: Path) -> None:
    config = load_text(tmp_path, FULL, env={"OTEL_TOKEN": "t"})
    view = config_view(config)
    assert view == {
        "mcp": {
            "servers": [  # sorted by name, as /admin/v1/mcp-servers lists them
                {"name": "filesystem", "transport": "stdio", "command": "npx",
                 "args": ["-y", "@modelcontextprotocol/server-filesystem", "${DATA_DIR}"], "url": None, "headers": {},
                 "env": {}},
                {"name": "search", "transport": "sse", "command": None, "args": [], "url": "https://mcp.example/sse",
                 "headers": {"Authorization": REDACTED, "Empty": REDACTED, "X-Zeta": REDACTED}, "env": {}},
            ]
        },
        "providers": {
            "entries": [  # sorted by name, as /admin/v1/providers lists them
                # An entry without base_url shows the effective one, as /admin/v1/providers does.
                {"name": "anthropic-sonnet", "provider": "anthropic", "model": "claude-sonnet-4-6",
                 "base_url": "https://api.anthropic.com", "auth_token": REDACTED},
                {"name": "filesystem", "provider": "anthropic", "model": "m", "base_url": "https://api.anthropic.com",
                 "auth_token": REDACTED},
                {"name": "openai-mini", "provider": "openai", "model": "gpt-4o-mini",
                 "base_url": "http://127.0.0.1:9999", "auth_token": REDACTED},  # as requests use it
            ]
        },
        "telemetry": {
            "enabled": True,
            "otlp_endpoint": "http://otel-collector:4317",
            "otlp_headers": {"authorization": REDACTED, "x-tenant": REDACTED},
            "sample_ratio": 0.25,
            "service_name": "bae-test",
            "traces": {"enabled": False},
            "metrics": {"enabled": True, "disabled": ["bae.tool.latency", "bae.sessions.open"]},
        },
    }
    assert REDACTED == "••••••••" and len(REDACTED) == 8
    # Header names come out sorted, and no secret of any kind survives serialization.
    assert list(view["mcp"]["servers"][1]["headers"]) == ["Authorization", "Empty", "X-Zeta"]
    body = json.dumps(view, ensure_ascii=False)
    for secret in ("literal-secret", "SEARCH_MCP_TOKEN", "sk-literal", "ANTHROPIC_API_KEY", "OTEL_TOKEN", "acme"):
        assert secret not in body


def test_config_view_of_empty_config() -> None:
    assert config_view(Config()) == {
        "mcp": {"servers": []},
        "providers": {"entries": []},
        "telemetry": {
            "enabled": False,
            "otlp_endpoint": None,
            "otlp_headers": {},
            "sample_ratio": 1.0,
            "service_name": "bae",
            "traces": {"enabled": True},
            "metrics": {"enabled": True, "disabled": []},
        },
    }
    assert mcp_servers_view(Config()) == {"items": []}
    assert providers_view(Config()) == {"items": []}


def test_telemetry_section_defaults(tmp_path: Path) -> None:
    assert load_text(tmp_path, "[telemetry]\n").telemetry == Telemetry()
    assert load_text(tmp_path, '[telemetry]\nservice_name = ""\n').telemetry.service_name == "bae"


# --- prices ----------------------------------------------------------------------------


def test_prices_cost_and_show_in_the_views(tmp_path: Path) -> None:
    priced = PROVIDER + "price_input_per_mtok = 3\nprice_output_per_mtok = 15.5\n"
    config = load_text(tmp_path, priced)
    entry = config.provider("main")
    assert entry is not None and (entry.price_input_per_mtok, entry.price_output_per_mtok) == (3.0, 15.5)
    # Cache tokens are input: the caller counts them in `input_tokens`.
    assert entry.cost_usd(1_000_000, 2_000) == pytest.approx(3.031)
    assert providers_view(config)["items"][0]["price_output_per_mtok"] == 15.5
    assert config_view(config)["providers"]["entries"][0]["price_input_per_mtok"] == 3.0
    unpriced = load_text(tmp_path, PROVIDER).provider("main")
    assert unpriced is not None and unpriced.cost_usd(10, 10) is None


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ("price_input_per_mtok = 3\n", "`price_input_per_mtok` is set but `price_output_per_mtok` is not"),
        ("price_input_per_mtok = -1\nprice_output_per_mtok = 1\n", "price_input_per_mtok: invalid value: `-1`"),
        ('price_input_per_mtok = 1\nprice_output_per_mtok = "2"\n', "price_output_per_mtok: invalid type"),
        ("price_input_per_mtok = nan\nprice_output_per_mtok = 1\n", "price_input_per_mtok: invalid value"),
    ],
)
def test_bad_prices_are_refused(tmp_path: Path, lines: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_text(tmp_path, PROVIDER + lines)


def test_limits_table_sets_the_defaults_a_profile_overrides(tmp_path: Path) -> None:
    config = load_text(tmp_path, "[limits]\nmax_open_sessions_per_key = 5\nsession_cost_usd = 2\nburst = 7\n")
    assert (config.limits.max_open_sessions_per_key, config.limits.burst) == (5, 7)
    assert config.limits.session_cost_usd == 2.0 and config.limits.session_tokens is None
    assert config.limits.max_sandboxes_per_key == 10  # untouched keys keep their defaults
    profile = config.limits.overridden({"burst": 3, "session_tokens": 1000, "max_open_sessions_per_key": None})
    assert (profile.burst, profile.session_tokens, profile.max_open_sessions_per_key) == (3, 1000, 5)
    assert load_text(tmp_path, "").limits == Limits()


@pytest.mark.parametrize("text, message", [
    ("[limits]\nmax_open_sessions_per_kye = 5\n", "limits: unknown key `max_open_sessions_per_kye`"),
    ("[limits]\nburst = 0\n", "limits.burst must be between 1 and"),
    ("[limits]\nburst = 1.5\n", "limits.burst must be an integer"),
    ("[limits]\nrequests_per_second_per_key = 0\n", "limits.requests_per_second_per_key must be above 0"),
    ("[limits]\nkey_daily_cost_usd = -1\n", "limits.key_daily_cost_usd must be at least 0"),
    ("[limits]\nsession_tokens = true\n", "limits.session_tokens must be an integer"),
    ("limits = 3\n", "limits: invalid type: integer `3`, expected a table"),
])
def test_bad_limits_are_usage_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UsageError, match="invalid config file") as raised:
        load_text(tmp_path, text)
    assert message in str(raised.value)
