"""Secret settings given as files: `NAME_FILE` names a file that holds `NAME`'s value.

Orchestrators hand secrets to containers as files (Docker secrets under /run/secrets,
Kubernetes Secret volumes), which keeps them out of the environment, where
`docker inspect` and /proc/<pid>/environ show them to anyone who can look. Each
secret setting therefore has a `_FILE` variant:

- `BAE_INTERNAL_TOKEN_FILE`, `BAE_DATABASE_URL_FILE`;
- `BAE_DATABASE_PASSWORD_FILE`: the password alone, put into `BAE_DATABASE_URL`,
  which then carries none (so the URL can sit in plain configuration);
- any variable a `${NAME}` of bae-config.toml names (provider tokens, MCP server
  environments, telemetry headers): `NAME_FILE` when `NAME` is not set.

A file's trailing line break is dropped (`echo secret > file` writes one). Setting
both `NAME` and `NAME_FILE` is a mistake an operator must hear about, not a
precedence rule to remember.
"""

from __future__ import annotations

from typing import Mapping

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from bae.common.errors import UsageError

FILE_SUFFIX = "_FILE"
DATABASE_PASSWORD_FILE = "BAE_DATABASE_PASSWORD_FILE"
# A secret is a token, a password or a URL: anything larger is the wrong file.
MAX_SECRET_FILE_BYTES = 64 * 1024


class SecretFileError(ValueError):
    """A `_FILE` variable whose file cannot be used; the message names the variable and the reason."""


def read_secret_file(var: str, path: str) -> str:
    """The secret in the file `var` names, without its trailing line break."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise SecretFileError(f'{var}: cannot read "{path}": {exc.strerror or exc}') from None
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise SecretFileError(f'{var}: "{path}" is over {MAX_SECRET_FILE_BYTES} bytes; is it the right file?')
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretFileError(f'{var}: "{path}" is not UTF-8 text') from None
    value = text.removesuffix("\n").removesuffix("\r")
    if not value:
        raise SecretFileError(f'{var}: "{path}" is empty')
    return value


def file_variant(env: Mapping[str, str], name: str) -> str | None:
    """`name`'s value from the file `name_FILE` points to; None when that variable is unset or empty."""
    path = env.get(name + FILE_SUFFIX, "").strip()
    return read_secret_file(name + FILE_SUFFIX, path) if path else None


def secret_setting(env: Mapping[str, str], name: str) -> str | None:
    """A secret setting from `name` or `name_FILE` (one of them; both is an error)."""
    try:
        from_file = file_variant(env, name)
    except SecretFileError as exc:
        raise UsageError(str(exc)) from None
    if from_file is None:
        return env.get(name)
    if env.get(name, "").strip():
        raise UsageError(f"{name} and {name}{FILE_SUFFIX} are both set; set one of them")
    return from_file


def database_url(env: Mapping[str, str]) -> str | None:
    """BAE_DATABASE_URL (or its file), with the password of BAE_DATABASE_PASSWORD_FILE put in when given."""
    url = secret_setting(env, "BAE_DATABASE_URL") or None
    path = env.get(DATABASE_PASSWORD_FILE, "").strip()
    if not path:
        return url
    if url is None:
        raise UsageError(f"{DATABASE_PASSWORD_FILE}: set BAE_DATABASE_URL too (the URL without its password)")
    try:
        parsed = make_url(url)
    except ArgumentError:
        # The URL itself is not repeated: it may hold a secret.
        raise UsageError("BAE_DATABASE_URL: not a database URL (e.g. postgresql://bae@db:5432/bae)") from None
    if parsed.password is not None:
        raise UsageError(f"BAE_DATABASE_URL has a password and {DATABASE_PASSWORD_FILE} is set; set one of them")
    try:
        password = read_secret_file(DATABASE_PASSWORD_FILE, path)
    except SecretFileError as exc:
        raise UsageError(str(exc)) from None
    return parsed.set(password=password).render_as_string(hide_password=False)
