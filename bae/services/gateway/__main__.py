"""`bae gateway` (or `python -m bae.services.gateway`): the HTTP edge (client + admin ports)."""

from __future__ import annotations

import sys

from bae.common import telemetry
from bae.common.config import load_config
from bae.common.entry import run_async, service_parser
from bae.common.grpcutil import configure_logging
from bae.common.settings import load_settings
from bae.services.gateway.server import serve


def main(argv: list[str]) -> int:
    service_parser(
        "bae gateway",
        "Serve the client API on BAE_ADDR and the admin API on BAE_ADMIN_ADDR, forwarding to the "
        "session service at BAE_SESSION_GRPC_ADDR.",
    ).parse_args(argv)

    async def start() -> int:
        settings = load_settings()
        configure_logging(settings.log, settings.log_format)
        config = load_config(settings.config_path)
        telemetry.start(config.telemetry, "gateway")
        return await serve(settings, config)

    return run_async(start)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
