"""`bae run --demo` adds the demo provider to the user's BAE_CONFIG (bae/launcher/stack.py, demo_env)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from bae.common.config import load_config
from bae.common.errors import UsageError
from bae.launcher.stack import demo_env

pytestmark = pytest.mark.unit

USER_CONFIG = """\
[[mcp.servers]]
name = "tools"
transport = "stdio"
command = "python"
args = ["tools_server.py"]

[[providers.entries]]
name = "sonnet"
provider = "anthropic"
model = "claude-sonnet-4-6"
auth_token = "${ANTHROPIC_API_KEY}"

[limits]
session_tokens = 5000
"""


def run_demo_env(tmp_path: Path, config: str | None) -> tuple[dict[str, str], Path]:
    env = {"BAE_DB_PATH": str(tmp_path / "store" / "bae.db"), "BAE_DEMO_PROVIDER_ADDR": "127.0.0.1:18089"}
    (tmp_path / "store").mkdir()
    if config is not None:
        (tmp_path / "bae-config.toml").write_text(config)
        env["BAE_CONFIG"] = str(tmp_path / "bae-config.toml")
    result = demo_env(env, tmp_path / "unused")
    return result, Path(result["BAE_CONFIG"])


def test_without_bae_config_the_demo_provider_is_alone(tmp_path: Path) -> None:
    env, path = run_demo_env(tmp_path, None)
    assert path == tmp_path / "store" / "demo-config.toml"
    assert env["BAE_DEMO_PROVIDER_ADDR"] == "127.0.0.1:18089"
    config = load_config(str(path), {})
    assert [(p.name, p.model, p.base_url) for p in config.providers] == [
        ("demo", "bae-demo-echo", "http://127.0.0.1:18089")]
    assert config.mcp_servers == ()


def test_the_demo_provider_is_added_to_the_users_config(tmp_path: Path) -> None:
    env, path = run_demo_env(tmp_path, USER_CONFIG)
    assert path == tmp_path / "store" / "demo-config.toml" and path.read_text().count("[[providers.entries]]") == 2
    config = load_config(str(path), {})
    assert [p.name for p in config.providers] == ["sonnet", "demo"]
    assert [(s.name, s.command, s.args) for s in config.mcp_servers] == [("tools", "python", ("tools_server.py",))]
    assert config.limits.session_tokens == 5000
    # The copy may hold literal secrets: its owner's alone, also when it was there before, more open.
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    run_demo_env_again = demo_env({**env, "BAE_CONFIG": str(tmp_path / "bae-config.toml")}, tmp_path)
    assert run_demo_env_again["BAE_CONFIG"] == str(path) and stat.S_IMODE(path.stat().st_mode) == 0o600
    # The user's file itself is left as it was.
    assert (tmp_path / "bae-config.toml").read_text() == USER_CONFIG


def test_a_user_config_without_providers_or_a_final_line_break(tmp_path: Path) -> None:
    _, path = run_demo_env(tmp_path, '[telemetry]\nenabled = false\nservice_name = "demo-try"')
    config = load_config(str(path), {})
    assert [p.name for p in config.providers] == ["demo"] and config.telemetry.service_name == "demo-try"


@pytest.mark.parametrize("config,message", [
    ('[[providers.entries]]\nname = "demo"\nprovider = "openai"\nmodel = "m"\nauth_token = "t"\n',
     'has a provider named "demo", the name --demo gives its own: rename that entry'),
    ('providers = { entries = [] }\n', "write that file's providers as [[providers.entries]] tables too"),
    ("[limits\n", 'invalid config file "'),
])
def test_a_config_the_demo_provider_cannot_join_is_refused(tmp_path: Path, config: str, message: str) -> None:
    with pytest.raises(UsageError) as refused:
        run_demo_env(tmp_path, config)
    assert message in str(refused.value)
    assert not (tmp_path / "store" / "demo-config.toml").exists()


def test_a_missing_bae_config_is_an_error_not_an_empty_config(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as refused:
        demo_env({"BAE_DB_PATH": str(tmp_path / "bae.db"), "BAE_CONFIG": str(tmp_path / "nope.toml")}, tmp_path)
    assert str(refused.value) == f"cannot read BAE_CONFIG={tmp_path / 'nope.toml'}: No such file or directory"
