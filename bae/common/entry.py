"""The command line every service entry point shares: `--help`, `--version`, exit codes.

`bae gateway|runner|sandbox` (and `python -m bae.services.<name>`) parse their
arguments here before anything starts, so `--help` never starts a server.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from typing import Any, Callable, Coroutine

from bae import API_VERSIONS, __version__
from bae.common.errors import UsageError


def version_text() -> str:
    return f"bae {__version__} (api {', '.join(API_VERSIONS)})"


def service_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with `--version`/`-V`; callers add their own options."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("-V", "--version", action="version", version=version_text())
    return parser


def freeze_startup_heap() -> None:
    """Take what start-up allocated (modules, provider SDKs, config) out of the collector's sight.

    It lives as long as the process, yet every full collection walked it again: a pass over the
    provider SDKs' objects stalled every request of the process for 100 ms and more, which was
    most of the turn p99. After this, a full collection walks only what requests allocate.
    """
    gc.collect()
    gc.freeze()


def run_async(main: Callable[[], Coroutine[Any, Any, int | None]]) -> int:
    """Runs `main` to completion: its code (None is 0); a usage error prints one line and is 2, a failure
    of the system (an address in use, a file it cannot read) one line and 1."""
    try:
        return asyncio.run(main()) or 0
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
