"""baectl: the admin CLI (BAECTL.md): the admin API on the loopback admin port, plus two local commands.

    baectl create profile main anthropic-sonnet --allowed-tool get_time
    baectl create key laptop pro_…
    baectl list sessions --state open
    baectl sandbox-status --watch

The older resource-first forms (`baectl profiles create --name … --primary-provider …`,
`keys create|list|revoke`, `sessions list`, `events <id>`) remain as aliases.
Exit codes: 0 success, 1 runtime error (`baectl: <message>` on stderr), 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from bae import __version__
from bae.ctl import commands
from bae.ctl.api import AdminApi, CtlError
from bae.ctl.authkey import auth_create_key
from bae.ctl.setup import setup

AdminCommand = Callable[[AdminApi, argparse.Namespace], int | None]
LocalCommand = Callable[[argparse.Namespace], int | None]


def u32(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {value!r}: expected an unsigned integer") from None
    if not 0 <= number < 2**32:
        raise argparse.ArgumentTypeError(f"invalid value {value!r}: expected an unsigned 32-bit integer")
    return number


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"invalid value {value!r}: expected a positive number of seconds")
    return seconds


def add_globals(parser: argparse.ArgumentParser) -> None:
    """Accepted before or after the subcommand: SUPPRESS keeps a leaf from resetting the root's value."""
    group = parser.add_argument_group("admin API")
    group.add_argument("--admin-addr", metavar="HOST:PORT", default=argparse.SUPPRESS,
                       help="admin address or URL (default: $BAE_ADMIN_ADDR, else 127.0.0.1:8081)")
    group.add_argument("--admin-token", metavar="TOKEN", default=argparse.SUPPRESS,
                       help="admin token (default: $BAE_ADMIN_TOKEN, else the key file)")
    group.add_argument("--admin-key-file", metavar="PATH", default=argparse.SUPPRESS,
                       help="admin key file (default: $BAE_ADMIN_KEY_FILE, else /var/lib/bae/admin-key.pem)")


class Builder:
    """Builds the command tree; every leaf takes the global options."""

    def __init__(self) -> None:
        self.root = argparse.ArgumentParser(prog="baectl", description="Operate a BAE server through its admin API.")
        self.root.add_argument("-V", "--version", action="version", version=f"baectl {__version__}")
        add_globals(self.root)
        # Each group's subcommand table, by its path ((): the top level).
        self.tables: dict[tuple[str, ...], argparse._SubParsersAction[argparse.ArgumentParser]] = {
            (): self.root.add_subparsers(dest="command", metavar="COMMAND", required=True)}
        self.parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def group(self, parent: tuple[str, ...], name: str, help: str) -> None:
        parser = self.tables[parent].add_parser(name, help=help, description=help)
        add_globals(parser)  # also between a group and its subcommand: `baectl list --admin-addr … keys`
        self.tables[(*parent, name)] = parser.add_subparsers(dest=f"sub_{name}", metavar="RESOURCE", required=True)
        self.parsers[(*parent, name)] = parser

    def leaf(self, path: tuple[str, ...], help: str, run: AdminCommand | None = None,
             local: LocalCommand | None = None, json_flag: bool = True) -> argparse.ArgumentParser:
        parser = self.tables[path[:-1]].add_parser(path[-1], help=help, description=help)
        add_globals(parser)
        if json_flag:
            parser.add_argument("--json", action="store_true", help="print the JSON document")
        parser.set_defaults(run=run, local=local)
        self.parsers[path] = parser
        return parser


