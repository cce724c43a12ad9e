"""Headless Chromium for the browser tests: Debian's `chromium` package, driven by Playwright.

Playwright's own browser builds are never used (`playwright install` downloads one): the tests
launch /usr/bin/chromium, which `.ci/run` installs with apt. Each page gets a browser of its own
on a fresh profile directory, so nothing (cache, preflight answers, storage) carries over between
tests.

Without chromium or the playwright package a browser test skips, saying why; when the `CI`
variable is set that is a failure instead, so CI always runs them.

`PageServer` serves a test's HTML document from a loopback port of its own: a page of another
origin than the gateway's client port, as a web UI is.
"""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")
# No GPU, no network of its own (updates, sync, QUIC probes): the page's requests are the only traffic.
ARGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
# Milliseconds Playwright waits for what a test asks (a selector, a function); a wait, not a measure.
TIMEOUT_MS = 60_000
# The console lines of each open page (console_of), by id(page).
_consoles: dict[int, list[str]] = {}


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"the browser tests must run in CI (CI is set), but {reason}")
    pytest.skip(f"no browser for this test: {reason}")


def require_browser() -> None:
    """Skip the test (fail it under CI) unless chromium and playwright are installed.

    tests/conftest.py calls it before a `browser` test's fixtures start anything."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("the playwright package is not installed (make venv installs it)")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")


@contextmanager
def chromium_page(profile: Path) -> Iterator["Page"]:
    """A page of a headless Chromium whose profile lives in `profile` (a new directory)."""
    require_browser()
    from playwright.sync_api import sync_playwright

    # Chromium refuses to run as root with its sandbox on, and CI runs the tests as root.
    args = [*ARGS, "--no-sandbox"] if os.geteuid() == 0 else ARGS
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=args,
        )
        try:
            context.set_default_timeout(TIMEOUT_MS)
            page = context.pages[0] if context.pages else context.new_page()
            console = _consoles[id(page)] = []
            page.on("console", lambda message: console.append(message.text))
            try:
                yield page
            finally:
                del _consoles[id(page)]
        finally:
            context.close()


def console_of(page: "Page") -> list[str]:
    """What `page` wrote to its console so far (its script's logs, the browser's CORS refusals)."""
    return _consoles[id(page)]


def wait_for(page: "Page", expression: str, shown: str = "body") -> None:
    """Wait until the JavaScript `expression` is true in `page`; else fail the test with what the
    element `shown` (a selector) holds and what the page logged."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(expression)
    except PlaywrightTimeout:
        pytest.fail(f"never true: {expression}; {shown} holds {page.text_content(shown)!r}; "
                    f"console: {console_of(page)}")


class PageServer:
    """One HTML document served at `/` from a loopback port of its own (`url`, `origin`).

    The port is bound at once, so that the origin can be configured before the document (which may
    need what the stack started with it gives) is set in `html`."""

    def __init__(self, html: str = "") -> None:
        self.html = html
        served = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                # A query string is for the page's script: the document is the same.
                if self.path.split("?")[0] != "/":
                    self.send_error(404)
                    return
                body = served.html.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # the test's output is the assertions'

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.url = f"{self.origin}/"
        self._thread = threading.Thread(target=self._server.serve_forever, name="page-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> "PageServer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
