"""Remote sandbox tools (a container the server runs for the session, from an image in the profile's
`available_sandboxes`).

Two ways to give the model a shell in it:
- Auto: `open(sandbox_tools=[auto_shell_tool()])`: the server runs each call itself, inside the turn;
  the client never sees it (no handler, not in allowed_tools).
- Manual: a client tool whose handler runs the command with `session.exec_remote_sandbox` (e.g. to check or
  log each command first): `open(tools=[shell])`, then `session.tools["run_shell_command"] =
  session.remote_shell_tool()`, which needs the session's sandbox to be started
  (`session.start_remote_sandbox(image)`).
Either way the sandbox is started by `start_remote_sandbox` and stopped by `stop_remote_sandbox` (or by
closing the session).
"""

from __future__ import annotations

import json
from typing import Any

SHELL_NAME = "run_shell_command"
SHELL_DESCRIPTION = "Run a shell command in the session's sandbox; the result holds stdout, stderr and exit_code."
SHELL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "The shell command line."}},
    "required": ["command"],
}


def auto_shell_tool(name: str = SHELL_NAME, description: str = SHELL_DESCRIPTION) -> dict[str, Any]:
    """The declaration of an Auto-mode shell tool, for `open(sandbox_tools=[...])`."""
    return {"name": name, "description": description, "input_schema": SHELL_SCHEMA}


def command_of(input: dict[str, Any]) -> str:
    command = input.get("command")
    if not isinstance(command, str) or not command:
        raise ValueError("the tool needs a non-empty string `command`")
    return command


def shell_result(result: Any) -> str:
    """A command's `{"stdout", "stderr", "exit_code"}` as the tool's result text."""
    result = result if isinstance(result, dict) else {}
    return json.dumps({key: result.get(key) for key in ("stdout", "stderr", "exit_code")})