def profile_lists(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fallback", action="append", default=[], metavar="NAME", help="fallback provider (repeatable)")
    parser.add_argument("--mcp-server", action="append", default=[], metavar="NAME", help="repeatable")
    parser.add_argument("--allowed-tool", action="append", default=[], metavar="NAME", help="repeatable")
    parser.add_argument("--sandbox", "--sandbox-image", action="append", metavar="IMAGE",
                        help="sandbox image (repeatable); update keeps the current images without it")
    parser.add_argument("--set-limit", action="append", metavar="KEY=VALUE", type=commands.limit_setting,
                        help="override a [limits] default for the profile's keys, e.g. max_open_sessions_per_key=20 "
                             "(repeatable); update keeps the current limits without it")
    parser.add_argument("--default-limits", action="store_true",
                        help="update: drop the profile's overrides (the [limits] defaults apply)")


def schedule_options(parser: argparse.ArgumentParser) -> None:
    """What `create schedule` leaves to the server's defaults and `update schedule` keeps unless given."""
    parser.add_argument("--timezone", metavar="ZONE", help="IANA time zone of the cron fields (default UTC)")
    parser.add_argument("--overlap", choices=["skip", "queue", "allow"],
                        help="when the previous run still runs (default skip)")
    parser.add_argument("--catch-up", dest="catch_up", choices=["latest", "none"],
                        help="ticks missed during downtime: run the latest once, or none (default latest)")
    parser.add_argument("--keep-open", dest="close_after", action="store_false", default=None,
                        help="leave each run's session open (default: closed when its turn ends)")
    parser.add_argument("--close-after", dest="close_after", action="store_true", default=None,
                        help="close each run's session when its turn ends (the default)")
    parser.add_argument("--disabled", dest="enabled", action="store_false", default=None, help="fire nothing")
    parser.add_argument("--enabled", dest="enabled", action="store_true", default=None, help="fire (the default)")


def trigger_options(parser: argparse.ArgumentParser) -> None:
    """What `create trigger` leaves to the server's default and `update trigger` keeps unless given."""
    parser.add_argument("--keep-open", dest="close_after", action="store_false", default=None,
                        help="leave each call's session open (default: closed when its turn ends)")
    parser.add_argument("--close-after", dest="close_after", action="store_true", default=None,
                        help="close each call's session when its turn ends (the default)")
def webhook_fields(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="http:// or https:// receiver URL")
    parser.add_argument("--event-type", action="append", metavar="TYPE",
                        help="an event type to deliver (repeatable; default: every event, \"*\")")
    parser.add_argument("--profile-id", metavar="ID", help="only events of this profile's sessions")
    parser.add_argument("--disabled", action="store_true", help="keep the webhook but deliver nothing")


def paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=u32, metavar="N", help="one page of at most N items")
    parser.add_argument("--cursor", metavar="C", help="one page, starting after cursor C")


def session_filters(parser: argparse.ArgumentParser) -> None:
    """GET /admin/v1/sessions's filters (they combine with AND)."""
    parser.add_argument("--state", choices=["open", "closed", "error"], help="only sessions in this state")
    parser.add_argument("--profile-id", metavar="ID", help="only this profile's sessions")
    parser.add_argument("--client-key-id", metavar="ID", help="only the sessions this client key opened")
    parser.add_argument("--created-after", type=commands.day_or_time, metavar="DATE",
                        help="only sessions created at or after: YYYY-MM-DD (UTC, its start) or an RFC 3339 time")
    parser.add_argument("--created-before", type=commands.day_or_time, metavar="DATE",
                        help="only sessions created before: YYYY-MM-DD (UTC, its start) or an RFC 3339 time")
    parser.add_argument("--id-prefix", metavar="PREFIX", help="only sessions whose id starts with PREFIX")


