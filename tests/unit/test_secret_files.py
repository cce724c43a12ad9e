"""Secret settings given as files (`NAME_FILE`), as Docker secrets and Kubernetes Secret volumes hand them over."""

from __future__ import annotations

from pathlib import Path

import pytest

from bae.common.config import EnvResolutionError, resolve_env
from bae.common.errors import UsageError
from bae.common.secret_files import MAX_SECRET_FILE_BYTES
from bae.common.settings import load_settings

pytestmark = pytest.mark.unit

TOKEN = "t" * 40


def secret(tmp_path: Path, text: str, name: str = "secret") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_internal_token_is_read_from_its_file_without_the_line_break(tmp_path: Path) -> None:
    settings = load_settings({"BAE_INTERNAL_TOKEN_FILE": secret(tmp_path, TOKEN + "\n")})
    assert settings.internal_token == TOKEN


def test_the_database_url_is_read_from_its_file(tmp_path: Path) -> None:
    url = "postgresql://bae:s3cret@db:5432/bae"
    settings = load_settings({"BAE_DATABASE_URL_FILE": secret(tmp_path, url + "\r\n")})
    assert settings.database_url == url
    assert "s3cret" not in settings.printable_database_url


def test_a_password_file_completes_a_url_without_one(tmp_path: Path) -> None:
    env = {"BAE_DATABASE_URL": "postgresql://bae@db:5432/bae",
           "BAE_DATABASE_PASSWORD_FILE": secret(tmp_path, "p@ss/word:1\n")}
    settings = load_settings(env)
    assert settings.database_url == "postgresql://bae:p%40ss%2Fword%3A1@db:5432/bae"


@pytest.mark.parametrize("env, message", [
    ({"BAE_INTERNAL_TOKEN": TOKEN, "BAE_INTERNAL_TOKEN_FILE": "{file}"},
     "BAE_INTERNAL_TOKEN and BAE_INTERNAL_TOKEN_FILE are both set; set one of them"),
    ({"BAE_INTERNAL_TOKEN_FILE": "{missing}"}, 'BAE_INTERNAL_TOKEN_FILE: cannot read "{missing}": No such file'),
    ({"BAE_DATABASE_PASSWORD_FILE": "{file}"}, "BAE_DATABASE_PASSWORD_FILE: set BAE_DATABASE_URL too"),
    ({"BAE_DATABASE_URL": "postgresql://bae:inline@db/bae", "BAE_DATABASE_PASSWORD_FILE": "{file}"},
     "BAE_DATABASE_URL has a password and BAE_DATABASE_PASSWORD_FILE is set"),
    ({"BAE_DATABASE_URL": "not a url", "BAE_DATABASE_PASSWORD_FILE": "{file}"}, "BAE_DATABASE_URL: not a database URL"),
])
def test_misuse_is_a_usage_error_that_names_the_variable(tmp_path: Path, env: dict[str, str], message: str) -> None:
    paths = {"file": secret(tmp_path, TOKEN), "missing": str(tmp_path / "missing")}
    with pytest.raises(UsageError) as raised:
        load_settings({name: value.format(**paths) for name, value in env.items()})
    assert str(raised.value).startswith(message.format(**paths))
    # The secret itself is never part of the message.
    assert TOKEN not in str(raised.value) and "inline" not in str(raised.value)


@pytest.mark.parametrize("content, reason", [
    ("", "is empty"),
    ("\n", "is empty"),
    ("x" * (MAX_SECRET_FILE_BYTES + 1), f"is over {MAX_SECRET_FILE_BYTES} bytes"),
])
def test_a_file_that_cannot_be_a_secret_is_refused(tmp_path: Path, content: str, reason: str) -> None:
    with pytest.raises(UsageError, match=reason):
        load_settings({"BAE_INTERNAL_TOKEN_FILE": secret(tmp_path, content)})


def test_a_config_reference_falls_back_to_its_file(tmp_path: Path) -> None:
    env = {"ANTHROPIC_API_KEY_FILE": secret(tmp_path, "sk-from-file\n")}
    assert resolve_env("Bearer ${ANTHROPIC_API_KEY}", env=env) == "Bearer sk-from-file"
    # The variable itself, when set, is what the reference means.
    assert resolve_env("${ANTHROPIC_API_KEY}", env={**env, "ANTHROPIC_API_KEY": "sk-env"}) == "sk-env"
    with pytest.raises(EnvResolutionError, match="environment variable OPENAI_API_KEY referenced by provider config"):
        resolve_env("${OPENAI_API_KEY}", env=env)
    with pytest.raises(EnvResolutionError, match=r'OPENAI_API_KEY_FILE: cannot read ".*": .*\(referenced by'):
        resolve_env("${OPENAI_API_KEY}", env={"OPENAI_API_KEY_FILE": str(tmp_path / "gone")})
