"""The console's shell: behind a reverse proxy that serves the admin port under a path prefix
(BAE_CONSOLE_PREFIX), and driven from the keyboard alone.

The proxy (testkit/prefix_proxy.py) strips `/bae` on the way in, rewrites nothing on the way out,
and answers 404 outside the prefix: the page works only if every link, request, event stream and
the cookie's path carry the prefix, which the gateway learns from BAE_CONSOLE_PREFIX alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.console import ConsolePage
from testkit.live import all_events, new_session, register, result, send
from testkit.mockllm import MockLLM, Reply
from testkit.prefix_proxy import prefix_proxy
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.browser]

PREFIX = "/bae"
TOKEN = "sk-test-console-prefix"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, mock: MockLLM) -> Iterator[RunningStack]:
    running = launch_stack(tmp_path_factory.mktemp("console-prefix"), mock_provider_toml(mock.base_url),
                           MOCK_LLM_TOKEN=TOKEN, BAE_CONSOLE_PREFIX=PREFIX)
    yield running
    running.close()


@pytest.fixture
def proxied(stack: RunningStack) -> Iterator[str]:
    """The proxy's URL of the admin port: `<proxy origin>/bae`."""
    with prefix_proxy(PREFIX, stack.admin_url) as origin:
        yield origin + PREFIX


def test_the_console_works_under_the_proxy_prefix(browser_page, stack, proxied, mock):
    console = ConsolePage(browser_page, stack)
    console.origin = proxied  # every request the page makes must go through the prefix
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)

    console.open_signed_in()
    (cookie,) = [c for c in browser_page.context.cookies() if c["name"] == "bae_console"]
    assert cookie["path"] == f"{PREFIX}/"
    console.wait_for(f"document.querySelector('#session-results a[href=\"#/sessions/{sid}\"]') !== null",
                     "#session-results")

    # The session page follows a turn live through the proxy's event stream.
    console.page.click(f"#session-results a[href='#/sessions/{sid}']")
    console.wait_for_stream("live")
    mock.enqueue(Reply.text("through the proxy"))
    turn = result(send(stack, sid, skey, "hello"))
    console.wait_for_event(turn["events"][-1]["id"])
    assert console.event_ids() == [event["id"] for event in all_events(stack, sid, skey)]

    # A mutation carries its CSRF token through the proxy: a key made on the Keys page.
    profile = stack.create_profile("through-the-proxy")
    console.page.click("#nav a[href='#/keys']")
    console.page.fill("#key-name", "proxied")
    console.page.select_option("#key-profile", profile["id"])
    console.page.click("#new-key button[type=submit]")
    console.page.wait_for_selector("#secret-value")
    assert "proxied" in [key["name"] for key in stack.admin.get("/admin/v1/keys").json()["items"]]

    # Signing out ends the session the cookie held.
    console.page.click("#sign-out")
    console.page.wait_for_selector("#admin-token")
    assert console.foreign_requests() == []
    assert all(url.startswith(f"{proxied}/") for url in console.requests)


def focused(console: ConsolePage) -> str:
    """The focused element, as `tag#id` or `tag[href]`."""
    return console.page.evaluate(
        "() => { const e = document.activeElement; return e.tagName.toLowerCase() + "
        "(e.id ? '#' + e.id : e.getAttribute('href') ? '[' + e.getAttribute('href') + ']' : ''); }")


def tab_to(console: ConsolePage, target: str, limit: int = 30) -> None:
    for _ in range(limit):
        if focused(console) == target:
            return
        console.page.keyboard.press("Tab")
    raise AssertionError(f"{target} is not reachable with Tab; focus stayed at {focused(console)}")


def test_the_console_is_usable_from_the_keyboard(browser_page, stack, proxied):
    console = ConsolePage(browser_page, stack)
    console.origin = proxied
    console.open()
    # The sign-in form takes the focus; Enter sends it.
    console.page.wait_for_selector("#admin-token")
    assert focused(console) == "input#admin-token"
    console.page.keyboard.type(stack.admin_key)
    console.page.keyboard.press("Enter")
    console.page.wait_for_selector("#nav", state="visible")

    # Every section is a link in the tab order; following one moves the focus to the page's content.
    tab_to(console, "a[#/keys]")
    console.page.keyboard.press("Enter")
    console.page.wait_for_selector("#key-name")
    assert focused(console) == "main#main"
    tab_to(console, "input#key-name")
    tab_to(console, "button#sign-out")
    console.page.keyboard.press("Enter")
    console.page.wait_for_selector("#admin-token")
    assert console.foreign_requests() == []
