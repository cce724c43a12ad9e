"""The web console's sign-in through the gateway, on the service processes (docs/console.md): the cookie
and its attributes, the admin API with the cookie and the CSRF token, sign-out, BAE_CONSOLE=0, and the
tokens kept out of every log."""

from __future__ import annotations

import json
import time
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from testkit.stack import RunningStack, launch_stack
from tests.integration.test_ctl import baectl, fails, ok

pytestmark = pytest.mark.stack

COOKIE = "bae_console"


def keeps_no_cookie() -> CookieJar:
    return CookieJar(DefaultCookiePolicy(allowed_domains=[]))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = launch_stack(tmp_path_factory.mktemp("console-auth"))
    yield running
    running.close()


@pytest.fixture
def browser(stack: RunningStack) -> Iterator[httpx.Client]:
    """The admin port as the console's page reaches it: no Authorization header; the cookie is sent by hand
    (the client keeps none)."""
    with httpx.Client(base_url=stack.admin_url, timeout=30, cookies=keeps_no_cookie()) as client:
        yield client


def set_cookie_of(response: httpx.Response) -> dict[str, str]:
    """The response's bae_console Set-Cookie header: its value under COOKIE, and each attribute."""
    [header] = [value for name, value in response.headers.multi_items() if name == "set-cookie"]
    first, *attributes = [part.strip() for part in header.split(";")]
    name, _, value = first.partition("=")
    assert name == COOKIE
    return {COOKIE: value, **{a.partition("=")[0]: a.partition("=")[2] for a in attributes}}


def sign_in(browser: httpx.Client, token: str) -> tuple[str, str]:
    """Sign in with an admin key: the cookie's value and the CSRF token."""
    response = browser.post("/console/sign-in", json={"token": token})
    assert response.status_code == 200, response.text
    return set_cookie_of(response)[COOKIE], response.json()["csrf_token"]


def with_cookie(cookie: str, csrf: str | None = None) -> dict[str, str]:
    headers = {"cookie": f"{COOKIE}={cookie}"}
    if csrf is not None:
        headers["x-csrf-token"] = csrf
    return headers


def profile_names(stack: RunningStack) -> list[str]:
    return [p["name"] for p in stack.admin.get("/admin/v1/profiles").json()["items"]]


def test_sign_in_sets_the_session_cookie(stack, browser):
    response = browser.post("/console/sign-in", json={"token": stack.admin_key})
    assert response.status_code == 200, response.text
    cookie = set_cookie_of(response)
    assert cookie[COOKIE].startswith("bcs_")
    assert {name: cookie[name] for name in ("HttpOnly", "SameSite", "Path", "Max-Age")} == {
        "HttpOnly": "", "SameSite": "Strict", "Path": "/", "Max-Age": "43200",
    }
    assert "Secure" not in cookie  # plain http
    body = response.json()
    assert set(body) == {"csrf_token", "expires_at"} and body["csrf_token"]
    assert response.headers["cache-control"] == "no-store"

    session = browser.get("/console/session", headers=with_cookie(cookie[COOKIE]))
    assert session.status_code == 200 and session.json() == body


def test_a_wrong_token_is_refused_without_a_cookie(stack, browser):
    for token in ("bae_admin_" + "0" * 48, "nonsense"):
        response = browser.post("/console/sign-in", json={"token": token})
        assert response.status_code == 401 and response.json()["type"] == "unauthorized"
        assert "set-cookie" not in response.headers
    assert browser.post("/console/sign-in", json={"token": ""}).json()["detail"] == "token must not be empty"
    assert browser.post("/console/sign-in", json={}).status_code == 400
    assert browser.post("/console/sign-in", content=b"{", headers={"content-type": "application/json"}).status_code == 400
    too_large = browser.post("/console/sign-in", json={"token": "x" * 5000})
    assert too_large.status_code == 413 and too_large.json()["type"] == "payload_too_large"
    assert browser.get("/console/session").status_code == 401
    assert browser.get("/console/session", headers=with_cookie("bcs_" + "0" * 48)).status_code == 401
    assert browser.get("/console/sign-in").status_code == 405


