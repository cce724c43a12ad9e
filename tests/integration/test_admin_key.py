"""Admin key bootstrap, rotation and the pre-provisioned hash file (SERVER-SPEC §3, §17 O-1)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys

import pytest
from argon2 import PasswordHasher

from bae.common.ids import new_token, token_digest
from bae.launcher.stack import ROOT
from testkit.session_service import Service, problem_of
from testkit.stack import stack_env

pytestmark = pytest.mark.stack


def run_session(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bae.services.session", *args],
        cwd=ROOT, env=stack_env(tmp_path, **env), capture_output=True, text=True, timeout=30,
    )


async def test_self_generated_key_file_and_restart(tmp_path):
    key_file = tmp_path / "keys" / "admin-key.pem"  # directory created on demand
    svc = Service(tmp_path, BAE_ADMIN_KEY_FILE=str(key_file))
    text = key_file.read_text()
    assert text.endswith("\n") and text.startswith("bae_admin_") and len(text.strip()) == 58
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    svc.admin_key = text.strip()
    profile = await svc.admin("CreateProfile", body={"name": "p", "primary_provider": "mock"})
    await svc.stop()
    # Restart: the active row exists, the file is left alone, data survives.
    svc = Service(tmp_path, BAE_ADMIN_KEY_FILE=str(key_file))
    try:
        assert key_file.read_text() == text
        svc.admin_key = text.strip()
        assert (await svc.admin("GetProfile", path_id=profile["id"]))["name"] == "p"
    finally:
        await svc.stop()


async def test_rotation(tmp_path):
    svc = Service(tmp_path)
    old = svc.admin_key
    await svc.stop()
    key_file = tmp_path / "admin-key.pem"
    os.chmod(key_file, 0o644)
    svc = Service(tmp_path, ["--rotate-admin-key"])
    try:
        assert svc.admin_key != old and stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
        assert (await svc.admin("ListProfiles"))["items"] == []
        problem = await problem_of(svc.call("ListProfiles", key=old))
        assert (problem.status, problem.detail) == (401, "invalid admin key")
    finally:
        await svc.stop()


@pytest.mark.parametrize("kind", ["sha256", "argon2id"])
async def test_hash_file_ingest(tmp_path, kind):
    token = new_token("bae_admin_")
    key_hash = token_digest(token) if kind == "sha256" else PasswordHasher().hash(token)
    (tmp_path / "admin-key-hash.pem").write_text(
        json.dumps({"key_hash": key_hash, "prefix": token[:14], "name": "shared-admin"}))
    svc = Service(tmp_path)
    try:
        assert not (tmp_path / "admin-key.pem").exists()
        svc.admin_key = token
        assert (await svc.admin("ListProfiles"))["items"] == []
        assert (await svc.admin("ListKeys"))["items"] == []  # admin rows are not client keys
        assert (await problem_of(svc.call("ListProfiles", key=token + "0"))).detail == "invalid admin key"
    finally:
        await svc.stop()


@pytest.mark.parametrize(
    "content, detail",
    [
        ("{", "Expecting property name enclosed in double quotes at line 1 column 2"),
        ('{"key_hash": "", "prefix": "bae_admin_1"}', "key_hash and prefix must be non-empty"),
        ('{"key_hash": "abc", "prefix": "bae_admin_1"}',
         "key_hash is not a valid Argon2id PHC string or SHA-256 hex digest"),
    ],
)
def test_malformed_hash_file_exits_2(tmp_path, content, detail):
    hash_file = tmp_path / "admin-key-hash.pem"
    hash_file.write_text(content)
    result = run_session(tmp_path, "serve")
    assert result.returncode == 2
    assert f"admin key hash file {hash_file} is malformed: {detail}" in result.stderr


def test_usage_errors_exit_2(tmp_path):
    assert run_session(tmp_path, "--rotate-admin-key", "--dangerously-disable-admin-auth").returncode == 2
    assert run_session(tmp_path, "serve", "--rotate-admin-key",
                       BAE_DANGEROUSLY_DISABLE_ADMIN_AUTH=" TRUE ").returncode == 2
    assert run_session(tmp_path, "frobnicate").returncode == 2
    assert run_session(tmp_path, "--config").returncode == 2
    assert run_session(tmp_path, "--config=").returncode == 2
    assert not (tmp_path / "bae.db").exists()  # nothing touched


def test_version_help_migrate(tmp_path):
    version = run_session(tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.startswith("bae 0.1.0")
    assert run_session(tmp_path, "help").returncode == 0
    migrated = run_session(tmp_path, "--config=/nonexistent.toml", "migrate",
                           BAE_DB_PATH=str(tmp_path / "sub" / "bae.db"))
    assert migrated.returncode == 0, migrated.stderr
    assert (tmp_path / "sub" / "bae.db").exists()


def test_key_file_is_never_written_through_a_symlink(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("untouched\n")
    key_file = tmp_path / "admin-key.pem"
    key_file.symlink_to(target)
    result = run_session(tmp_path, "serve", BAE_ADMIN_KEY_FILE=str(key_file))
    assert result.returncode == 1, result.stderr
    assert f"admin key file {key_file} is a symbolic link; refusing to write through it" in result.stderr
    assert target.read_text() == "untouched\n" and key_file.is_symlink()


def provisioned_argon2_admin(tmp_path, hasher: PasswordHasher) -> str:
    token = new_token("bae_admin_")
    (tmp_path / "admin-key-hash.pem").write_text(
        json.dumps({"key_hash": hasher.hash(token), "prefix": token[:14]}))
    return token


async def test_argon2_checks_are_throttled_after_failures(tmp_path):
    token = provisioned_argon2_admin(tmp_path, PasswordHasher())
    svc = Service(tmp_path)
    try:
        svc.admin_key = token
        assert (await svc.admin("ListProfiles"))["items"] == []  # verified once: remembered
        wrong = new_token("bae_admin_")
        for _ in range(3):
            assert (await problem_of(svc.call("ListProfiles", key=wrong))).status == 401
        throttled = await problem_of(svc.call("ListProfiles", key=wrong))
        assert (throttled.status, throttled.type, throttled.retry_after) == (429, "too_many_requests", 1)
        assert throttled.detail == "too many failed admin key attempts; retry later"
        assert (await svc.admin("ListProfiles"))["items"] == []  # the verified key is not throttled
        await asyncio.sleep(throttled.retry_after)
        assert (await problem_of(svc.call("ListProfiles", key=wrong))).status == 401
        assert (await problem_of(svc.call("ListProfiles", key=wrong))).retry_after == 2  # the delay doubles
    finally:
        await svc.stop()


async def test_argon2_checks_do_not_hold_up_the_store(tmp_path):
    # Deliberately slow parameters: one check takes about a second.
    token = provisioned_argon2_admin(tmp_path, PasswordHasher(time_cost=40))
    svc = Service(tmp_path)
    try:
        svc.admin_key = token
        await svc.admin("ListProfiles")  # verified once: remembered, so this key needs no Argon2 again
        guess = asyncio.create_task(problem_of(svc.call("ListProfiles", key=new_token("bae_admin_"))))
        await asyncio.sleep(0.2)  # the guess is being checked now
        assert (await svc.admin("ListProfiles"))["items"] == []
        assert not guess.done()
        assert (await guess).status == 401
    finally:
        await svc.stop()


async def test_a_key_file_is_never_replaced_and_must_be_the_stores(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    svc = Service(one)
    await svc.stop()
    key_file = one / "admin-key.pem"
    kept = key_file.read_bytes(), key_file.stat().st_mtime_ns
    # A new store and an existing key file: the file is another store's.
    fresh = run_session(two, "serve", BAE_ADMIN_KEY_FILE=str(key_file))
    assert fresh.returncode == 1, fresh.stderr
    assert fresh.stderr.splitlines()[-1] == (
        f"error: admin key file {key_file} exists but the store sqlite:///{two}/bae.db has no admin key yet, so the "
        "file belongs to another store; set BAE_ADMIN_KEY_FILE to a new path for this store's key (or move the file "
        "aside)")
    # That store, once it has a key of its own, and the first store's file: no key of it.
    await Service(two).stop()
    mismatch = run_session(two, "serve", BAE_ADMIN_KEY_FILE=str(key_file))
    assert mismatch.returncode == 1, mismatch.stderr
    assert mismatch.stderr.splitlines()[-1] == (
        f"error: admin key file {key_file} holds no admin key of the store sqlite:///{two}/bae.db: set "
        "BAE_ADMIN_KEY_FILE to this store's key file, or move the file aside and start once with "
        "--rotate-admin-key to write a new key")
    assert (key_file.read_bytes(), key_file.stat().st_mtime_ns) == kept
