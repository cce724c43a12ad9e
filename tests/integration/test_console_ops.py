"""The console's operations pages in headless Chromium, against a real stack, signed in with the admin key.

Keys: a new key's plaintext is shown once and works against the client API, and a reload no longer
shows it; revoking counts the key's open sessions before the operator confirms, then closes them.
Profiles: an edit with an invalid field shows the server's own detail and changes nothing.
CSRF: a mutation the page makes without its X-CSRF-Token header is refused, with it accepted.
Usage: a turn's tokens, as the mock provider reported them, appear in the chart and the tables.
Schedules and webhooks: created through their JSON forms and listed; a webhook's secret is shown once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import date, timedelta
from typing import TYPE_CHECKING

import pytest

from testkit.browser import wait_for
from testkit.console import ConsolePage
from testkit.live import register, send, terminal
from testkit.mockllm import MockLLM, Reply
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.stack, pytest.mark.browser]

# The webhook test's receiver address: allowed, and nothing listens on the discard port.
HOOK_URL = "http://127.0.0.1:9/console-test"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, mock: MockLLM) -> Iterator[RunningStack]:
    config = mock_provider_toml(mock.base_url) + '[webhooks]\nallow_hosts = ["127.0.0.1"]\n'
    running = launch_stack(tmp_path_factory.mktemp("console-ops"), config, MOCK_LLM_TOKEN="sk-console-ops")
    yield running
    running.close()


def sign_in(page: "Page", stack: RunningStack, route: str) -> None:
    """Open the console at `route` (e.g. "#/keys") and sign in with the admin key."""
    ConsolePage(page, stack).open_signed_in(route)


def shown(page: "Page", selector: str) -> str:
    """The text of `selector` once it is there (a wait on the page's own answer, never a sleep)."""
    page.wait_for_selector(selector)
    return page.text_content(selector) or ""


def session_state(stack: RunningStack, session_id: str) -> str:
    answer = stack.admin.get(f"/admin/v1/sessions/{session_id}")
    assert answer.status_code == 200, answer.text
    return str(answer.json()["state"])


def test_a_new_key_is_shown_once_and_works_and_a_reload_no_longer_shows_it(stack, browser_page):
    profile = stack.create_profile("keys-once")
    sign_in(browser_page, stack, "#/keys")
    browser_page.fill("#key-name", "shown-once")
    browser_page.select_option("#key-profile", profile["id"])
    browser_page.click("#new-key button[type=submit]")
    plaintext = shown(browser_page, "#secret-value")
    assert plaintext.startswith("bae_")
    assert "will not be shown again" in shown(browser_page, "#secret-box")
    browser_page.click("#copy-secret")
    wait_for(browser_page, "() => document.querySelector('#secret-box [role=status]').textContent !== ''", "#secret-box")

    # It is a working client key of that profile.
    opened = stack.open_session(plaintext)
    assert session_state(stack, opened["session_id"]) == "open"

    # After a reload the key is listed, by its prefix only; its plaintext is nowhere on the page.
    browser_page.reload()
    wait_for(browser_page, "() => document.querySelector('table[aria-label=\"Client keys\"]')?.textContent.includes('shown-once')")
    assert browser_page.query_selector("#secret-box") is None
    assert plaintext not in browser_page.content()


def test_revoking_a_key_counts_its_open_sessions_before_confirming_then_closes_them(stack, browser_page):
    profile = stack.create_profile("keys-revoke")
    doomed = stack.create_key(profile["id"], name="doomed")
    kept = stack.create_key(profile["id"], name="kept")
    session = stack.open_session(doomed["key"])["session_id"]
    other = stack.open_session(kept["key"])["session_id"]

    sign_in(browser_page, stack, "#/keys")
    browser_page.get_by_role("button", name="Revoke doomed").click()
    # The cascade is said before anything happens: only that key's open session counts.
    assert shown(browser_page, "#cascade-count") == "1 open session will be closed."
    assert session in shown(browser_page, "#cascade")
    assert session_state(stack, session) == "open"

    browser_page.click("#confirm")
    assert "1 session was closed" in shown(browser_page, "#panel .ok")
    assert session_state(stack, session) == "closed"
    assert session_state(stack, other) == "open"
    listed = [key["id"] for key in stack.admin.get("/admin/v1/keys", params={"limit": 200}).json()["items"]]
    assert doomed["id"] not in listed and kept["id"] in listed


def test_an_invalid_profile_edit_shows_the_servers_error_and_changes_nothing(stack, browser_page):
    created = stack.create_profile("edit-me", allowed_tools=["get_time"])
    before = stack.admin.get(f"/admin/v1/profiles/{created['id']}").json()

    sign_in(browser_page, stack, "#/profiles")
    browser_page.get_by_role("button", name="Edit edit-me").click()
    browser_page.wait_for_selector("#json-body")
    # The form holds the profile as a PUT takes it: every field but the read-only ones.
    prefill = json.loads(browser_page.input_value("#json-body"))
    assert prefill == {k: v for k, v in before.items() if k not in ("id", "created_at", "updated_at")}

    body = {**prefill, "limits": {"burst": 0}}
    refused = stack.admin.put(f"/admin/v1/profiles/{created['id']}", json=body)
    assert refused.status_code == 400
    browser_page.fill("#json-body", json.dumps(body))
    browser_page.click("#json-form button[type=submit]")
    said = shown(browser_page, "#form-error [role=alert]")
    assert refused.json()["detail"] in said and "bad_request" in said
    assert browser_page.input_value("#json-body") == json.dumps(body)  # left as typed, to be fixed
    assert stack.admin.get(f"/admin/v1/profiles/{created['id']}").json() == before


def test_a_mutation_from_the_page_without_its_csrf_token_is_refused(stack, browser_page):
    sign_in(browser_page, stack, "#/profiles")
    browser_page.wait_for_selector("#new")
    bare = browser_page.evaluate(
        """async (url) => {
            const response = await fetch(url, {method: "POST", credentials: "same-origin",
                headers: {"Content-Type": "application/json"},
                body: JSON.stringify({name: "csrf-bare", primary_provider: "mock"})});
            return [response.status, (await response.json()).type];
        }""",
        f"{stack.admin_url}/admin/v1/profiles",
    )
    assert bare == [403, "csrf_token_invalid"]
    # The same request through the page's own helper, which adds the token, is accepted.
    created = browser_page.evaluate(
        """async () => {
            const { api } = await import("./static/js/api.js");
            return api("/admin/v1/profiles", {method: "POST", body: {name: "csrf-with-token", primary_provider: "mock"}});
        }"""
    )
    assert created["name"] == "csrf-with-token"
    names = [p["name"] for p in stack.admin.get("/admin/v1/profiles", params={"limit": 200}).json()["items"]]
    assert "csrf-with-token" in names and "csrf-bare" not in names


def test_the_usage_chart_and_tables_show_the_tokens_the_provider_reported(stack, mock, browser_page):
    profile = stack.create_profile("usage-counted")
    key = stack.create_key(profile["id"], name="usage-key")
    opened = stack.open_session(key["key"])
    mock.reset()
    mock.enqueue(Reply.text("counted", usage=(1234, 567)))
    register(stack, opened["session_id"], opened["session_key"])
    assert "result" in terminal(send(stack, opened["session_id"], opened["session_key"], "count me"))
    day = next(
        item["day"] for item in stack.admin.get("/admin/v1/usage", params={"group_by": "day"}).json()["items"]
        if item["input_tokens"] >= 1234
    )
    requests: list[str] = []
    browser_page.on("request", lambda request: requests.append(request.url))

    sign_in(browser_page, stack, "#/usage")
    browser_page.wait_for_selector("#usage-by-key")
    # The range ends on the turn's day, so that day is the chart's last point.
    browser_page.fill("#since", (date.fromisoformat(day) - timedelta(days=1)).isoformat())
    browser_page.fill("#until", day)
    browser_page.click("#usage-range button[type=submit]")
    wait_for(browser_page, f"() => document.querySelector('#usage-results h2')?.textContent.includes('to {day}')", "#usage-results")
    assert browser_page.query_selector("#usage-chart .uplot canvas") is not None

    [key_row] = [r for r in browser_page.query_selector_all("#usage-by-key tbody tr") if key["id"] in r.text_content()]
    assert [c.text_content() for c in key_row.query_selector_all("td")][:3] == [
        f"usage-key ({key['id']})", "1,234", "567"]
    [profile_row] = [r for r in browser_page.query_selector_all("#usage-by-profile tbody tr")
                     if profile["id"] in r.text_content()]
    assert [c.text_content() for c in profile_row.query_selector_all("td")][1:3] == ["1,234", "567"]
    day_totals = stack.admin.get("/admin/v1/usage", params={"group_by": "day", "since": day, "until": day}).json()
    [day_row] = browser_page.query_selector_all("#usage-by-day tbody tr")
    assert [c.text_content() for c in day_row.query_selector_all("td")][:3] == [
        day, f"{day_totals['items'][0]['input_tokens']:,}", f"{day_totals['items'][0]['output_tokens']:,}"]

    # The chart holds the same numbers: its legend reads them at the last point under the cursor.
    over = browser_page.locator("#usage-chart .u-over")
    box = over.bounding_box()
    assert box is not None
    over.hover(position={"x": box["width"] - 1, "y": box["height"] / 2})
    legend = f"{day_totals['items'][0]['input_tokens']:,}"
    wait_for(browser_page, f"() => [...document.querySelectorAll('#usage-chart .u-legend .u-value')].some(v => v.textContent === '{legend}')",
             "#usage-chart")
    # Everything the page loaded (the chart library included) came from the server's own origin.
    assert requests and all(url.startswith(f"{stack.admin_url}/") for url in requests), requests


def test_a_schedule_created_through_its_form_is_listed(stack, browser_page):
    profile = stack.create_profile("scheduled")
    key = stack.create_key(profile["id"], name="scheduler")
    sign_in(browser_page, stack, "#/schedules")
    browser_page.click("#new")
    browser_page.wait_for_selector("#json-body")
    template = json.loads(browser_page.input_value("#json-body"))
    # A yearly schedule: it fires nothing while the module runs.
    body = {**template, "name": "yearly-report", "profile_id": profile["id"], "client_key_id": key["id"],
            "cron": "0 0 1 1 *", "message": "write the yearly report"}
    browser_page.fill("#json-body", json.dumps({**body, "cron": "0 0 1 1"}))
    browser_page.click("#json-form button[type=submit]")
    assert "expected 5 fields" in shown(browser_page, "#form-error [role=alert]")

    browser_page.fill("#json-body", json.dumps(body))
    browser_page.click("#json-form button[type=submit]")
    assert "Created schedule yearly-report" in shown(browser_page, "#panel .ok")
    wait_for(browser_page, "() => document.querySelector('table[aria-label=\"Schedules\"]')?.textContent.includes('yearly-report')")
    [listed] = [s for s in stack.admin.get("/admin/v1/schedules").json()["items"] if s["name"] == "yearly-report"]
    assert {k: listed[k] for k in body} == body

    browser_page.get_by_role("button", name="Runs of yearly-report").click()
    # The panel still shows the creation's message until the runs arrive: wait for them, not the panel.
    wait_for(browser_page, "() => document.querySelector('#panel')?.textContent.includes('No runs yet.')", "#panel")


def test_a_webhook_created_through_its_form_shows_its_secret_once(stack, browser_page):
    # Its own profile, which has no sessions: nothing is delivered to the address nobody listens on.
    profile = stack.create_profile("hooked")
    sign_in(browser_page, stack, "#/webhooks")
    browser_page.click("#new")
    browser_page.wait_for_selector("#json-body")
    browser_page.fill("#json-body", json.dumps({"url": HOOK_URL, "event_types": ["session.close"],
                                                "profile_id": profile["id"]}))
    browser_page.click("#json-form button[type=submit]")
    secret = shown(browser_page, "#secret-value")
    assert secret.startswith("whsec_")
    assert f"Created webhook {HOOK_URL}" in shown(browser_page, "#panel .ok")
    wait_for(browser_page, f"() => document.querySelector('table[aria-label=\"Webhooks\"]')?.textContent.includes('{HOOK_URL}')")
    [hook] = [w for w in stack.admin.get("/admin/v1/webhooks").json()["items"] if w["url"] == HOOK_URL]
    assert "secret" not in hook

    browser_page.reload()
    wait_for(browser_page, f"() => document.querySelector('table[aria-label=\"Webhooks\"]')?.textContent.includes('{HOOK_URL}')")
    assert secret not in browser_page.content()
    browser_page.get_by_role("button", name=f"Deliveries of {HOOK_URL}").click()
    wait_for(browser_page, "() => document.querySelector('#panel')?.textContent.includes('No deliveries in the log.')",
             "#panel")