def build_parser() -> tuple[argparse.ArgumentParser, dict[tuple[str, ...], argparse.ArgumentParser]]:
    b = Builder()
    b.group((), "create", "create a profile, a client key or a webhook")
    create = b.leaf(("create", "profile"), "create a profile", commands.create_profile)
    create.add_argument("name")
    create.add_argument("primary_provider", help="a [providers] entry name")
    profile_lists(create)
    key = b.leaf(("create", "key"), "create a client key (its plaintext is shown once)", commands.create_key)
    key.add_argument("name")
    key.add_argument("profile_id")
    schedule = b.leaf(("create", "schedule"), "create a schedule: a session and a message per cron tick",
                      commands.create_schedule)
    schedule.add_argument("name")
    schedule.add_argument("profile_id", help="a profile that allows no client tools")
    schedule.add_argument("client_key_id", help="an active client key of that profile")
    schedule.add_argument("cron", help='five fields, quoted: "0 6 * * 1-5"')
    schedule.add_argument("message", help="the user message each run sends")
    schedule_options(schedule)
    trigger = b.leaf(("create", "trigger"), "create an HTTP trigger: POST /api/v1/triggers/<name> opens a session",
                     commands.create_trigger)
    trigger.add_argument("name", help="its URL's last segment: letters, digits, '.', '_', '-'")
    trigger.add_argument("profile_id", help="a profile that allows no client tools")
    trigger.add_argument("input_schema", help="a JSON Schema (draft 2020-12) as JSON text, or @FILE to read it")
    trigger.add_argument("message_template", help="the user message, {field} filled from the call's JSON")
    trigger_options(trigger)
    webhook_fields(b.leaf(("create", "webhook"), "create a webhook (its signing secret is shown once)",
                          commands.create_webhook))

    b.group((), "list", "list profiles, keys, sessions, a session's events or webhooks")
    paging(b.leaf(("list", "profiles"), "list profiles", commands.list_profiles))
    paging(b.leaf(("list", "keys"), "list active client keys", commands.list_keys))
    sessions = b.leaf(("list", "sessions"), "list sessions", commands.list_sessions)
    paging(sessions)
    session_filters(sessions)
    events = b.leaf(("list", "events"), "list a session's events", commands.list_events)
    events.add_argument("session_id")
    paging(events)
    paging(b.leaf(("list", "schedules"), "list schedules", commands.list_schedules))
    paging(b.leaf(("list", "triggers"), "list HTTP triggers", commands.list_triggers))
    paging(b.leaf(("list", "webhooks"), "list webhooks", commands.list_webhooks))

    b.group((), "get", "show one profile, schedule, trigger or webhook")
    b.leaf(("get", "profile"), "show one profile", commands.get_profile).add_argument("id")
    b.leaf(("get", "schedule"), "show one schedule", commands.get_schedule).add_argument("id")
    b.leaf(("get", "trigger"), "show one HTTP trigger", commands.get_trigger).add_argument("id")
    b.leaf(("get", "webhook"), "show one webhook (never its secret)", commands.get_webhook).add_argument("id")
    b.group((), "update", "replace a profile, a schedule, a trigger or a webhook")
    update_trigger = b.leaf(("update", "trigger"), "change an HTTP trigger: the options given, the rest kept",
                            commands.update_trigger)
    update_trigger.add_argument("id")
    for option in ("name", "profile-id", "input-schema", "message-template"):
        update_trigger.add_argument(f"--{option}", dest=option.replace("-", "_"))
    trigger_options(update_trigger)
    update_sched = b.leaf(("update", "schedule"), "change a schedule: the options given, the rest kept",
                          commands.update_schedule)
    update_sched.add_argument("id")
    for option in ("name", "profile-id", "client-key-id", "cron", "message"):
        update_sched.add_argument(f"--{option}", dest=option.replace("-", "_"))
    schedule_options(update_sched)
    update = b.leaf(("update", "profile"), "replace a profile: unrepeated lists become empty; the name and "
                    "sandbox images are kept unless given", commands.update_profile)
    update.add_argument("id")
    update.add_argument("primary_provider")
    update.add_argument("--name", help="new name (default: keep the current one)")
    profile_lists(update)
    update_hook = b.leaf(("update", "webhook"), "replace a webhook's URL, event types, profile filter and state "
                         "(its secret stays)", commands.update_webhook)
    update_hook.add_argument("id")
    webhook_fields(update_hook)
    b.group((), "delete", "delete a profile, a session or a webhook, or revoke a client key")
    b.leaf(("delete", "profile"), "delete a profile", commands.delete_profile, json_flag=False).add_argument("id")
    b.leaf(("delete", "key"), "revoke a client key and its session keys", commands.delete_key,
           json_flag=False).add_argument("id")
    b.leaf(("delete", "session"), "delete a closed or error session with its events and usage",
           commands.delete_session, json_flag=False).add_argument("id")
    b.leaf(("delete", "schedule"), "delete a schedule and its runs (their sessions stay)", commands.delete_schedule,
           json_flag=False).add_argument("id")
    b.leaf(("delete", "trigger"), "delete an HTTP trigger and its runs (their sessions stay)", commands.delete_trigger,
           json_flag=False).add_argument("id")
    runs = b.leaf(("runs",), "list a schedule's or an HTTP trigger's runs, oldest first", commands.runs)
    runs.add_argument("owner_id", metavar="SCHEDULE|TRIGGER", help="a schedule's sch_ id or a trigger's trg_ id")
    paging(runs)
    b.leaf(("delete", "webhook"), "delete a webhook, its pending deliveries and its delivery log",
           commands.delete_webhook, json_flag=False).add_argument("id")
    deliveries = b.leaf(("deliveries",), "a webhook's delivery log: attempts, status codes, next attempt",
                        commands.webhook_deliveries)
    deliveries.add_argument("webhook_id", metavar="WEBHOOK")
    paging(deliveries)
    b.leaf(("rotate-secret",), "issue a webhook's new signing secret (the old one stays valid 24 h)",
           commands.rotate_secret).add_argument("webhook_id", metavar="WEBHOOK")

    b.group((), "export", "export a session as NDJSON")
    export = b.leaf(("export", "session"), "write a session (any state) as NDJSON: its row, then its events",
                    commands.export_session, json_flag=False)
    export.add_argument("id")
    export.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    b.group((), "import", "import an exported session")
    b.leaf(("import", "session"), "recreate an exported session, closed, with its ids",
           commands.import_session).add_argument("file", metavar="FILE")
    b.group((), "purge", "delete ended sessions in bulk")
    purge = b.leaf(("purge", "sessions"), "delete every closed or error session closed before a date",
                   commands.purge_sessions)
    purge.add_argument("--closed-before", required=True, type=commands.day_or_time, metavar="DATE",
                       help="YYYY-MM-DD (UTC, its start) or an RFC 3339 time")
    purge.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")

    usage = b.leaf(("usage",), "show token, call, turn and cost totals per client key, profile or UTC day",
                   commands.usage)
    usage.add_argument("--group-by", choices=list(commands.USAGE_GROUPS), default="day",
                       help="one row per client key, profile or UTC day (default: day)")
    usage.add_argument("--since", metavar="YYYY-MM-DD", help="first UTC day counted")
    usage.add_argument("--until", metavar="YYYY-MM-DD", help="last UTC day counted (included)")
    paging(usage)
    b.leaf(("console",), "print a one-time link that signs a browser into the web console", commands.console)
    b.leaf(("config",), "show the server's loaded bae-config.toml, secrets redacted", commands.config)
    b.leaf(("providers",), "list the provider registry", commands.providers)
    b.leaf(("mcp-servers",), "list the MCP server registry", commands.mcp_servers)
    status = b.leaf(("sandbox-status",), "show each profile's sandbox images", commands.sandbox_status)
    status.add_argument("--watch", action="store_true", help="refresh until no image is pending")
    status.add_argument("--interval", type=positive_seconds, default=1.0, metavar="SECONDS",
                        help="refresh interval for --watch (default 1)")

    b.group((), "auth", "local admin-key material")
    b.group(("auth",), "create", "create local admin-key material")
    authkey = b.leaf(("auth", "create", "key"), "write an admin key and its Argon2id hash (no network)",
                     local=auth_create_key, json_flag=False)
    authkey.add_argument("--name", default="provisioned-admin")
    authkey.add_argument("--out-dir", default=".", metavar="DIR")
    wizard = b.leaf(("setup",), "the quickstart wizard: write a config and a launcher, then launch",
                    local=setup, json_flag=False)
    wizard.add_argument("--dev", action="store_true",
                        help="use the images `make images` builds here (bae-<service>:<version>)")
    wizard.add_argument("--apple", action="store_true", help="use Apple's `container` CLI")
    wizard.add_argument("--dir", default=".", metavar="DIR")
    helper = b.leaf(("help",), "show help for a command", json_flag=False)
    helper.add_argument("topic", nargs="*")

    aliases(b)
    return b.root, b.parsers


