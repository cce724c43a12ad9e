"""The command line every service entry point shares: `--help`, `--version`, exit codes.

`bae gateway|runner|sandbox` (and `python -m services.<name>`) parse their
arguments here before anything starts, so `--help` never starts a server.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, Callable, Coroutine

from bae import API_VERSIONS, __version__
from bae.errors import UsageError


def version_text() -> str:
    return f"bae {__version__} (api {', '.join(API_VERSIONS)})"


def service_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with `--version`/`-V`; callers add their own options."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("-V", "--version", action="version", version=version_text())
    return parser


def run_async(main: Callable[[], Coroutine[Any, Any, int | None]]) -> int:
    """Runs `main` to completion: its code (None is 0); a usage error prints one line and is 2."""
    try:
        return asyncio.run(main()) or 0
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
