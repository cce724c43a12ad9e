"""The console's page signs in and out in headless Chromium (docs/console.md, "Signing in"): with the
admin key in its form, and with a `baectl console` link, which leaves the address bar at once; the
session survives a reload, sign-out ends it, and a wrong key leaves the form with the server's words."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import pytest

from testkit.stack import RunningStack, launch_stack
from tests.integration.test_ctl import baectl, ok

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.stack, pytest.mark.browser]



# The console's content security policy allows no eval: the page is watched through locators, not
# wait_for_function.
def signed_in(page: Page) -> None:
    from playwright.sync_api import expect

    expect(page.locator("#sign-in")).to_have_count(0)
    expect(page.locator("#nav")).to_be_visible()


def signed_out(page: Page) -> None:
    from playwright.sync_api import expect

    expect(page.locator("#sign-in")).to_be_visible()
    expect(page.locator("#nav")).to_be_hidden()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = launch_stack(tmp_path_factory.mktemp("console-browser"))
    yield running
    running.close()


def test_the_form_signs_in_and_sign_out_ends_the_session(stack, browser_page):
    page = browser_page
    page.goto(f"{stack.admin_url}/console/")
    signed_out(page)
    page.get_by_label("Admin key").fill("bae_admin_" + "0" * 48)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_text("invalid admin key").wait_for()

    page.get_by_label("Admin key").fill(stack.admin_key)
    page.get_by_role("button", name="Sign in").click()
    signed_in(page)
    [cookie] = page.context.cookies()
    assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == ("bae_console", True, "Strict", "/")
    assert stack.admin_key not in cookie["value"]

    page.reload()
    signed_in(page)  # GET /console/session finds it
    page.get_by_role("button", name="Sign out").click()
    signed_out(page)
    assert page.context.cookies() == []
    page.reload()
    signed_out(page)


def test_a_link_signs_in_once_and_leaves_the_address_bar(stack, browser_page):
    page = browser_page
    url = ok(baectl(stack, "console")).strip()
    page.goto(url)
    signed_in(page)
    assert "link=" not in page.url and page.url.endswith("/console/#/sessions")
    page.context.clear_cookies()
    page.goto(url)  # the same link again: used
    signed_out(page)
    assert "link=" not in page.url
    page.get_by_text("sign-in link is not valid").wait_for()
    page.goto(ok(baectl(stack, "console")).strip())  # a new link in the open console signs it in
    signed_in(page)
    assert "link=" not in page.url
