"""The client library stands alone: it imports nothing else of BAE, and its JSON-RPC codes are the server's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import bae.client
from bae.client import RpcCode
from bae.common.rpc_codes import RpcCode as ServerRpcCode

pytestmark = pytest.mark.unit

CLIENT_PACKAGE = Path(bae.client.__file__).parent


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def test_the_client_imports_only_itself_of_bae() -> None:
    outside = {
        f"{path.name}: {module}"
        for path in CLIENT_PACKAGE.glob("*.py")
        for module in imported_modules(path)
        if module.split(".")[0] == "bae" and not module.startswith("bae.client")
    }
    assert not outside


def test_the_clients_rpc_codes_are_the_servers() -> None:
    assert {code.name: code.value for code in RpcCode} == {code.name: code.value for code in ServerRpcCode}
