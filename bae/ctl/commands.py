"""The admin commands: one function per command, each given the API and its parsed arguments."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any

from bae.ctl.api import UNEXPECTED, AdminApi, CtlError
from bae.ctl.output import as_json, created, joined, labelled, profile, table

PROFILE_COLUMNS = [("ID", "id"), ("NAME", "name"), ("PRIMARY_PROVIDER", "primary_provider")]
KEY_COLUMNS = [("ID", "id"), ("NAME", "name"), ("PREFIX", "prefix"), ("PROFILE_ID", "profile_id")]
# CLIENT_KEY_ID came later: last, so the columns before it keep their places for scripts that read them.
SESSION_COLUMNS = [("ID", "id"), ("PROFILE_ID", "profile_id"), ("STATE", "state"),
                   ("CLIENT_VERSION", "client_version"), ("CREATED_AT", "created_at"), ("CLOSED_AT", "closed_at"),
                   ("CLIENT_KEY_ID", "client_key_id")]
EVENT_COLUMNS = [("ID", "id"), ("EVENT_TYPE", "event_type"), ("CLIENT_KEY_ID", "client_key_id"),
                 ("CREATED_AT", "created_at"), ("PAYLOAD", "payload")]
PROVIDER_COLUMNS = [("NAME", "name"), ("PROVIDER", "provider"), ("MODEL", "model"), ("BASE_URL", "base_url")]
MCP_COLUMNS = [("NAME", "name"), ("TRANSPORT", "transport")]
IMAGE_COLUMNS = [("PROFILE_ID", "profile_id"), ("IMAGE", "name"), ("STATUS", "status"), ("DETAIL", "detail")]
# Each usage group's key column, then its totals.
USAGE_GROUPS = {"key": ("CLIENT_KEY_ID", "client_key_id"), "profile": ("PROFILE_ID", "profile_id"), "day": ("DAY", "day")}
USAGE_COLUMNS = [("INPUT", "input_tokens"), ("OUTPUT", "output_tokens"), ("CACHE_READ", "cache_read_input_tokens"),
                 ("CACHE_WRITE", "cache_creation_input_tokens"), ("CALLS", "provider_calls"), ("TURNS", "turns"),
                 ("COST_USD", "cost_usd")]
SCHEDULE_COLUMNS = [("ID", "id"), ("NAME", "name"), ("CRON", "cron"), ("TIMEZONE", "timezone"),
                    ("ENABLED", "enabled"), ("NEXT_FIRE_AT", "next_fire_at")]
RUN_COLUMNS = [("RUN_ID", "run_id"), ("SCHEDULED_FOR", "scheduled_for"), ("FIRED_AT", "fired_at"),
               ("SESSION_ID", "session_id"), ("OUTCOME", "outcome"), ("DETAIL", "detail")]
SCHEDULE_FIELDS = ["id", "name", "profile_id", "client_key_id", "cron", "timezone", "message", "overlap", "catch_up",
                   "close_after", "enabled", "next_fire_at", "created_at", "updated_at"]
# What a POST or PUT sends; an option left out (None) keeps the current value, or the server's default.
SCHEDULE_BODY = ("name", "profile_id", "client_key_id", "cron", "timezone", "message", "overlap", "catch_up",
                 "close_after", "enabled")
TRIGGER_COLUMNS = [("ID", "id"), ("NAME", "name"), ("PROFILE_ID", "profile_id"), ("CLOSE_AFTER", "close_after")]
TRIGGER_RUN_COLUMNS = [("RUN_ID", "run_id"), ("FIRED_AT", "fired_at"), ("SESSION_ID", "session_id"),
                       ("OUTCOME", "outcome"), ("IDEMPOTENCY_KEY", "idempotency_key"), ("DETAIL", "detail")]
TRIGGER_FIELDS = ["id", "name", "profile_id", "input_schema", "message_template", "close_after", "created_at",
                  "updated_at"]
TRIGGER_BODY = ("name", "profile_id", "input_schema", "message_template", "close_after")
WEBHOOK_COLUMNS = [("ID", "id"), ("URL", "url"), ("EVENT_TYPES", "event_types"), ("PROFILE_ID", "profile_id"),
                   ("ENABLED", "enabled")]
DELIVERY_COLUMNS = [("ID", "id"), ("EVENT_TYPE", "event_type"), ("STATE", "state"), ("ATTEMPTS", "attempts"),
                    ("LAST_STATUS", "last_status"), ("NEXT_ATTEMPT_AT", "next_attempt_at"), ("LAST_ERROR", "last_error")]
WEBHOOK_FIELDS = ["id", "url", "event_types", "profile_id", "enabled", "created_at", "updated_at"]
PAYLOAD_WIDTH = 80  # event payloads are cut to keep the table readable; --json shows them whole
COPY_KEY_NOW = "baectl: copy the key now — it cannot be retrieved again"
COPY_SECRET_NOW = "baectl: copy the secret now — it cannot be retrieved again"
ERROR_WIDTH = 60  # a delivery's last error is cut in the table; --json shows it whole


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CtlError(UNEXPECTED)
    return value


def _emit(args: argparse.Namespace, value: Any, human: str) -> None:
    print(as_json(value) if getattr(args, "json", False) else human)


def listing(api: AdminApi, args: argparse.Namespace, path: str, columns: list[tuple[str, str]], empty: str,
            params: dict[str, str] | None = None) -> None:
    """Every page without --limit/--cursor (JSON: one flat array); otherwise exactly one request
    (JSON: `{items, next_cursor}`; a table's next cursor goes to stderr)."""
    params = params or {}
    next_cursor = None
    if args.limit is None and args.cursor is None:
        items = api.every_item(path, params)
        document: Any = items
    else:
        query = {**params, **({"limit": str(args.limit)} if args.limit is not None else {}),
                 **({"cursor": args.cursor} if args.cursor is not None else {})}
        page = api.page(path, query)
        items, next_cursor = page["items"], page.get("next_cursor")
        document = {"items": items, "next_cursor": next_cursor}
    widths = {"payload": PAYLOAD_WIDTH, "last_error": ERROR_WIDTH}
    _emit(args, document, table(items, columns, widths) if items else empty)
    if isinstance(next_cursor, str) and not args.json:
        print(f"baectl: more results: --cursor {next_cursor}", file=sys.stderr)


# --- profiles ----------------------------------------------------------------------------------

def limit_setting(text: str) -> tuple[str, int | float]:
    """`--set-limit KEY=VALUE`: a [limits] key and its number (the server checks both)."""
    key, sep, value = text.partition("=")
    try:
        number: int | float = int(value) if value.strip().lstrip("-").isdigit() else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY=NUMBER, got {text!r}") from None
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=NUMBER, got {text!r}")
    return key, number


def profile_body(
    args: argparse.Namespace, name: str, sandboxes: list[Any] | None, limits: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "primary_provider": args.primary_provider,
                            "fallback_providers": args.fallback, "mcp_servers": args.mcp_server,
                            "allowed_tools": args.allowed_tool}
    if sandboxes is not None:
        body["available_sandboxes"] = sandboxes
    if args.set_limit:
        body["limits"] = dict(args.set_limit)
    elif limits is not None:
        body["limits"] = limits
    return body


def create_profile(api: AdminApi, args: argparse.Namespace) -> None:
    reply = _object(api.call("POST", "/profiles", body=profile_body(args, args.name, args.sandbox)))
    _emit(args, reply, created("profile", reply, ["id", "name", "created_at"]))


def list_profiles(api: AdminApi, args: argparse.Namespace) -> None:
    listing(api, args, "/profiles", PROFILE_COLUMNS, "no profiles found")


def get_profile(api: AdminApi, args: argparse.Namespace) -> None:
    reply = _object(api.call("GET", f"/profiles/{args.id}"))
    _emit(args, reply, profile(reply))


def update_profile(api: AdminApi, args: argparse.Namespace) -> None:
    """A full PUT; the name, the sandbox images and the limits are kept from the current profile
    unless given."""
    name, sandboxes, limits = args.name, args.sandbox, None
    if name is None or sandboxes is None or not (args.set_limit or args.default_limits):
        current = _object(api.call("GET", f"/profiles/{args.id}"))
        if not args.default_limits:
            kept_limits = current.get("limits")
            limits = kept_limits if isinstance(kept_limits, dict) else None
        if name is None:
            name = current.get("name")
            if not isinstance(name, str):
                raise CtlError("could not determine the profile's current name to preserve; pass --name explicitly")
        if sandboxes is None:
            kept = current.get("available_sandboxes")
            sandboxes = kept if isinstance(kept, list) else []
    reply = _object(api.call("PUT", f"/profiles/{args.id}", body=profile_body(args, name, sandboxes, limits)))
    _emit(args, reply, profile(reply))


def delete_profile(api: AdminApi, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/profiles/{args.id}", expect_body=False)
    print(f"deleted profile {args.id}")


# --- schedules ---------------------------------------------------------------------------------

def schedule_record(item: dict[str, Any]) -> str:
    """`get`/`create`/`update schedule`: one field per line, values at column 16."""
    shown = {key: (str(value).lower() if isinstance(value, bool) else value) for key, value in item.items()}
    return "\n".join(labelled(shown, SCHEDULE_FIELDS, 15))


def schedule_body(args: argparse.Namespace, current: dict[str, Any]) -> dict[str, Any]:
    """The PUT or POST body: each option given, else the current value (create: none, the server's default)."""
    body: dict[str, Any] = {key: current[key] for key in SCHEDULE_BODY if key in current}
    for key in SCHEDULE_BODY:
        value = getattr(args, key, None)
        if value is not None:
            body[key] = value
    return body


def create_schedule(api: AdminApi, args: argparse.Namespace) -> None:
    reply = _object(api.call("POST", "/schedules", body=schedule_body(args, {})))
    _emit(args, reply, "created schedule\n" + schedule_record(reply))


def list_schedules(api: AdminApi, args: argparse.Namespace) -> None:
    listing(api, args, "/schedules", SCHEDULE_COLUMNS, "no schedules found")


def get_schedule(api: AdminApi, args: argparse.Namespace) -> None:
    _emit(args, reply := _object(api.call("GET", f"/schedules/{args.id}")), schedule_record(reply))


def update_schedule(api: AdminApi, args: argparse.Namespace) -> None:
    """A full PUT of the current schedule with the options given changed."""
    current = _object(api.call("GET", f"/schedules/{args.id}"))
    reply = _object(api.call("PUT", f"/schedules/{args.id}", body=schedule_body(args, current)))
    _emit(args, reply, schedule_record(reply))


def delete_schedule(api: AdminApi, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/schedules/{args.id}", expect_body=False)
    print(f"deleted schedule {args.id}")


def runs(api: AdminApi, args: argparse.Namespace) -> None:
    """A trigger's runs for a `trg_` id, else a schedule's (the id says whose)."""
    if args.owner_id.startswith("trg_"):
        listing(api, args, f"/triggers/{args.owner_id}/runs", TRIGGER_RUN_COLUMNS, "no runs found")
    else:
        listing(api, args, f"/schedules/{args.owner_id}/runs", RUN_COLUMNS, "no runs found")


# --- HTTP triggers -----------------------------------------------------------------------------

def trigger_record(item: dict[str, Any]) -> str:
    """`get`/`create`/`update trigger`: one field per line, values at column 19; the schema as compact JSON."""
    shown = {key: (str(value).lower() if isinstance(value, bool) else value) for key, value in item.items()}
    if "input_schema" in item:
        shown["input_schema"] = json.dumps(item["input_schema"], separators=(",", ":"))
    return "\n".join(labelled(shown, TRIGGER_FIELDS, 18))


def input_schema(text: str) -> Any:
    """A schema given as JSON text, or @FILE."""
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as file:
                text = file.read()
        except OSError as exc:
            raise CtlError(f"cannot read {text[1:]}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CtlError(f"input_schema is not JSON: {exc}") from None


def trigger_body(args: argparse.Namespace, current: dict[str, Any]) -> dict[str, Any]:
    """The PUT or POST body: each option given, else the current value (create: none, the server's default)."""
    body: dict[str, Any] = {key: current[key] for key in TRIGGER_BODY if key in current}
    for key in TRIGGER_BODY:
        value = getattr(args, key, None)
        if value is not None:
            body[key] = input_schema(value) if key == "input_schema" else value
    return body


def create_trigger(api: AdminApi, args: argparse.Namespace) -> None:
    reply = _object(api.call("POST", "/triggers", body=trigger_body(args, {})))
    _emit(args, reply, "created trigger\n" + trigger_record(reply))


def list_triggers(api: AdminApi, args: argparse.Namespace) -> None:
    listing(api, args, "/triggers", TRIGGER_COLUMNS, "no triggers found")


def get_trigger(api: AdminApi, args: argparse.Namespace) -> None:
    _emit(args, reply := _object(api.call("GET", f"/triggers/{args.id}")), trigger_record(reply))


def update_trigger(api: AdminApi, args: argparse.Namespace) -> None:
    """A full PUT of the current trigger with the options given changed."""
    current = _object(api.call("GET", f"/triggers/{args.id}"))
    reply = _object(api.call("PUT", f"/triggers/{args.id}", body=trigger_body(args, current)))
    _emit(args, reply, trigger_record(reply))


def delete_trigger(api: AdminApi, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/triggers/{args.id}", expect_body=False)
    print(f"deleted trigger {args.id}")


# --- keys --------------------------------------------------------------------------------------

def create_key(api: AdminApi, args: argparse.Namespace) -> None:
    reply = _object(api.call("POST", "/keys", body={"name": args.name, "profile_id": args.profile_id}))
    _emit(args, reply, created("key", reply, ["id", "name", "key", "prefix", "profile_id", "created_at"]))
    print(COPY_KEY_NOW, file=sys.stderr)


def list_keys(api: AdminApi, args: argparse.Namespace) -> None:
    listing(api, args, "/keys", KEY_COLUMNS, "no keys found")


def delete_key(api: AdminApi, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/keys/{args.id}", expect_body=False)
    print(f"revoked key {args.id}")


# --- webhooks ----------------------------------------------------------------------------------

def _webhook_body(args: argparse.Namespace) -> dict[str, Any]:
    return {"url": args.url, "event_types": args.event_type or ["*"], "profile_id": args.profile_id,
            "enabled": not args.disabled}


def _webhook_text(item: dict[str, Any], extra: tuple[str, ...] = ()) -> str:
    shown = {**item, "event_types": joined(item.get("event_types")), "enabled": str(item.get("enabled")).lower()}
    return "\n".join(labelled(shown, [*WEBHOOK_FIELDS, *extra], 12))


def create_webhook(api: AdminApi, args: argparse.Namespace) -> None:
    reply = _object(api.call("POST", "/webhooks", body=_webhook_body(args)))
    _emit(args, reply, "created webhook\n" + _webhook_text(reply, ("secret",)))
    print(COPY_SECRET_NOW, file=sys.stderr)


def list_webhooks(api: AdminApi, args: argparse.Namespace) -> None:
    listing(api, args, "/webhooks", WEBHOOK_COLUMNS, "no webhooks found")


def get_webhook(api: AdminApi, args: argparse.Namespace) -> None:
    reply = _object(api.call("GET", f"/webhooks/{args.id}"))
    _emit(args, reply, _webhook_text(reply))


def update_webhook(api: AdminApi, args: argparse.Namespace) -> None:
    """A full PUT: the URL, event types (default every event), profile filter and state given replace the
    current ones; the secret stays."""
    reply = _object(api.call("PUT", f"/webhooks/{args.id}", body=_webhook_body(args)))
    _emit(args, reply, _webhook_text(reply))


def delete_webhook(api: AdminApi, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/webhooks/{args.id}", expect_body=False)
    print(f"deleted webhook {args.id}")


def webhook_deliveries(api: AdminApi, args: argparse.Namespace) -> None:
    listing(api, args, f"/webhooks/{args.webhook_id}/deliveries", DELIVERY_COLUMNS, "no deliveries found")


def rotate_secret(api: AdminApi, args: argparse.Namespace) -> None:
    reply = _object(api.call("POST", f"/webhooks/{args.webhook_id}/rotate-secret"))
    _emit(args, reply, "\n".join(labelled(reply, ["id", "secret", "previous_expires_at"], 21)))
    print(COPY_SECRET_NOW + "; the previous one stays valid until previous_expires_at", file=sys.stderr)


# --- sessions and their events ------------------------------------------------------------------

SESSION_FILTERS = ("state", "profile_id", "client_key_id", "created_after", "created_before", "id_prefix")


def list_sessions(api: AdminApi, args: argparse.Namespace) -> None:
    filters = {name: getattr(args, name) for name in SESSION_FILTERS if getattr(args, name)}
    listing(api, args, "/sessions", SESSION_COLUMNS, "no sessions found", filters)


def list_events(api: AdminApi, args: argparse.Namespace) -> None:
    listing(api, args, f"/sessions/{args.session_id}/events", EVENT_COLUMNS, "no events found")


def day_or_time(text: str) -> str:
    """--closed-before, --created-after/-before: a UTC day (YYYY-MM-DD, its start) or a whole RFC 3339
    time, sent as given."""
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        return f"{text}T00:00:00Z"
    return text


def delete_session(api: AdminApi, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/sessions/{args.id}", expect_body=False)
    print(f"deleted session {args.id}")


def export_session(api: AdminApi, args: argparse.Namespace) -> None:
    """The NDJSON export to a file (written whole, then renamed into place) or to stdout."""
    path = f"/sessions/{args.id}/export"
    if args.output in (None, "-"):
        api.stream_to(path, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return
    partial = f"{args.output}.partial"
    try:
        with open(partial, "wb") as out:
            api.stream_to(path, out)
        os.replace(partial, args.output)
    except OSError as exc:
        raise CtlError(f"cannot write {args.output}: {exc.strerror}") from None
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    print(f"exported session {args.id} to {args.output}", file=sys.stderr)


def import_session(api: AdminApi, args: argparse.Namespace) -> None:
    try:
        with open(args.file, "rb") as body:
            reply = _object(api.upload("/sessions/import", body, "application/x-ndjson"))
    except OSError as exc:
        raise CtlError(f"cannot read {args.file}: {exc.strerror}") from None
    _emit(args, reply, f"imported session {reply.get('id')} ({reply.get('events')} events, {reply.get('state')})")


def purge_sessions(api: AdminApi, args: argparse.Namespace) -> None:
    """Every closed or error session closed before the date; the server deletes a batch per call."""
    body = {"closed_before": args.closed_before, "dry_run": args.dry_run}
    ids: list[str] = []
    while True:
        reply = _object(api.call("POST", "/sessions/purge", body=body))
        batch = reply.get("ids")
        ids += batch if isinstance(batch, list) else []
        if args.dry_run or not reply.get("more") or not batch:
            break
    more = bool(args.dry_run and reply.get("more"))
    if args.json:
        print(as_json({"dry_run": args.dry_run, "sessions": len(ids), "ids": ids, "more": more}))
        return
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(ids)} session(s)" + (" (more match; the first 1000 are listed)" if more else ""))
    for session_id in ids:
        print(f"  {session_id}")


# --- usage ------------------------------------------------------------------------------------------

def usage(api: AdminApi, args: argparse.Namespace) -> None:
    """Usage totals per client key, profile or UTC day (GET /admin/v1/usage), listed as every list is."""
    params = {"group_by": args.group_by, **({"since": args.since} if args.since else {}),
              **({"until": args.until} if args.until else {})}
    listing(api, args, "/usage", [USAGE_GROUPS[args.group_by], *USAGE_COLUMNS], "no usage recorded", params)


# --- the web console -----------------------------------------------------------------------------

def console(api: AdminApi, args: argparse.Namespace) -> None:
    """A one-time sign-in link to the web console: the console's URL with the link in its fragment,
    which the browser never sends to a server (docs/console.md)."""
    reply = _object(api.call("POST", "/console-links"))
    link = reply.get("link")
    if not isinstance(link, str):
        raise CtlError(UNEXPECTED)
    url = f"{api.base}/console/#link={link}"
    _emit(args, {**reply, "url": url}, url)
    if not args.json:
        print(f"baectl: open it within 60 s (until {reply.get('expires_at')}); it signs one browser in, once",
              file=sys.stderr)


# --- registries, config, sandbox images ----------------------------------------------------------

def _registry(api: AdminApi, args: argparse.Namespace, path: str, columns: list[tuple[str, str]],
              empty: str) -> None:
    reply = _object(api.call("GET", path))
    items = reply.get("items")
    if not isinstance(items, list):
        raise CtlError(UNEXPECTED)
    _emit(args, reply, table(items, columns) if items else empty)


def providers(api: AdminApi, args: argparse.Namespace) -> None:
    _registry(api, args, "/providers", PROVIDER_COLUMNS, "no providers configured")


def mcp_servers(api: AdminApi, args: argparse.Namespace) -> None:
    _registry(api, args, "/mcp-servers", MCP_COLUMNS, "no MCP servers configured")


def config(api: AdminApi, args: argparse.Namespace) -> None:
    """The server's loaded bae-config.toml, secrets redacted; JSON is its only sensible layout."""
    print(as_json(_object(api.call("GET", "/config"))))


def image_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    items = status.get("items")
    if not isinstance(items, list):
        raise CtlError(UNEXPECTED)
    return [{**image, "profile_id": item.get("profile_id")}
            for item in items if isinstance(item, dict)
            for image in item.get("images") or [] if isinstance(image, dict)]


def sandbox_status(api: AdminApi, args: argparse.Namespace) -> int:
    """Each profile's sandbox images. --watch redraws until none is pending; exit 1 if any failed."""
    shown = None
    while True:
        status = _object(api.call("GET", "/sandbox-status"))
        rows = image_rows(status)
        view = as_json(status) if args.json else table(rows, IMAGE_COLUMNS) if rows else "no sandbox images"
        pending = sum(1 for row in rows if row.get("status") == "pending")
        if not args.watch:
            print(view)
            return 0
        if view != shown:
            if sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")  # redraw in place on a terminal; append in a log
            print(view, flush=True)
            shown = view
        if pending == 0:
            break
        time.sleep(args.interval)
    failed = sum(1 for row in rows if row.get("status") == "error")
    if failed:
        print(f"baectl: {failed} sandbox image(s) failed to provision", file=sys.stderr)
        return 1
    return 0
