"""The client library stands alone: it imports nothing of BAE, and its JSON-RPC codes are the server's."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import bae_client
from bae.common.rpc_codes import LAGGED_MESSAGE as SERVER_LAGGED_MESSAGE
from bae.common.rpc_codes import RpcCode as ServerRpcCode
from bae_client import EventType, RpcCode, RpcError
from bae_client.errors import LAGGED_MESSAGE
from testkit import ROOT

pytestmark = pytest.mark.unit

CLIENT_PACKAGE = Path(bae_client.__file__).parent


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def test_the_client_imports_only_itself_httpx_and_the_standard_library() -> None:
    assert CLIENT_PACKAGE == ROOT / "clients" / "python" / "bae_client"
    top = {module.split(".")[0] for path in CLIENT_PACKAGE.glob("*.py") for module in imported_modules(path)}
    assert top - set(sys.stdlib_module_names) == {"bae_client", "httpx"}


def test_the_clients_rpc_codes_are_the_servers() -> None:
    assert {code.name: code.value for code in RpcCode} == {code.name: code.value for code in ServerRpcCode}
    assert LAGGED_MESSAGE == SERVER_LAGGED_MESSAGE


def test_one_exception_class_per_documented_code() -> None:
    documented = {int(code) for code in re.findall(r"^\| (-32\d{3}) \|", (ROOT / "docs/reference/rpc.md").read_text(),
                                                     re.MULTILINE)}
    assert documented == {code.value for code in RpcCode}
    classes = {code: type(RpcError.of(code, "x")) for code in documented}
    assert all(cls is not RpcError and cls.code == code for code, cls in classes.items())
    assert len(set(classes.values())) == len(classes)
    assert type(RpcError.of(-32000, LAGGED_MESSAGE)).__name__ == "LaggedError"
    assert type(RpcError.of(-31999, "a newer code")) is RpcError


def test_every_documented_event_type_is_an_event_type() -> None:
    text = (ROOT / "docs/reference/events.md").read_text()
    documented = set(re.findall(r"^\| `([a-z]+(?:\.[a-z_]+)+)` \|", text, re.MULTILINE))
    count = int(re.search(r"There are (\d+) types", text).group(1))  # type: ignore[union-attr]
    assert documented == {member.value for member in EventType} and len(documented) == count
    assert EventType("from.a.newer.server") == "from.a.newer.server"


def test_the_distribution_declares_httpx_alone_and_its_version() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "clients" / "python" / "pyproject.toml").read_text())["project"]
    assert (project["name"], project["version"]) == ("bae-client", bae_client.__version__)
    assert [re.split(r"[<>=!~ ]", dependency)[0] for dependency in project["dependencies"]] == ["httpx"]
    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"bae-client>={bae_client.__version__}" in server
