"""`bae`: the server's command line (console script and `python -m bae`).

    bae run [--demo] [session options]   the whole stack in the foreground, as `make run`
    bae gateway|session|runner|sandbox   one service (what each container image runs)
    bae migrate [--config PATH]          apply the store's migrations and exit
    bae version                          the version (also --version, -V)

Exit codes: 0 done, 1 runtime failure, 2 usage error.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable

from bae.common.entry import version_text

SERVICES = ("gateway", "session", "runner", "sandbox")

USAGE = """\
usage: bae <command> [options]

commands:
  run        start the whole stack in the foreground (as `make run`); `bae run --demo`
             adds the built-in demo provider (as `make demo`)
  gateway    serve the client and admin HTTP ports
  session    serve the session service (store, sessions, turns)
  runner     serve provider calls
  sandbox    serve sandboxes on this host's Docker daemon
  migrate    apply database migrations and exit
  version    print the version (also --version, -V)
  help       print this help (also --help, -h)

`bae <command> --help` describes each command's options.
"""

MIGRATE_USAGE = """\
usage: bae migrate [--config <path>]

Apply the store's database migrations (BAE_DB_PATH or BAE_DATABASE_URL) and exit;
`bae session serve` and `bae run` apply them too when they start.
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command in ("help", "--help", "-h"):
        print(USAGE, end="")
        return 0
    if command in ("version", "--version", "-V"):
        print(version_text())
        return 0
    if command == "run":
        from bae.launcher.stack import main as run_stack

        return run_stack(rest)
    if command == "migrate":
        if {"--help", "-h"} & set(rest):
            print(MIGRATE_USAGE, end="")
            return 0
        command, rest = "session", ["migrate", *rest]
    if command in SERVICES:
        # Imported on demand: each service loads only its own dependencies.
        service_main: Callable[[list[str]], int] = importlib.import_module(f"bae.services.{command}.__main__").main
        return service_main(rest)
    print(f"bae: unknown command {command!r}\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
