"""`python -m services.gateway`: the HTTP edge (client + admin ports)."""

from __future__ import annotations

from bae.grpcutil import configure_logging, run_main
from bae.settings import load_settings
from services.gateway.server import serve


async def main() -> int:
    settings = load_settings()
    configure_logging(settings.log)
    return await serve(settings)


if __name__ == "__main__":
    run_main(main)
