"""The resident shell's command line: which commands fit on one (test_resident_shell_decoding.py runs them)."""

from __future__ import annotations

import pytest

from bae.services.sandbox.resident_shell import MAX_LINE, encode

pytestmark = pytest.mark.unit


def test_what_a_resident_shell_cannot_take() -> None:
    assert encode("echo \0") is None  # no shell variable (nor exec argv) holds a NUL
    assert encode("x" * MAX_LINE) is not None
    assert encode("x" * (MAX_LINE + 1)) is None
    assert encode("é" * (MAX_LINE // 8)) is None  # each non-ASCII byte takes five
