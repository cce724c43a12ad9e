"""The reference in docs/ keeps up with the code: every route, method, event type and setting is described."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from bae.services.gateway import app
from bae.services.gateway.declaration import RPC_METHODS
from testkit.routes import served_routes

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs"
SOURCES = [*ROOT.joinpath("bae").rglob("*.py")]


def source_text() -> str:
    return "\n".join(path.read_text() for path in SOURCES)


@pytest.mark.parametrize("factory", [app.client_app, app.admin_app])
def test_every_route_is_in_the_rest_reference(factory: Any) -> None:
    text = (DOCS / "reference" / "rest.md").read_text()
    assert {f"{method} {path}" for path, method in served_routes(factory) if f"{method} {path}" not in text} == set()


def test_every_rpc_method_has_a_section() -> None:
    text = (DOCS / "reference" / "rpc.md").read_text()
    assert {name for name in RPC_METHODS if f"### `{name}`" not in text} == set()


def test_every_event_type_is_in_the_event_reference() -> None:
    text = (DOCS / "reference" / "events.md").read_text()
    literals = set(re.findall(r'"((?:client|server|provider|tool|mcp|sandbox|session)\.[a-z_]+(?:\.[a-z_]+)?)"',
                              source_text()))
    event_types = literals - set(RPC_METHODS) - {"session.event", "session.delta", "mcp.servers"}
    assert "tool.result" in event_types and "session.compaction.completed" in event_types
    assert {name for name in event_types if f"`{name}`" not in text} == set()


def test_every_setting_is_documented() -> None:
    text = "\n".join(path.read_text() for path in DOCS.rglob("*.md"))
    settings = set(re.findall(r'get\(\s*"(BAE_[A-Z0-9_]+)"', source_text()))
    assert "BAE_DEMO_PROVIDER_ADDR" in settings
    assert {name for name in settings if f"`{name}`" not in text} == set()


# The documentation stands alone: it cites no document that is not in the repository, and names
# this server, never the upstream one it was modelled on.
STAND_ALONE = [*DOCS.rglob("*.md"), ROOT / "README.md"]
NOT_HERE = re.compile(r"SERVER-SPEC|TELEMETRY\.md|TELEMETRY §|BAECTL\.md|\bbaesrv\b|docker exec bae\b|§\s*\d")
# The one place the name stays: the telemetry instrumentation scope, a wire literal collectors select by.
WIRE_LITERAL = "Instrumentation scope: `baesrv`"


def test_no_doc_cites_a_document_outside_the_repository_or_says_baesrv() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in STAND_ALONE
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if NOT_HERE.search(line.replace(WIRE_LITERAL, ""))
    ]
    assert found == []


def test_the_check_catches_a_citation() -> None:
    for line in ("as SERVER-SPEC says", "see §7.2", "is baesrv running", "docker exec bae baectl", "TELEMETRY §4"):
        assert NOT_HERE.search(line), line
    assert not NOT_HERE.search("docker exec <container> baectl list keys")
