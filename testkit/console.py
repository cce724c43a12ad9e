"""The web console (docs/console.md) in a headless Chromium page, for the browser tests.

`ConsolePage` opens the console of a running stack, signs in as a person does (the admin key typed
into the sign-in form, from the stack's admin key file), and records every request the page makes
and the size of every answer, so that a test can check that nothing leaves the admin origin and
what the page's loads weigh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from testkit.browser import wait_for

if TYPE_CHECKING:
    from playwright.sync_api import Page, Request, Response

    from testkit.stack import StackClients


class ConsolePage:
    """`page` showing the console of `stack`'s admin port; recording starts at once, before any load."""

    def __init__(self, page: "Page", stack: "StackClients") -> None:
        self.page = page
        self.stack = stack
        self.origin = stack.admin_url.rstrip("/")
        self.requests: list[str] = []  # every URL the page asked for, in order
        self.responses: list["Response"] = []
        page.on("request", self._requested)
        page.on("response", self._answered)

    def _requested(self, request: "Request") -> None:
        self.requests.append(request.url)

    def _answered(self, response: "Response") -> None:
        self.responses.append(response)

    def open(self, fragment: str = "#/sessions") -> None:
        """Load the console's page at `fragment` (a route such as #/sessions/ses_…)."""
        self.page.goto(f"{self.origin}/console/{fragment}")

    def sign_in(self, key: str | None = None) -> None:
        """Type `key` (default: the stack's admin key) into the sign-in form and wait for the nav."""
        self.submit_key(self.stack.admin_key if key is None else key)
        self.page.wait_for_selector("#nav", state="visible")

    def submit_key(self, key: str) -> None:
        """Type `key` into the sign-in form and send it; what follows is the caller's to wait for."""
        self.page.wait_for_selector("#admin-token")
        self.page.fill("#admin-token", key)
        self.page.click("#sign-in button[type=submit]")

    def open_signed_in(self, fragment: str = "#/sessions") -> None:
        self.open(fragment)
        self.sign_in()

    def wait_for(self, expression: str, shown: str = "main") -> None:
        """Wait until the JavaScript `expression` holds; on a timeout the test fails saying what `shown` held.

        It is sent as a function: the console's policy forbids eval, which a bare expression would need
        once it is polled."""
        wait_for(self.page, f"() => ({expression})", shown)

    def event_ids(self) -> list[str]:
        """The ids of the events the session page shows, in the page's order."""
        return self.page.eval_on_selector_all("[data-event-id]", "rows => rows.map(row => row.dataset.eventId)")

    def wait_for_events(self, count: int) -> None:
        """Wait until the session page shows at least `count` events."""
        self.wait_for(f"document.querySelectorAll('[data-event-id]').length >= {count}", "#turns")

    def wait_for_event(self, event_id: str) -> None:
        self.wait_for(f"document.querySelector('[data-event-id=\"{event_id}\"]') !== null", "#turns")

    def wait_for_stream(self, state: str) -> None:
        """Wait until the session page's event stream is in `state` ("live", "ended", ...)."""
        self.wait_for(f"document.getElementById('stream-state')?.dataset.state === {state!r}", "#stream-state")

    def foreign_requests(self) -> list[str]:
        """The requests that went anywhere but the admin port's origin."""
        return [url for url in self.requests if not url.startswith(f"{self.origin}/")]

    def wire_bytes(self, resource_types: set[str]) -> int:
        """Bytes over the wire (headers and body as sent) of the answers to requests of these types
        ("document", "script", "stylesheet", ...) so far."""
        total = 0
        for response in self.responses:
            if response.request.resource_type in resource_types:
                sizes = response.request.sizes()
                total += sizes["responseHeadersSize"] + sizes["responseBodySize"]
        return total
