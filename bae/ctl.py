"""baectl: the operator CLI for the admin API (loopback admin port).

    baectl profiles create --name main --primary-provider anthropic-sonnet --allowed-tool get_time
    baectl keys create --name laptop --profile-id pro_…
    baectl sessions list --state open
    baectl events ses_…

The admin address comes from BAE_ADMIN_ADDR (default 127.0.0.1:8081) and the
admin key from --admin-key-file, else BAE_ADMIN_KEY_FILE, else
/var/lib/bae/admin-key.pem. Tables by default, JSON with --json. An API error
prints `error: <status> <type>: <detail>` and exits 1; bad usage exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import httpx

from bae.errors import UsageError
from bae.jsontext import dump
from bae.settings import DEFAULT_ADMIN_ADDR, DEFAULT_ADMIN_KEY_FILE, parse_address

PAGE_LIMIT = 200  # the server's maximum page size


class CtlError(Exception):
    """A failure to report on stderr; exits 1."""


@dataclass
class Column:
    title: str
    field: str
    # Longer cells are cut to this many characters.
    width: int | None = None


PROFILE_COLUMNS = [
    Column("ID", "id"),
    Column("NAME", "name"),
    Column("PRIMARY", "primary_provider"),
    Column("FALLBACKS", "fallback_providers"),
    Column("MCP SERVERS", "mcp_servers"),
    Column("ALLOWED TOOLS", "allowed_tools"),
    Column("SANDBOXES", "available_sandboxes"),
    Column("UPDATED", "updated_at"),
]
KEY_COLUMNS = [
    Column("ID", "id"),
    Column("NAME", "name"),
    Column("PREFIX", "prefix"),
    Column("PROFILE", "profile_id"),
    Column("CREATED", "created_at"),
    Column("LAST USED", "last_used_at"),
]
SESSION_COLUMNS = [
    Column("ID", "id"),
    Column("PROFILE", "profile_id"),
    Column("STATE", "state"),
    Column("CLIENT VERSION", "client_version"),
    Column("CREATED", "created_at"),
    Column("CLOSED", "closed_at"),
]
EVENT_COLUMNS = [
    Column("ID", "id"),
    Column("TYPE", "event_type"),
    Column("CLIENT KEY", "client_key_id"),
    Column("CREATED", "created_at"),
    Column("PAYLOAD", "payload", width=80),
]


class AdminApi:
    def __init__(self, address: str, admin_key: str | None, key_file: str) -> None:
        self.base_url = f"http://{address}"
        self.key_file = key_file
        self.has_key = admin_key is not None
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key is not None else {}
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=30)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CtlError(f"cannot reach the admin API at {self.base_url}: {exc}") from None
        if response.is_success:
            return response
        raise CtlError(self._describe_failure(response))

    def _describe_failure(self, response: httpx.Response) -> str:
        try:
            problem = response.json()
            message = f"{problem['status']} {problem['type']}: {problem['detail']}"
        except (ValueError, KeyError, TypeError):
            message = f"{response.status_code} {response.reason_phrase}: {response.text.strip()}"
        if response.status_code == 401 and not self.has_key:
            message += f" (no admin key: {self.key_file} does not exist)"
        return message

    def close(self) -> None:
        self.http.close()

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def pages(self, path: str, params: dict[str, str] | None = None) -> Iterator[dict]:
        """Every item of a paginated list, following next_cursor to the end."""
        cursor = ""
        while True:
            page = self.json("GET", path, params={**(params or {}), "cursor": cursor, "limit": PAGE_LIMIT})
            yield from page["items"]
            cursor = page.get("next_cursor")
            if cursor is None:
                return


# --- output --------------------------------------------------------------------------------

def cell(value: Any, width: int | None = None) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, list):
        text = ",".join(str(item) for item in value) or "-"
    elif isinstance(value, dict):
        text = dump(value)
    else:
        text = str(value)
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def table(rows: list[dict], columns: list[Column]) -> str:
    cells = [[column.title for column in columns]]
    for row in rows:
        cells.append([cell(row.get(column.field), column.width) for column in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in cells
    )


def record(item: dict) -> str:
    width = max(len(key) for key in item)
    return "\n".join(f"{key.ljust(width)}  {cell(value)}" for key, value in item.items())


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


@dataclass
class Output:
    as_json: bool

    def show_list(self, items: list[dict], columns: list[Column], empty: str) -> None:
        if self.as_json:
            print(pretty_json(items))
        elif items:
            print(table(items, columns))
        else:
            print(empty)

    def show_record(self, item: dict) -> None:
        print(pretty_json(item) if self.as_json else record(item))

    def show_done(self, item: dict, text: str) -> None:
        print(pretty_json(item) if self.as_json else text)


# --- commands ------------------------------------------------------------------------------

def profile_body(args: argparse.Namespace) -> dict:
    return {
        "name": args.name,
        "primary_provider": args.primary_provider,
        "fallback_providers": args.fallback,
        "mcp_servers": args.mcp_server,
        "allowed_tools": args.allowed_tool,
        "available_sandboxes": args.sandbox_image,
    }


def profiles_create(api: AdminApi, out: Output, args: argparse.Namespace) -> None:
    out.show_record(api.json("POST", "/admin/v1/profiles", json=profile_body(args)))


def profiles_list(api: AdminApi, out: Output, args: argparse.Namespace) -> None:
    out.show_list(list(api.pages("/admin/v1/profiles")), PROFILE_COLUMNS, "no profiles")


def profiles_get(api: AdminApi, out: Output, args: argparse.Namespace) -> None:
    out.show_record(api.json("GET", f"/admin/v1/profiles/{args.id}"))


def profiles_replace(api: AdminApi, out: Output, args: argparse.Namespace) -> None:
    out.show_record(api.json("PUT", f"/admin/v1/profiles/{args.id}", json=profile_body(args)))


def profiles_delete(api: AdminApi, out: Output, args: argparse.Namespace) -> None:
    api.request("DELETE", f"/admin/v1/profiles/{args.id}")
    out.show_done({"id": args.id, "deleted": True}, f"deleted profile {args.id}")


def keys_create(api: AdminApi, out: Output, args: argparse.Namespace) -> None:
    created = api.json("POST", "/admin/v1/keys", json={"name": args.name, "profile_id": args.profile_id})
    out.show_record(created)
    if not out.as_json:
        print("store the key now: it is not shown again", file=sys.stderr)


def keys_list(api: AdminApi, out: Output, args: argparse.Namespace) -> None:
    out.show_list(list(api.pages("/admin/v1/keys")), KEY_COLUMNS, "no client keys")


def keys_revoke(api: AdminApi, out: Output, args: argparse.Namespace) -> None:
    api.request("DELETE", f"/admin/v1/keys/{args.id}")
    out.show_done({"id": args.id, "revoked": True}, f"revoked client key {args.id}")


def sessions_list(api: AdminApi, out: Output, args: argparse.Namespace) -> None:
    params = {"state": args.state} if args.state else {}
    out.show_list(list(api.pages("/admin/v1/sessions", params)), SESSION_COLUMNS, "no sessions")


def events(api: AdminApi, out: Output, args: argparse.Namespace) -> None:
    items = list(api.pages(f"/admin/v1/sessions/{args.session_id}/events"))
    out.show_list(items, EVENT_COLUMNS, "no events")


Command = Callable[[AdminApi, Output, argparse.Namespace], None]


def build_parser() -> argparse.ArgumentParser:
    # Shared options are accepted before or after the subcommand; SUPPRESS keeps a
    # subcommand from resetting a value given before it (read with getattr).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    common.add_argument("--admin-key-file", default=argparse.SUPPRESS, metavar="PATH",
                        help="admin key file (default: $BAE_ADMIN_KEY_FILE or " + DEFAULT_ADMIN_KEY_FILE + ")")

    parser = argparse.ArgumentParser(prog="baectl", description="Operate a BAE server through its admin API.",
                                     parents=[common])
    resources = parser.add_subparsers(dest="resource", required=True, metavar="RESOURCE")

    def command(group, name: str, run: Command, help: str) -> argparse.ArgumentParser:
        sub = group.add_parser(name, parents=[common], help=help, description=help)
        sub.set_defaults(run=run)
        return sub

    def profile_flags(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--name", required=True)
        sub.add_argument("--primary-provider", required=True, help="a [providers] entry name")
        sub.add_argument("--fallback", action="append", default=[], metavar="PROVIDER",
                         help="fallback provider (repeatable, in order)")
        sub.add_argument("--mcp-server", action="append", default=[], metavar="NAME", help="repeatable")
        sub.add_argument("--allowed-tool", action="append", default=[], metavar="TOOL", help="repeatable")
        sub.add_argument("--sandbox-image", action="append", default=[], metavar="IMAGE", help="repeatable")

    profiles = resources.add_parser("profiles", help="manage profiles").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    profile_flags(command(profiles, "create", profiles_create, "create a profile"))
    command(profiles, "list", profiles_list, "list profiles")
    command(profiles, "get", profiles_get, "show one profile").add_argument("id")
    replace = command(profiles, "replace", profiles_replace, "replace a profile (omitted lists become empty)")
    replace.add_argument("id")
    profile_flags(replace)
    command(profiles, "delete", profiles_delete, "delete a profile").add_argument("id")

    keys = resources.add_parser("keys", help="manage client keys").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    create_key = command(keys, "create", keys_create, "create a client key (printed once)")
    create_key.add_argument("--name", required=True)
    create_key.add_argument("--profile-id", required=True)
    command(keys, "list", keys_list, "list active client keys")
    command(keys, "revoke", keys_revoke, "revoke a client key and its session keys").add_argument("id")

    sessions = resources.add_parser("sessions", help="inspect sessions").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    command(sessions, "list", sessions_list, "list sessions").add_argument(
        "--state", choices=["open", "closed", "error"], help="only sessions in this state")

    command(resources, "events", events, "print a session's full event history").add_argument("session_id")
    return parser


def read_admin_key(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as key_file:
            return key_file.read().strip()
    except FileNotFoundError:
        return None  # the server may run with admin auth disabled
    except OSError as exc:
        raise CtlError(f"cannot read admin key file {path}: {exc.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        address = parse_address("BAE_ADMIN_ADDR", os.environ.get("BAE_ADMIN_ADDR", DEFAULT_ADMIN_ADDR))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    key_file = getattr(args, "admin_key_file", None) or os.environ.get("BAE_ADMIN_KEY_FILE") or DEFAULT_ADMIN_KEY_FILE
    try:
        api = AdminApi(str(address), read_admin_key(key_file), key_file)
        try:
            args.run(api, Output(getattr(args, "json", False)), args)
        finally:
            api.close()
    except CtlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
