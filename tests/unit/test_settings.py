"""Settings from the environment: defaults, parsing, and the one-line usage errors."""

from __future__ import annotations

import pytest

from bae.common.errors import UsageError
from bae.common.settings import Address, load_settings

pytestmark = pytest.mark.unit


def test_defaults() -> None:
    settings = load_settings({})
    assert settings.addr == Address("0.0.0.0", 8080)
    assert str(settings.admin_addr) == "127.0.0.1:8081"
    assert settings.sqlalchemy_url == "sqlite:////var/lib/bae/bae.db"
    assert (settings.shutdown_timeout, settings.turn_timeout, settings.subagent_timeout) == (30, 120, 600)
    assert (settings.rpc_timeout, settings.provider_timeout, settings.mcp_timeout) == (10.0, 300.0, 30.0)
    assert settings.sandbox_driver == "docker"
    assert settings.sandbox_grpc_addrs == ["127.0.0.1:50053"]
    assert settings.log == "info"
    assert settings.reconcile_interval == 60.0


def test_values_are_trimmed_and_lists_split() -> None:
    settings = load_settings({
        "BAE_TURN_TIMEOUT": " 5 ",
        "BAE_MCP_TIMEOUT": "2",
        "BAE_SANDBOX_DRIVER": " docker ",
        "BAE_SANDBOX_GRPC_ADDRS": "sandbox:50053, 10.0.0.5:50053,,",
        "BAE_ADMIN_ADDR": "[::1]:9000",
        "BAE_DATABASE_URL": "postgresql://db/bae",
        "BAE_RECONCILE_INTERVAL": " 86400 ",
    })
    assert settings.turn_timeout == 5
    assert settings.mcp_timeout == 2.0
    assert settings.sandbox_grpc_addrs == ["sandbox:50053", "10.0.0.5:50053"]
    assert str(settings.admin_addr) == "[::1]:9000"
    assert settings.sqlalchemy_url == "postgresql://db/bae"
    assert settings.reconcile_interval == 86400.0


@pytest.mark.parametrize("env,message", [
    ({"BAE_SHUTDOWN_TIMEOUT": "1.5"}, 'BAE_SHUTDOWN_TIMEOUT: "1.5" is not a whole number of seconds'),
    ({"BAE_TURN_TIMEOUT": "-1"}, 'BAE_TURN_TIMEOUT: "-1" is not a whole number of seconds'),
    ({"BAE_MCP_TIMEOUT": "soon"}, 'BAE_MCP_TIMEOUT: "soon" is not a whole number of seconds'),
    ({"BAE_MCP_TIMEOUT": "0"}, 'BAE_MCP_TIMEOUT: "0" must be at least 1 second'),
    ({"BAE_RPC_TIMEOUT": "0"}, 'BAE_RPC_TIMEOUT: "0" must be at least 1 second'),
    ({"BAE_RECONCILE_INTERVAL": "0"}, 'BAE_RECONCILE_INTERVAL: "0" must be at least 1 second'),
    ({"BAE_RECONCILE_INTERVAL": "0.5"}, 'BAE_RECONCILE_INTERVAL: "0.5" is not a whole number of seconds'),
    ({"BAE_RECONCILE_INTERVAL": "86401"}, 'BAE_RECONCILE_INTERVAL: "86401" must be at most 86400 seconds (a day)'),
    ({"BAE_MAX_SUBAGENTS_PER_SESSION": "x"}, 'BAE_MAX_SUBAGENTS_PER_SESSION: "x" is not a non-negative integer'),
    ({"BAE_SANDBOX_DRIVER": "podman"},
     'BAE_SANDBOX_DRIVER: "podman" is not a supported sandbox driver (expected "docker" or "apple-container")'),
    ({"BAE_ADMIN_ADDR": "0.0.0.0:8081"},
     "BAE_ADMIN_ADDR: 0.0.0.0:8081 is not a loopback address; the admin port must bind to localhost only"),
    ({"BAE_DEMO_PROVIDER_ADDR": "10.1.2.3:8089"},
     "BAE_DEMO_PROVIDER_ADDR: 10.1.2.3:8089 is not a loopback address; the demo provider answers anyone who "
     "reaches it, so it binds to localhost only (e.g. 127.0.0.1:8089)"),
    ({"BAE_ADDR": "localhost:8080"},
     'BAE_ADDR: "localhost:8080" is not a valid host:port address '
     "(Expected 4 octets in 'localhost')"),
])
def test_invalid_values_are_usage_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        load_settings(env)
    assert str(caught.value) == message