def aliases(b: Builder) -> None:
    """The resource-first forms of earlier releases, mapped onto the same commands."""
    b.group((), "profiles", "profiles (alias forms)")
    create = b.leaf(("profiles", "create"), "= create profile", commands.create_profile)
    create.add_argument("--name", required=True)
    create.add_argument("--primary-provider", required=True)
    profile_lists(create)
    paging(b.leaf(("profiles", "list"), "= list profiles", commands.list_profiles))
    b.leaf(("profiles", "get"), "= get profile", commands.get_profile).add_argument("id")
    replace = b.leaf(("profiles", "replace"), "= update profile", commands.update_profile)
    replace.add_argument("id")
    replace.add_argument("--name")
    replace.add_argument("--primary-provider", required=True)
    profile_lists(replace)
    b.leaf(("profiles", "delete"), "= delete profile", commands.delete_profile, json_flag=False).add_argument("id")
    b.group((), "keys", "client keys (alias forms)")
    key = b.leaf(("keys", "create"), "= create key", commands.create_key)
    key.add_argument("--name", required=True)
    key.add_argument("--profile-id", required=True)
    paging(b.leaf(("keys", "list"), "= list keys", commands.list_keys))
    b.leaf(("keys", "revoke"), "= delete key", commands.delete_key, json_flag=False).add_argument("id")
    b.group((), "sessions", "sessions (alias forms)")
    sessions = b.leaf(("sessions", "list"), "= list sessions", commands.list_sessions)
    paging(sessions)
    session_filters(sessions)
    events = b.leaf(("events",), "= list events", commands.list_events)
    events.add_argument("session_id")
    paging(events)


def main(argv: list[str] | None = None) -> int:
    parser, parsers = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "help":
        topic = tuple(args.topic)
        if topic and topic not in parsers:
            parser.error(f"unknown command {' '.join(topic)!r}")
        (parsers[topic] if topic else parser).print_help()
        return 0
    try:
        if args.local is not None:
            return args.local(args) or 0
        api = AdminApi.from_options(getattr(args, "admin_addr", None), getattr(args, "admin_token", None),
                                    getattr(args, "admin_key_file", None), os.environ)
        try:
            return args.run(api, args) or 0
        finally:
            api.close()
    except CtlError as exc:
        print(f"baectl: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
