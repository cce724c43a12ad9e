"""`python -m bae.services.session [--config P] [serve|migrate|version|help] [options]` (SERVER-SPEC §1.1, §1.2).

Exit codes: 0 done, 1 runtime failure (database, files, bind), 2 usage error.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from bae import API_VERSIONS, __version__
from bae.common import telemetry
from bae.common.config import load_config
from bae.common.errors import UsageError
from bae.common.grpcutil import configure_logging, serve
from bae.common.internal import InternalPlane
from bae.common.settings import Settings, load_settings
from bae.services.session.api.admin_key import AdminKeyError, AdminKeyOptions
from bae.services.session.store import Store

COMMANDS = ("serve", "migrate", "version", "help")
VALUE_FLAGS = ("--config", "--admin-key-file", "--admin-key-hash-file")
SWITCHES = ("--rotate-admin-key", "--dangerously-disable-admin-auth")

USAGE = """\
usage: bae session [--config <path>] [serve|migrate|version|help] [options]

commands:
  serve      run the session service (default)
  migrate    apply database migrations and exit
  version    print the version (also --version, -V)
  help       print this help (also --help, -h)

serve options:
  --config <path>                  bae-config.toml (default: $BAE_CONFIG)
  --admin-key-file <path>          where a generated admin key is written
  --admin-key-hash-file <path>     pre-provisioned admin key hash (JSON)
  --rotate-admin-key               revoke every admin key and generate a new one
  --dangerously-disable-admin-auth serve the admin API without authentication
"""


@dataclass
class Command:
    name: str = "serve"
    values: dict[str, str] = field(default_factory=dict)
    switches: set[str] = field(default_factory=set)

    def value(self, flag: str) -> str | None:
        return self.values.get(flag)

    def has(self, switch: str) -> bool:
        return switch in self.switches


def parse_args(argv: list[str]) -> Command:
    """Flags may come before or after the subcommand; any misuse is a UsageError."""
    command: str | None = None
    asked: str | None = None  # --help / --version answer whatever command they come with
    values: dict[str, str] = {}
    switches: set[str] = set()
    index = 0
    while index < len(argv):
        arg = argv[index]
        flag, has_inline, inline = arg.partition("=")
        if flag in VALUE_FLAGS:
            if has_inline:
                value = inline
            else:
                index += 1
                value = argv[index] if index < len(argv) else ""
                if value.startswith("--"):
                    value = ""
            if not value:
                raise UsageError(f"{flag} requires a value")
            values[flag] = value
        elif arg in SWITCHES:
            switches.add(arg)
        elif arg in ("--version", "-V"):
            asked = asked or "version"
        elif arg in ("--help", "-h"):
            asked = "help"
        elif arg.startswith("-"):
            raise UsageError(f"unknown option {arg}\n{USAGE}")
        elif command is None and arg in COMMANDS:
            command = arg
        else:
            raise UsageError(f"unknown command {arg!r}\n{USAGE}")
        index += 1
    if "--rotate-admin-key" in switches and "--dangerously-disable-admin-auth" in switches:
        raise UsageError("--rotate-admin-key cannot be combined with --dangerously-disable-admin-auth")
    return Command(asked or command or "serve", values, switches)


def admin_key_options(command: Command, settings: Settings) -> AdminKeyOptions:
    """Flags beat environment variables."""
    disabled = command.has("--dangerously-disable-admin-auth") or settings.disable_admin_auth
    rotate = command.has("--rotate-admin-key")
    if rotate and disabled:
        raise UsageError(
            "--rotate-admin-key cannot be used while BAE_DANGEROUSLY_DISABLE_ADMIN_AUTH disables admin auth"
        )
    return AdminKeyOptions(
        key_file=Path(command.value("--admin-key-file") or settings.admin_key_file),
        hash_file=Path(command.value("--admin-key-hash-file") or settings.admin_key_hash_file),
        rotate=rotate,
        disabled=disabled,
        store_name=f"the store {settings.printable_database_url}",
    )


async def migrate_only(settings: Settings) -> None:
    store = await Store.open(settings.sqlalchemy_url, settings.sqlite_synchronous)
    applied, head = store.migrations_applied, await store.revision()
    await store.close()
    done = f"applied {' '.join(applied)}" if applied else f"already at {head}"
    print(f"database migrated ({done}): {settings.printable_database_url}")


async def serve_forever(command: Command, settings: Settings) -> None:
    # Imported here so `version`/`help`/`migrate` need no generated gRPC code.
    from bae.services.session.wiring import session_service

    plane = InternalPlane.of(settings)
    config = load_config(command.value("--config") or settings.config_path)
    telemetry.start(config.telemetry, "session")
    service = await session_service(settings, config, admin_key_options(command, settings))
    await service.start()
    # Shutdown phases: stop accepting and drain (within BAE_SHUTDOWN_TIMEOUT), then tear down.
    await serve(
        "session", settings.session_grpc_addr, service.registrar(), settings.shutdown_timeout, service.stop,
        plane=plane, drain=service.drain,
    )


def main(argv: list[str], env: dict[str, str] | None = None) -> int:
    try:
        command = parse_args(argv)
        if command.name == "help":
            print(USAGE, end="")
            return 0
        if command.name == "version":
            print(f"bae {__version__} (api {', '.join(API_VERSIONS)})")
            return 0
        settings = load_settings(os.environ if env is None else env)
        configure_logging(settings.log, settings.log_format)
        if command.name == "migrate":
            asyncio.run(migrate_only(settings))
        else:
            asyncio.run(serve_forever(command, settings))
        return 0
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (SQLAlchemyError, AdminKeyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
