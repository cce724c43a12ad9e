"""`make lint` fails on a broken import contract (pyproject.toml's [tool.importlinter]).

Each case copies the packages and pyproject.toml into a temporary directory, adds one import the
contracts forbid, and runs `lint-imports` there, as `make lint` does in the repository.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import ROOT

pytestmark = pytest.mark.stack

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("bae", "testkit", "bench")
CLIENT = Path("clients", "python", "bae_client")


def lint_copy(tmp_path: Path, violations: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """lint-imports over a copy of the tree where each file of `violations` gets that text appended."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    # The client library's own tree, beside the others (lint-imports finds the packages in its working directory).
    shutil.copytree(ROOT / CLIENT, tmp_path / CLIENT.name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for relative, text in violations.items():
        path = tmp_path / relative
        path.write_text(path.read_text() + text if path.exists() else text)
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-logo", "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def test_the_unchanged_copy_keeps_every_contract(tmp_path: Path) -> None:
    linted = lint_copy(tmp_path, {})
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "BROKEN" not in linted.stdout


@pytest.mark.parametrize(
    ("violations", "contract"),
    [
        (
            {"bae/services/gateway/app.py": "\nimport bae.services.session.store  # noqa\n"},
            "The gateway reaches the other services over gRPC only BROKEN",
        ),
        (
            {"bae/services/runner/canonical.py": "\nimport bae.services.sandbox.output  # noqa\n"},
            "The services do not import each other BROKEN",
        ),
        (
            {"bae/common/ids.py": "\nimport bae.services.gateway.problems  # noqa\n"},
            "The shared code, baectl and the launcher import no service BROKEN",
        ),
        (
            {"bae_client/errors.py": "\nimport bae.common.error_codes  # noqa\n"},
            "bae_client imports nothing of bae BROKEN",
        ),
        (
            {"bae/services/session/store/records.py": "\nimport bae.services.session.engine.domain  # noqa\n"},
            "Session service layers: __main__ -> wiring -> api -> remote -> engine -> store BROKEN",
        ),
        (
            {"bae/services/session/engine/domain.py": "\nimport bae.services.session.remote.peers  # noqa\n"},
            "Session service layers: __main__ -> wiring -> api -> remote -> engine -> store BROKEN",
        ),
        (
            {"bae/services/gateway/problems.py": "\nimport testkit.ports  # noqa\n"},
            "Top-level layers: bench -> testkit -> bae BROKEN",
        ),
        (
            # A cycle through an annotation-only import is still a cycle.
            {
                "bae/common/cycle_a.py": "import bae.common.cycle_b  # noqa\n",
                "bae/common/cycle_b.py": (
                    "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import bae.common.cycle_a  # noqa\n"
                ),
            },
            "No import cycles BROKEN",
        ),
    ],
    ids=["gateway-imports-session", "services-import-each-other", "bae-imports-a-service",
         "client-imports-bae-common", "store-imports-engine", "engine-imports-remote",
         "service-imports-testkit", "cycle"],
)
def test_a_forbidden_import_fails_the_lint(tmp_path: Path, violations: dict[str, str], contract: str) -> None:
    linted = lint_copy(tmp_path, violations)
    assert linted.returncode != 0
    assert contract in linted.stdout, linted.stdout + linted.stderr
