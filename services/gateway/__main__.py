"""`python -m services.gateway`: the HTTP edge (client + admin ports)."""

from __future__ import annotations

import asyncio
import sys

from bae.errors import UsageError
from bae.grpcutil import configure_logging
from bae.settings import load_settings
from services.gateway.server import serve


def main() -> int:
    try:
        settings = load_settings()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log)
    return asyncio.run(serve(settings))


if __name__ == "__main__":
    raise SystemExit(main())
