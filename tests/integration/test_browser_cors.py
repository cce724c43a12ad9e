"""A page in headless Chromium calls the client port from another origin, through CORS.

The page (served by the test on a loopback port of its own) reads a session's events with fetch()
and an `Authorization` header, which makes the browser send a preflight first; it writes what it
got into the DOM. From an origin BAE_CORS_ORIGINS does not list, the browser refuses the answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest

from testkit.browser import PageServer, console_of, wait_for
from testkit.live import new_session
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.browser]

# Reads the gateway's URL, a session id and a key from its query string, GETs the session's events
# and shows the status, the event types, the problem type of an error and the request id it could
# read (an exposed header), or the error fetch() failed with.
PAGE = """<!doctype html>
<meta charset="utf-8">
<title>events</title>
<pre id="out">waiting</pre>
<script>
const params = new URLSearchParams(location.search);
const out = document.getElementById("out");
fetch(`${params.get("gateway")}/api/v1/sessions/${params.get("session")}/events`, {
  headers: {Authorization: `Bearer ${params.get("key")}`},
}).then(async (response) => {
  const body = await response.json();
  const types = response.ok ? body.items.map((event) => event.event_type).join(",") : body.type;
  const requestId = response.headers.get("x-request-id") ? "request id read" : "no request id";
  out.textContent = JSON.stringify({status: response.status, types, requestId});
}).catch((error) => {
  out.textContent = JSON.stringify({failed: error.name});
});
</script>
"""


@pytest.fixture(scope="module")
def pages() -> Iterator[tuple[PageServer, PageServer]]:
    with PageServer(PAGE) as allowed, PageServer(PAGE) as other:
        yield allowed, other


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pages: tuple[PageServer, PageServer]) -> Iterator[RunningStack]:
    allowed, _ = pages
    running = launch_stack(tmp_path_factory.mktemp("browser-cors"), mock_provider_toml("http://127.0.0.1:9"),
                           BAE_CORS_ORIGINS=f"https://app.example.com,{allowed.origin}")
    yield running
    running.close()


def shown(page, server: PageServer, stack: RunningStack, sid: str, key: str) -> dict:
    """What the page served by `server` writes into its DOM once its fetch settled."""
    page.goto(f"{server.url}?{urlencode({'gateway': stack.client_url, 'session': sid, 'key': key})}")
    wait_for(page, "document.getElementById('out').textContent !== 'waiting'", "#out")
    return json.loads(page.text_content("#out"))


def test_a_page_of_an_allowed_origin_reads_a_sessions_events(stack, pages, browser_page):
    allowed, _ = pages
    sid, skey, _ = new_session(stack)
    assert shown(browser_page, allowed, stack, sid, skey) == {
        "status": 200, "types": "session.open", "requestId": "request id read",
    }
    # An error is readable too: the page learns why it was refused.
    assert shown(browser_page, allowed, stack, sid, "bae_ses_not-a-key") == {
        "status": 401, "types": "unauthorized", "requestId": "request id read",
    }


def test_a_page_of_another_origin_cannot_read_the_answer(stack, pages, browser_page):
    _, other = pages
    sid, skey, _ = new_session(stack)
    assert shown(browser_page, other, stack, sid, skey) == {"failed": "TypeError"}
    console = console_of(browser_page)
    assert any("blocked by CORS policy" in line for line in console), console
