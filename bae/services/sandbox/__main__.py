"""`bae sandbox` (or `python -m bae.services.sandbox`): a sandbox host (gRPC) on BAE_SANDBOX_LISTEN_ADDR.

Several hosts may run on one machine, each with its own listen address and
BAE_SANDBOX_HOST_ID. At start a host removes every container labelled with its
host id: a restarted host holds no live handles, so any such container is orphaned.
A graceful shutdown removes them too, so none outlives its host.
"""

from __future__ import annotations

import sys

from bae.common import telemetry
from bae.common.config import load_config
from bae.common.entry import run_async, service_parser
from bae.common.grpcutil import configure_logging
from bae.common.internal import InternalPlane
from bae.common.settings import load_settings
from bae.services.sandbox.config import load_sandbox_config
from bae.services.sandbox.docker_driver import DockerDriver
from bae.services.sandbox.driver import Driver, UnsupportedDriver
from bae.services.sandbox.server import serve_sandbox


def main(argv: list[str]) -> int:
    service_parser(
        "bae sandbox", "Run sandbox containers (gRPC on BAE_SANDBOX_LISTEN_ADDR) on this host's Docker daemon."
    ).parse_args(argv)

    async def start() -> None:
        settings = load_settings()
        configure_logging(settings.log, settings.log_format)
        telemetry.start(load_config(settings.config_path).telemetry, "sandbox")
        config = load_sandbox_config(settings)
        plane = InternalPlane.of(settings)
        driver: Driver = DockerDriver(config) if config.driver == "docker" else UnsupportedDriver(config.driver)
        await serve_sandbox(config, driver, settings.shutdown_timeout, plane)

    return run_async(start)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
