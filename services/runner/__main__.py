"""`python -m services.runner [--config PATH]`: the provider runner (gRPC)."""

from __future__ import annotations

import os
import sys

from bae.config import config_path_from, load_config
from bae.grpcutil import configure_logging, run_main, serve
from bae.settings import load_settings
from services.runner.clients import ProviderClients
from services.runner.server import RunnerService, registrar


async def main() -> None:
    settings = load_settings()
    configure_logging(settings.log)
    config = load_config(config_path_from(sys.argv[1:], os.environ))
    clients = ProviderClients(settings.provider_timeout)
    await serve(
        "runner",
        settings.runner_grpc_addr,
        registrar(RunnerService(config, clients)),
        settings.shutdown_timeout,
        on_shutdown=clients.close,
    )


if __name__ == "__main__":
    run_main(main)
