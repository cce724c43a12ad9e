"""The resident shell's command line: what `printf %b` in a real shell turns back into the command."""

from __future__ import annotations

import subprocess

import pytest

from bae.services.sandbox.resident_shell import encode

# The system's sh, a child process: not a unit test, though no service runs.
pytestmark = pytest.mark.stack

COMMANDS = [
    "echo hi",
    "printf '%s\\n' \"$HOME\" | tr a-z A-Z",
    "a\\b\\\\c \\0101 \\c not cut",
    "line one\nline two\r\n\ttabbed  trailing spaces  ",
    "é ✓ 日本 \x7f \x01",
    "",
]


@pytest.mark.parametrize("command", COMMANDS)
def test_the_shell_gets_the_command_back_byte_for_byte(command: str) -> None:
    line = encode(command)
    assert line is not None and b"\n" not in line
    # The shell's own decoding step, in the system's sh.
    decoded = subprocess.run(
        ["sh", "-c", 'command=$(printf "%bx" "$1"); printf %s "${command%x}"', "sh", line.decode()],
        capture_output=True, check=True,
    ).stdout
    assert decoded == command.encode()