def test_the_admin_api_takes_the_cookie_and_mutations_need_the_csrf_token(stack, browser):
    cookie, csrf = sign_in(browser, stack.admin_key)
    listed = browser.get("/admin/v1/profiles", headers=with_cookie(cookie))
    assert listed.status_code == 200 and "items" in listed.json()
    assert browser.get("/admin/v1/profiles").status_code == 401  # neither header nor cookie

    body = {"name": "console-made", "primary_provider": "mock"}
    for csrf_header in (None, "", "wrong", csrf[:-1]):
        refused = browser.post("/admin/v1/profiles", json=body, headers=with_cookie(cookie, csrf_header))
        assert refused.status_code == 403 and refused.json()["type"] == "csrf_token_invalid", refused.text
    assert "console-made" not in profile_names(stack)

    created = browser.post("/admin/v1/profiles", json=body, headers=with_cookie(cookie, csrf))
    assert created.status_code == 201, created.text
    assert "console-made" in profile_names(stack)
    # Another session's token is not this one's.
    _, other_csrf = sign_in(browser, stack.admin_key)
    assert browser.delete(f"/admin/v1/profiles/{created.json()['id']}",
                          headers=with_cookie(cookie, other_csrf)).status_code == 403
    assert browser.delete(f"/admin/v1/profiles/{created.json()['id']}",
                          headers=with_cookie(cookie, csrf)).status_code == 204
    # An Authorization header wins over the cookie, and needs no CSRF token.
    wrong_key = {**with_cookie(cookie), "authorization": "Bearer bae_admin_" + "0" * 48}
    assert browser.get("/admin/v1/profiles", headers=wrong_key).status_code == 401
    admin = {**with_cookie("bcs_" + "0" * 48), "authorization": f"Bearer {stack.admin_key}"}
    assert browser.post("/admin/v1/profiles", json={"name": "by-key", "primary_provider": "mock"},
                        headers=admin).status_code == 201


def test_sign_out_ends_the_session(stack, browser):
    cookie, csrf = sign_in(browser, stack.admin_key)
    assert browser.post("/console/sign-out", headers=with_cookie(cookie)).json()["type"] == "csrf_token_invalid"
    assert browser.get("/admin/v1/profiles", headers=with_cookie(cookie)).status_code == 200
    signed_out = browser.post("/console/sign-out", headers=with_cookie(cookie, csrf))
    assert signed_out.status_code == 204
    cleared = set_cookie_of(signed_out)
    assert (cleared[COOKIE], cleared["Max-Age"], cleared["Path"]) == ("", "0", "/")
    refused = browser.get("/admin/v1/profiles", headers=with_cookie(cookie))
    assert refused.status_code == 401 and refused.json()["type"] == "unauthorized"
    # A mutation with the ended session's cookie is 401 too, with or without its token.
    for csrf_header in (csrf, None):
        response = browser.post("/admin/v1/profiles", json={"name": "late", "primary_provider": "mock"},
                                headers=with_cookie(cookie, csrf_header))
        assert response.status_code == 401
    gone = browser.get("/console/session", headers=with_cookie(cookie))
    assert gone.status_code == 401 and set_cookie_of(gone)["Max-Age"] == "0"
    assert browser.post("/console/sign-out").status_code == 401


def test_the_event_stream_takes_the_cookie(stack, browser):
    cookie, _ = sign_in(browser, stack.admin_key)
    missing = browser.get("/admin/v1/sessions/ses_missing/events/stream", headers=with_cookie(cookie))
    assert missing.status_code == 404
    assert browser.get("/admin/v1/sessions/ses_missing/events/stream").status_code == 401


def test_no_token_reaches_the_logs(stack, browser):
    cookie, csrf = sign_in(browser, stack.admin_key)
    browser.get("/admin/v1/profiles", headers=with_cookie(cookie))
    browser.post("/admin/v1/profiles", json={"name": "logged", "primary_provider": "mock"},
                 headers=with_cookie(cookie, csrf))
    browser.post("/console/sign-in", json={"token": "bae_admin_wrong_guess_" + "1" * 30})
    browser.post("/console/sign-out", headers=with_cookie(cookie, csrf))
    logs = "".join(path.read_text() for path in sorted(Path(stack.tmp, "logs").glob("*.log")))
    assert "access" in logs  # the access lines are there
    for secret in (cookie, csrf, stack.admin_key, "bae_admin_wrong_guess_"):
        assert secret not in logs


def test_bae_console_0_leaves_the_console_out(tmp_path):
    stack = launch_stack(tmp_path, BAE_CONSOLE="0")
    try:
        with httpx.Client(base_url=stack.admin_url, timeout=30, cookies=keeps_no_cookie()) as browser:
            for path in ("/console/", "/console/session"):
                assert browser.get(path).status_code == 404
            assert browser.post("/console/sign-in", json={"token": stack.admin_key}).status_code == 404
            # The cookie means nothing to the admin API either.
            assert browser.get("/admin/v1/profiles", headers=with_cookie("bcs_" + "0" * 48)).status_code == 401
    finally:
        stack.close()


