"""A first session without an API key: run `make demo` in one terminal, then this script in another.

    .venv/bin/python examples/first_session.py

It creates (once) a profile "demo" on the demo provider that allows the client
tool `get_current_time`, a client key for it, and then, as a client program
would, opens a session declaring that tool and runs two turns through
`bae_client`: an echo, and a client-tool round trip. The demo provider is a
scripted echo model, not an LLM: every answer starts with "[demo]".
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path

import httpx

from bae_client import Client, Event, Tool


@Tool.define(description="The current UTC time", input_schema={"type": "object", "properties": {}})
def get_current_time(arguments: dict) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print(f"  (client) running get_current_time({arguments}) -> {now}")
    return now


TOOL = get_current_time


def demo_profile(admin: httpx.Client) -> str:
    """The id of the profile "demo", created on first use."""
    body = {"name": "demo", "primary_provider": "demo", "allowed_tools": [TOOL.name]}
    created = admin.post("/admin/v1/profiles", json=body)
    if created.status_code == 201:
        return created.json()["id"]
    if created.json().get("type") != "duplicate_name":
        raise SystemExit(f"cannot create the demo profile: {created.text}")
    cursor = ""
    while True:  # it exists already: find it by name
        page = admin.get("/admin/v1/profiles", params={"cursor": cursor}).raise_for_status().json()
        for profile in page["items"]:
            if profile["name"] == "demo":
                return profile["id"]
        cursor = page["next_cursor"]
        if cursor is None:
            raise SystemExit('the profile "demo" was deleted; its name stays reserved: rename it in this script')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=f"http://{os.environ.get('BAE_ADDR') or '127.0.0.1:8080'}",
                        help="client API (default: http://$BAE_ADDR, or http://127.0.0.1:8080)")
    parser.add_argument("--admin-url", default=f"http://{os.environ.get('BAE_ADMIN_ADDR') or '127.0.0.1:8081'}",
                        help="admin API (default: http://$BAE_ADMIN_ADDR, or http://127.0.0.1:8081)")
    parser.add_argument("--admin-key-file", default=os.environ.get("BAE_ADMIN_KEY_FILE", "data/admin-key.pem"))
    args = parser.parse_args()

    admin_key = Path(args.admin_key_file).read_text().strip()
    with httpx.Client(base_url=args.admin_url, headers={"Authorization": f"Bearer {admin_key}"}) as admin:
        profile_id = demo_profile(admin)
        client_key = admin.post("/admin/v1/keys", json={"name": "first-session", "profile_id": profile_id}) \
            .raise_for_status().json()["key"]

    def show(event: Event) -> None:
        print(f"    · {event.event_type}")

    with Client(args.url, client_key=client_key) as bae:
        session = bae.open(tools=[TOOL], client_version="first-session/1")
        print(f"session {session.id}")
        for text in ("Hello, BAE!", f"What time is it? Please call {TOOL.name}."):
            print(f"you   > {text}")
            reply = session.send(text, on_event=show)
            print(f"model < {reply.text}")
        history = [event.event_type for event in session.all_events()]
        print(f"{len(history)} events recorded: {', '.join(history)}")
        session.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
