"""Admin key bootstrap at every `serve` start (SERVER-SPEC §3, §17 O-1).

Runs after the database opens and before the listener binds. Usage errors
(a malformed hash file) raise UsageError (exit 2); database and file-system
failures raise AdminKeyError (exit 1).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from argon2 import PasswordHasher, extract_parameters
from argon2.exceptions import InvalidHashError, VerificationError
from bae.common.errors import BaeError, UsageError
from bae.common.ids import digests_equal, token_digest
from bae.services.session.store import keys
from bae.services.session.store.store import Store

log = logging.getLogger("bae.session.admin_key")

PROVISIONED_NAME = "provisioned-admin"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class AdminKeyError(BaeError):
    """The admin key could not be set up (file system); the process exits 1."""


@dataclass(frozen=True)
class AdminKeyOptions:
    key_file: Path
    hash_file: Path
    rotate: bool
    disabled: bool
    # How errors name the store (its URL without a password).
    store_name: str = "this store"


@dataclass(frozen=True)
class ProvisionedHash:
    key_hash: str
    prefix: str
    name: str


def is_valid_key_hash(key_hash: str) -> bool:
    """A SHA-256 lowercase hex digest or an Argon2id PHC string."""
    if _SHA256_HEX.fullmatch(key_hash):
        return True
    if not key_hash.startswith(keys.PHC_PREFIX):
        return False
    try:
        extract_parameters(key_hash)
    except (InvalidHashError, ValueError):
        return False
    return True


def read_hash_file(path: Path) -> ProvisionedHash:
    def malformed(detail: str) -> UsageError:
        return UsageError(f"admin key hash file {path} is malformed: {detail}")

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise malformed(f"cannot read file: {exc}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise malformed(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(document, dict):
        raise malformed("expected a JSON object")
    for field in ("key_hash", "prefix"):
        if field not in document:
            raise malformed(f"missing field `{field}`")
    key_hash, prefix, name = document["key_hash"], document["prefix"], document.get("name")
    if not isinstance(key_hash, str) or not isinstance(prefix, str):
        raise malformed("key_hash and prefix must be strings")
    if name is not None and not isinstance(name, str):
        raise malformed("name must be a string")
    key_hash, prefix = key_hash.strip(), prefix.strip()
    if not key_hash or not prefix:
        raise malformed("key_hash and prefix must be non-empty")
    if not is_valid_key_hash(key_hash):
        raise malformed("key_hash is not a valid Argon2id PHC string or SHA-256 hex digest")
    return ProvisionedHash(key_hash, prefix, (name or "").strip() or PROVISIONED_NAME)


def write_key_file(path: Path, token: str) -> None:
    """Write the plaintext + newline, mode 0600 even when the file already existed.

    Never through a symbolic link (O_NOFOLLOW): whoever can plant one in the
    key's directory must not be able to redirect the plaintext elsewhere.
    """
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(token + "\n")
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AdminKeyError(f"admin key file {path} is a symbolic link; refusing to write through it") from None
        raise AdminKeyError(f"cannot write admin key file {path}: {exc}") from None


def _remove_key_file(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise AdminKeyError(f"cannot delete admin key file {path}: {exc}") from None


# An admin key file holds one token and a line break; anything much larger is the wrong file.
MAX_KEY_FILE_BYTES = 4096


def read_key_file(path: Path) -> str | None:
    """The token an existing key file holds; None when there is no file, or a symbolic link there: a link is
    never followed, and writing a key through it is refused (write_key_file) should one be needed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise AdminKeyError(f"cannot read admin key file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise AdminKeyError(f"admin key file {path} is over {MAX_KEY_FILE_BYTES} bytes; is it the right file?")
    return data.decode("utf-8", errors="replace").strip()


def token_matches(token: str, key_hash: str) -> bool:
    """Whether `token` is the key of `key_hash` (a SHA-256 hex digest or an Argon2id PHC string)."""
    if not key_hash.startswith(keys.PHC_PREFIX):
        return digests_equal(key_hash, token_digest(token))
    try:
        return PasswordHasher().verify(key_hash, token)
    except (VerificationError, InvalidHashError):
        return False


def key_file_holds(path: Path) -> Callable[[list[str]], bool | None]:
    def holds(hashes: list[str]) -> bool | None:
        token = read_key_file(path)
        if token is None:
            return None
        return any(token_matches(token, key_hash) for key_hash in hashes)

    return holds


def _provisioned(path: Path) -> tuple[str, str, str] | None:
    if not path.exists():
        return None
    provisioned = read_hash_file(path)
    return provisioned.name, provisioned.key_hash, provisioned.prefix


async def bootstrap_admin_key(store: Store, options: AdminKeyOptions) -> None:
    if options.disabled:
        log.warning(
            "admin auth is DISABLED: anyone who can reach the admin port has full control"
        )
        return
    done = await store.write(
        keys.bootstrap_admin,
        options.rotate,
        lambda: _remove_key_file(options.key_file),
        lambda token: write_key_file(options.key_file, token),
        lambda: _provisioned(options.hash_file),
        key_file_holds(options.key_file),
    )
    where = options.store_name
    if done == "mismatch":
        raise AdminKeyError(
            f"admin key file {options.key_file} holds no admin key of {where}: set BAE_ADMIN_KEY_FILE to this "
            "store's key file, or move the file aside and start once with --rotate-admin-key to write a new key"
        )
    if done == "foreign":
        raise AdminKeyError(
            f"admin key file {options.key_file} exists but {where} has no admin key yet, so the file belongs to "
            "another store; set BAE_ADMIN_KEY_FILE to a new path for this store's key (or move the file aside)"
        )
    if done == "rotated":
        log.info("admin key rotated; new key written to %s", options.key_file)
    elif done == "provisioned":
        log.info("admin key hash loaded from pre-provisioned file %s", options.hash_file)
    elif done == "generated":
        log.info("no admin key found; generated new admin key, written to file %s", options.key_file)
