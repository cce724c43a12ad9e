"""`bae runner [--config PATH]` (or `python -m bae.services.runner`): the provider runner (gRPC)."""

from __future__ import annotations

import os
import sys

from bae.common import telemetry
from bae.common.config import load_config
from bae.common.entry import run_async, service_parser
from bae.common.grpcutil import configure_logging, serve
from bae.common.internal import InternalPlane
from bae.common.settings import load_settings
from bae.services.runner.clients import ProviderClients
from bae.services.runner.demo import DemoProvider
from bae.services.runner.server import RunnerService, registrar


def main(argv: list[str]) -> int:
    parser = service_parser(
        "bae runner", "Serve provider calls (gRPC) on BAE_RUNNER_GRPC_ADDR for the session service."
    )
    parser.add_argument("--config", metavar="PATH", help="bae-config.toml (default: $BAE_CONFIG)")
    args = parser.parse_args(argv)
    if args.config == "":
        parser.error("--config requires a value")

    async def start() -> None:
        settings = load_settings()
        configure_logging(settings.log, settings.log_format)
        config = load_config(args.config or os.environ.get("BAE_CONFIG") or None)
        telemetry.start(config.telemetry, "runner")
        clients = ProviderClients(settings.provider_timeout)
        demo = DemoProvider(settings.demo_provider_addr) if settings.demo_provider_addr else None
        if demo is not None:
            await demo.start()

        async def shutdown() -> None:
            await clients.close()
            if demo is not None:
                await demo.stop()

        service = RunnerService(config, clients, settings.rpc_timeout)
        await serve(
            "runner",
            settings.runner_grpc_addr,
            registrar(service),
            settings.shutdown_timeout,
            on_shutdown=shutdown,
            plane=InternalPlane.of(settings),
            drain=service.drain,
        )

    return run_async(start)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
