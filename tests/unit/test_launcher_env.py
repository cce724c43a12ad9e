"""`bae run`'s environment: relative paths against the caller's directory, local defaults, the listen addresses
it checks before starting anything."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from bae.common.settings import load_settings
from bae.launcher.stack import absolute_paths, port_problem, stack_env

pytestmark = pytest.mark.unit


def test_relative_path_settings_resolve_against_the_callers_directory(tmp_path: Path) -> None:
    env = absolute_paths({"BAE_DB_PATH": "state/bae.db", "BAE_CONFIG": "../cfg.toml", "BAE_INTERNAL_TOKEN_FILE": "t",
                          "BAE_ADMIN_KEY_FILE": "/abs/key.pem", "BAE_ADDR": "127.0.0.1:1", "OTHER_FILE": "x"},
                         tmp_path / "work")
    assert env == {"BAE_DB_PATH": str(tmp_path / "work" / "state" / "bae.db"), "BAE_CONFIG": str(tmp_path / "cfg.toml"),
                   "BAE_INTERNAL_TOKEN_FILE": str(tmp_path / "work" / "t"), "BAE_ADMIN_KEY_FILE": "/abs/key.pem",
                   "BAE_ADDR": "127.0.0.1:1", "OTHER_FILE": "x"}


def test_local_defaults_put_the_store_in_data_and_the_key_beside_the_store(tmp_path: Path) -> None:
    env = stack_env({}, tmp_path, demo=False)
    assert (env["BAE_DB_PATH"], env["BAE_ADMIN_KEY_FILE"], env["BAE_ADMIN_KEY_HASH_FILE"]) == (
        str(tmp_path / "data" / "bae.db"), str(tmp_path / "data" / "admin-key.pem"),
        str(tmp_path / "data" / "admin-key-hash.pem"))
    moved = stack_env({"BAE_DB_PATH": "s/two.db"}, tmp_path, demo=False)
    assert moved["BAE_ADMIN_KEY_FILE"] == str(tmp_path / "s" / "admin-key.pem")
    # PostgreSQL: the key stays in ./data.
    shared = stack_env({"BAE_DATABASE_URL": "postgresql://bae@127.0.0.1:5432/bae"}, tmp_path, demo=False)
    assert shared["BAE_ADMIN_KEY_FILE"] == str(tmp_path / "data" / "admin-key.pem")
    assert not (tmp_path / "data").exists()  # nothing written before the ports are checked


def free_addresses(count: int) -> list[str]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def settings_on(addresses: list[str], **extra: str):
    names = ("BAE_ADDR", "BAE_ADMIN_ADDR", "BAE_SESSION_GRPC_ADDR", "BAE_RUNNER_GRPC_ADDR", "BAE_SANDBOX_GRPC_ADDRS")
    return load_settings({**dict(zip(names, addresses)), **extra})


def test_port_problem_names_the_address_and_its_variable() -> None:
    addresses = free_addresses(5)
    assert port_problem(settings_on(addresses)) is None
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = "127.0.0.1:%d" % holder.getsockname()[1]
        assert port_problem(settings_on(addresses, BAE_DEMO_PROVIDER_ADDR=taken)) == (
            f"{taken} is already in use (BAE_DEMO_PROVIDER_ADDR); stop what listens there or set "
            "BAE_DEMO_PROVIDER_ADDR to a free address")
    assert port_problem(settings_on(addresses, BAE_RUNNER_GRPC_ADDR=addresses[0])) == (
        f"{addresses[0]} is set twice, by BAE_ADDR and BAE_RUNNER_GRPC_ADDR; give each its own port")