def test_a_sign_in_link_works_once(stack, browser):
    made = stack.admin.post("/admin/v1/console-links")
    assert made.status_code == 201, made.text
    link = made.json()["link"]
    assert link.startswith("bcl_") and set(made.json()) == {"link", "expires_at"}
    exchanged = browser.post("/console/sign-in/link", json={"link": link})
    assert exchanged.status_code == 200, exchanged.text
    cookie = set_cookie_of(exchanged)
    assert (cookie["SameSite"], cookie["Max-Age"]) == ("Strict", "43200")
    assert browser.get("/admin/v1/profiles", headers=with_cookie(cookie[COOKIE])).status_code == 200
    again = browser.post("/console/sign-in/link", json={"link": link})
    assert again.status_code == 401 and "set-cookie" not in again.headers
    assert browser.post("/console/sign-in/link", json={"link": "bcl_" + "0" * 48}).status_code == 401
    assert browser.post("/console/sign-in/link", json={"link": ""}).json()["detail"] == "link must not be empty"
    # A console session may make a link too (with its CSRF token), for the admin key it was signed in with.
    csrf = exchanged.json()["csrf_token"]
    by_console = browser.post("/admin/v1/console-links", headers=with_cookie(cookie[COOKIE], csrf))
    assert by_console.status_code == 201
    assert browser.post("/console/sign-in/link", json={"link": by_console.json()["link"]}).status_code == 200


def test_baectl_console_prints_a_link_that_works_once(stack, browser):
    printed = ok(baectl(stack, "console"))
    prefix = f"{stack.admin_url}/console/#link="
    assert printed.startswith(prefix) and printed.count("\n") == 1
    link = printed.strip().removeprefix(prefix)
    assert link.startswith("bcl_")
    assert browser.post("/console/sign-in/link", json={"link": link}).status_code == 200
    assert browser.post("/console/sign-in/link", json={"link": link}).status_code == 401
    as_json = json.loads(ok(baectl(stack, "console", "--json")))
    assert set(as_json) == {"link", "expires_at", "url"} and as_json["url"] == prefix + as_json["link"]
    assert "no valid admin token" in fails(baectl(stack, "console", BAE_ADMIN_TOKEN="bae_admin_" + "0" * 48))


def after_restart(request) -> httpx.Response:
    """`request()` once the gateway reaches the restarted session service again (503 until then)."""
    deadline = time.monotonic() + 30
    while (response := request()).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.2)
    return response


def test_rotating_the_admin_key_and_the_auth_switch_end_console_sessions(tmp_path):
    stack = launch_stack(tmp_path)
    try:
        with httpx.Client(base_url=stack.admin_url, timeout=30, cookies=keeps_no_cookie()) as browser:
            cookie, _ = sign_in(browser, stack.admin_key)
            link = stack.admin.post("/admin/v1/console-links").json()["link"]
            stack.stack.session_args = ["--rotate-admin-key"]
            stack.stack.restart("session")
            refused = after_restart(lambda: browser.get("/admin/v1/profiles", headers=with_cookie(cookie)))
            assert refused.status_code == 401
            assert browser.get("/console/session", headers=with_cookie(cookie)).status_code == 401
            assert browser.post("/console/sign-in/link", json={"link": link}).status_code == 401
            new_key = Path(stack.settings.admin_key_file).read_text().strip()
            assert browser.post("/console/sign-in", json={"token": stack.admin_key}).status_code == 401
            cookie, _ = sign_in(browser, new_key)
            assert browser.get("/admin/v1/profiles", headers=with_cookie(cookie)).status_code == 200

            # Without admin auth any token signs in; such a session ends when admin auth is back.
            stack.stack.session_args = ["--dangerously-disable-admin-auth"]
            stack.stack.restart("session")
            after_restart(lambda: browser.get("/console/session", headers=with_cookie(cookie)))
            unguarded, _ = sign_in(browser, "anything")
            assert browser.get("/admin/v1/profiles", headers=with_cookie(unguarded)).status_code == 200
            assert browser.get("/console/session", headers=with_cookie(unguarded)).status_code == 200
            stack.stack.session_args = []
            stack.stack.restart("session")
            refused = after_restart(lambda: browser.get("/console/session", headers=with_cookie(unguarded)))
            assert refused.status_code == 401
            assert browser.get("/admin/v1/profiles", headers=with_cookie(unguarded)).status_code == 401
            assert browser.get("/admin/v1/profiles", headers=with_cookie(cookie)).status_code == 200
    finally:
        stack.close()
