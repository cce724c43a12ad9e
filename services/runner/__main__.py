"""`python -m services.runner [--config PATH]`: the provider runner (gRPC)."""

from __future__ import annotations

import logging
import os
import sys

from bae.config import config_path_from, load_config
from bae.grpcutil import configure_logging, run_main, serve
from bae.settings import load_settings, parse_seconds
from services.runner.clients import ProviderClients
from services.runner.server import RunnerService, registrar

DEFAULT_PROVIDER_TIMEOUT = "300"
# Their debug output includes request options, auth headers among them.
SDK_LOGGERS = ("anthropic", "openai", "httpx", "httpx2", "httpcore", "httpcore2")


async def main() -> None:
    settings = load_settings()
    configure_logging(settings.log)
    for name in SDK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    config = load_config(config_path_from(sys.argv[1:], os.environ))
    timeout = parse_seconds(
        "BAE_PROVIDER_TIMEOUT", os.environ.get("BAE_PROVIDER_TIMEOUT", DEFAULT_PROVIDER_TIMEOUT)
    )
    clients = ProviderClients(float(timeout))
    await serve(
        "runner",
        settings.runner_grpc_addr,
        registrar(RunnerService(config, clients)),
        settings.shutdown_timeout,
        on_shutdown=clients.close,
    )


if __name__ == "__main__":
    run_main(main)