def test_printed_database_url_hides_the_password() -> None:
    settings = load_settings({"BAE_DATABASE_URL": "postgresql+asyncpg://bae:s3cret-pw@db:5432/bae"})
    assert settings.printable_database_url == "postgresql+asyncpg://bae:***@db:5432/bae"
    assert load_settings({"BAE_DB_PATH": "/d/bae.db"}).printable_database_url == "sqlite:////d/bae.db"


def test_cors_origins_are_read_as_browsers_send_them() -> None:
    assert load_settings({}).cors_origins == ()
    origins = " https://App.Example.com, http://localhost:5173,,https://app.example.com:443,http://[::1]:8080, " \
              "http://127.0.0.1:80 "
    settings = load_settings({"BAE_CORS_ORIGINS": origins})
    # Lower case, without a default port, each once: what a browser's Origin header holds.
    assert settings.cors_origins == ("https://app.example.com", "http://localhost:5173", "http://[::1]:8080",
                                     "http://127.0.0.1")
    assert load_settings({"BAE_CORS_ORIGINS": "*"}).cors_origins == ("*",)


@pytest.mark.parametrize("entry,reason", [
    ("https://app.example.com/", "an origin has no path, query or fragment, not even a trailing /"),
    ("https://app.example.com/ui", "an origin has no path, query or fragment, not even a trailing /"),
    ("app.example.com", "expected scheme://host[:port]"),
    ("null", "expected scheme://host[:port]"),
    ("file:///index.html", "expected scheme://host[:port]"),
    ("https://user@app.example.com", "an origin has no user name or password"),
    ("https://app.example.com:0", "the port must be a number from 1 to 65535"),
    ("https://app.example.com:65536", "the port must be a number from 1 to 65535"),
    ("https://app.example.com:web", "the port must be a number from 1 to 65535"),
    ("https://app_example.com", '"app_example.com" is not a host name'),
])
def test_an_entry_that_is_not_an_origin_is_a_usage_error(entry: str, reason: str) -> None:
    with pytest.raises(UsageError) as caught:
        load_settings({"BAE_CORS_ORIGINS": f"https://ok.example.com,{entry}"})
    assert str(caught.value) == (
        f'BAE_CORS_ORIGINS: "{entry}" is not an origin ({reason}; e.g. https://app.example.com or '
        "http://localhost:5173, or * for any origin)"
    )


def test_trusted_proxies_are_addresses_and_networks() -> None:
    assert load_settings({}).trusted_proxies == ()
    settings = load_settings({"BAE_TRUSTED_PROXIES": " 10.0.0.5, 10.0.0.0/8 ,fd00::/8,,10.0.0.5"})
    assert [str(network) for network in settings.trusted_proxies] == ["10.0.0.5/32", "10.0.0.0/8", "fd00::/8"]


@pytest.mark.parametrize("entry, reason", [
    ("10.0.0.1/8", "10.0.0.1/8 has host bits set"),
    ("proxy.internal", "'proxy.internal' does not appear to be an IPv4 or IPv6 network"),
    ("10.0.0.5:8080", "'10.0.0.5:8080' does not appear to be an IPv4 or IPv6 network"),
])
def test_a_trusted_proxy_that_is_no_address_is_a_usage_error(entry: str, reason: str) -> None:
    with pytest.raises(UsageError) as raised:
        load_settings({"BAE_TRUSTED_PROXIES": f"127.0.0.1,{entry}"})
    assert str(raised.value) == (
        f'BAE_TRUSTED_PROXIES: "{entry}" is not an IP address or network ({reason}; e.g. 10.0.0.5, 10.0.0.0/8 '
        "or fd00::/8)"
    )


@pytest.mark.parametrize("env, key_file", [
    ({}, "/var/lib/bae/admin-key.pem"),
    ({"BAE_DB_PATH": "/srv/one/bae.db"}, "/srv/one/admin-key.pem"),
    ({"BAE_DATABASE_URL": "sqlite:////srv/two/x.db"}, "/srv/two/admin-key.pem"),
    ({"BAE_DATABASE_URL": "postgresql://bae@db:5432/bae", "BAE_DB_PATH": "/srv/one/bae.db"},
     "/var/lib/bae/admin-key.pem"),
    ({"BAE_DATABASE_URL": "sqlite:///:memory:"}, "/var/lib/bae/admin-key.pem"),
    ({"BAE_DB_PATH": "/srv/one/bae.db", "BAE_ADMIN_KEY_FILE": "/keys/k.pem"}, "/keys/k.pem"),
])
def test_the_admin_key_files_sit_beside_the_sqlite_store_unless_named(env: dict[str, str], key_file: str) -> None:
    settings = load_settings(env)
    assert settings.admin_key_file == key_file
    if "BAE_ADMIN_KEY_FILE" not in env:
        assert settings.admin_key_hash_file == key_file.replace("admin-key.pem", "admin-key-hash.pem")
