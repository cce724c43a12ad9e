"""The console's Sessions list and Session page in headless Chromium, against a stack of service
processes (docs/console.md, "Sessions").

A person signs in with the admin key; the session page follows a session live while a client
drives it over HTTP (a client tool round trip, provider output streamed as deltas), reconnects
after its stream is cut (the session service restarted) and shows every event exactly once; the
page never asks anything of another origin, and its first load stays small.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from testkit import ROOT
from testkit.console import ConsolePage
from testkit.live import all_events, new_session, register, result, send, turn_in_background
from testkit.mockllm import MockLLM, Reply
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.browser]

TOKEN = "sk-test-console-sessions"
# The mock's entry has prices, so that the page has a cost to show (10 in + 5 out tokens a call).
PRICES = "price_input_per_mtok = 3.0\nprice_output_per_mtok = 15.0\n"
SCREENSHOT = ROOT / "artifacts" / "console-session.png"
FIRST_LOAD_BUDGET = 300 * 1024


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, mock: MockLLM) -> Iterator[RunningStack]:
    running = launch_stack(tmp_path_factory.mktemp("console-sessions"), mock_provider_toml(mock.base_url) + PRICES,
                           MOCK_LLM_TOKEN=TOKEN)
    yield running
    running.close()


@pytest.fixture
def console(browser_page, stack) -> Iterator[ConsolePage]:
    """The console in a fresh browser; every test ends checking that no request left the admin origin."""
    browser_page.set_viewport_size({"width": 1280, "height": 900})
    page = ConsolePage(browser_page, stack)
    yield page
    assert page.requests, "the page made no request"
    assert page.foreign_requests() == []


def usage_of(stack: RunningStack, sid: str, skey: str) -> dict:
    answer = stack.client.get(f"/api/v1/sessions/{sid}/usage", headers={"Authorization": f"Bearer {skey}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_signing_in_with_the_admin_key_and_a_wrong_key_stays_signed_out(console):
    console.open()
    console.submit_key("bae_admin_" + "0" * 40)
    console.page.wait_for_selector("#sign-in [role=alert]")
    assert console.page.is_hidden("#nav")
    assert console.page.is_visible("#admin-token")
    assert console.page.input_value("#admin-token") == ""  # the wrong key is not kept in the form

    console.sign_in()
    console.page.wait_for_selector("#session-filters")
    assert console.page.query_selector("#sign-in") is None
    # The cookie keeps the page signed in across a reload; the key itself is kept nowhere.
    console.page.reload()
    console.page.wait_for_selector("#session-filters")
    assert console.page.query_selector("#admin-token") is None


def test_the_list_filters_pages_and_links_to_each_session(console, stack):
    profile = stack.create_profile("console-list")
    key = stack.create_key(profile["id"], name="lister")
    opened = [stack.open_session(key["key"])["session_id"] for _ in range(53)]
    other_sid, _, _ = new_session(stack)

    console.open_signed_in()
    console.page.select_option("#filter-profile", profile["id"])
    console.page.click("#session-filters button[type=submit]")
    console.wait_for("location.hash.includes('profile_id=')")
    console.wait_for(f"document.querySelector('#session-results a[href=\"#/sessions/{opened[0]}\"]') !== null",
                     "#session-results")
    first = session_links(console)
    assert first == opened[:50] and other_sid not in first

    console.page.click("#sessions-next")
    console.wait_for(f"document.querySelector('#session-results a[href=\"#/sessions/{opened[50]}\"]') !== null",
                     "#session-results")
    assert session_links(console) == opened[50:]
    assert console.page.is_disabled("#sessions-next")
    console.page.click("#sessions-previous")
    console.wait_for(f"document.querySelector('#session-results a[href=\"#/sessions/{opened[0]}\"]') !== null",
                     "#session-results")
    assert session_links(console) == opened[:50]

    # A time range: created after a time to come matches none of them.
    console.page.fill("#filter-after", "2999-06-15T12:00:00")
    console.page.click("#session-filters button[type=submit]")
    console.wait_for("location.hash.includes('created_after=2999-06-15T')")
    console.wait_for("document.querySelector('#session-results')?.textContent.includes('No session matches')",
                     "#session-results")
    console.page.fill("#filter-after", "")

    # The filters are in the address: a reload keeps them, with the id prefix and the key added.
    console.page.fill("#filter-id", opened[52][:12])
    console.page.select_option("#filter-key", key["id"])
    console.page.click("#session-filters button[type=submit]")
    console.wait_for("location.hash.includes('id_prefix=')")
    console.page.reload()
    console.wait_for(f"document.querySelector('#session-results a[href=\"#/sessions/{opened[52]}\"]') !== null",
                     "#session-results")
    assert console.page.input_value("#filter-profile") == profile["id"]
    assert console.page.input_value("#filter-key") == key["id"]
    assert console.page.input_value("#filter-id") == opened[52][:12]
    assert opened[52] in session_links(console)

    console.page.click(f"#session-results a[href='#/sessions/{opened[52]}']")
    console.page.wait_for_selector("#session-state")
    assert console.page.text_content("h1") == f"Session {opened[52]}"


def session_links(console: ConsolePage) -> list[str]:
    return console.page.eval_on_selector_all("#session-results tbody a", "links => links.map(a => a.textContent)")


def test_the_session_page_shows_a_client_tool_turn_live(console, stack, mock):
    mock.reset()
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    console.open_signed_in(f"#/sessions/{sid}")
    console.wait_for_stream("live")
    console.wait_for_events(2)  # session.open, session.driver.register

    # Call 1: the provider writes a line, stops in the middle (the page shows the text so far, as
    # deltas), then asks for the client tool.
    resume = threading.Event()
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {})], text="Let me look at the clock.")
                 .streaming(pieces=["Let me look ", "at the clock."], pause_at=1, resume=resume))
    thread, outcome = turn_in_background(stack, sid, skey, "What time is it?", stream_deltas=True)
    console.wait_for("[...document.querySelectorAll('.live-call pre.delta')].some(p => p.textContent === 'Let me look ')",
                     "#turns")
    assert types_shown(console)[-2:] == ["client.message.send", "provider.request"]
    assert console.page.text_content("[data-turn='1'] .turn-status") == "running"
    resume.set()
    thread.join(30)
    first = result(outcome["frames"])
    assert first["message"]["content"][-1]["dispatch"] == "client"
    console.wait_for_event(first["events"][-1]["id"])
    console.wait_for("document.querySelector('[data-turn=\"1\"] .turn-status')?.textContent === 'waiting for client tools'",
                     "[data-turn='1']")
    assert console.page.query_selector(".live-call") is None  # the response replaced the deltas

    # Call 2: the client answers the tool over the RPC; the provider's answer is held until the
    # page has shown the tool's result, so that the page is seen following the turn as it runs.
    release = threading.Event()
    mock.enqueue(Reply.held(release, Reply.text("It is noon.")))
    thread, outcome = turn_in_background(stack, sid, skey, [{"type": "tool_result", "tool_use_id": "tu_1", "content": "12:00"}])
    # The tool's result and the provider call that follows it are two commits, so two frames.
    console.wait_for("[...document.querySelectorAll('[data-event-type]')].map(row => row.dataset.eventType)"
                     ".slice(-2).join() === 'tool.result,provider.request'", "#turns")
    assert console.page.text_content("[data-turn='1'] .turn-status") == "running"
    release.set()
    thread.join(30)
    second = result(outcome["frames"])
    console.wait_for_event(second["events"][-1]["id"])
    console.wait_for("document.querySelector('[data-turn=\"1\"] .turn-status')?.textContent === 'done'", "[data-turn='1']")

    events = all_events(stack, sid, skey)
    assert console.event_ids() == [event["id"] for event in events]
    assert console.page.query_selector("[data-turn='2']") is None  # the tool's results went on with turn 1
    # The waterfall: two provider calls and the client tool between them, each with its duration.
    rows = console.page.eval_on_selector_all(
        "[data-turn='1'] .wf-row",
        "rows => rows.map(r => [r.dataset.kind, r.querySelector('.bar').className, r.querySelector('.wf-ms').textContent])")
    assert [(kind, "bar-client" in bar) for kind, bar, _ in rows] == [("provider", False), ("tool", True), ("provider", False)]
    assert all(took.endswith(" ms") for _, _, took in rows)
    # Usage: the page's sums are the server's own.
    usage = usage_of(stack, sid, skey)
    shown = console.page.inner_text("#session-usage")
    assert f"Provider calls\n{usage['provider_calls']}" in shown
    assert f"Output tokens\n{usage['output_tokens']}" in shown
    assert f"${usage['cost_usd']:.6f}" in shown
    # Each row opens to the event's exact JSON.
    tool_call = next(event for event in events if event["event_type"] == "tool.call")
    console.page.click(f"[data-event-id='{tool_call['id']}'] summary")
    assert json.loads(console.page.text_content(f"[data-event-id='{tool_call['id']}'] pre")) == tool_call

    SCREENSHOT.parent.mkdir(exist_ok=True)
    console.page.screenshot(path=str(SCREENSHOT), full_page=True)


def types_shown(console: ConsolePage) -> list[str]:
    return console.page.eval_on_selector_all("[data-event-type]", "rows => rows.map(row => row.dataset.eventType)")


def test_the_session_page_survives_a_dropped_stream_and_shows_every_event_once(console, stack, mock):
    mock.reset()
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    console.open_signed_in(f"#/sessions/{sid}")
    console.wait_for_stream("live")
    mock.enqueue(Reply.text("before the drop"))
    result(send(stack, sid, skey, "one"))
    console.wait_for_events(len(all_events(stack, sid, skey)))

    # The session service's restart cuts the page's stream (the gateway's relay of it ends); the
    # page tries again, backing off while the service is away, and comes back with since_event_id.
    with console.page.expect_request(lambda request: "since_event_id=" in request.url and "/events/stream" in request.url):
        stack.stack.restart("session")
        served_again(stack, sid)
        mock.enqueue(Reply.text("after the drop"), Reply.text("and once more"))
        result(send(stack, sid, skey, "two"))
    result(send(stack, sid, skey, "three"))
    events = all_events(stack, sid, skey)
    console.wait_for_event(events[-1]["id"])

    # Closed: the stream ends for good, which the page says instead of reconnecting.
    assert stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"}).status_code == 200
    console.wait_for_stream("ended")
    console.wait_for("document.getElementById('session-state')?.textContent === 'closed'", "#session-facts")
    events = all_events(stack, sid, skey)
    assert console.event_ids() == [event["id"] for event in events]
    assert [event["event_type"] for event in events].count("server.message.send") == 3


def test_a_page_opened_during_a_provider_call_shows_its_text_so_far(console, stack, mock):
    mock.reset()
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    console.open_signed_in(f"#/sessions/{sid}")
    console.wait_for_stream("live")
    resume = threading.Event()
    mock.enqueue(Reply.text("alpha bravo charlie").streaming(pieces=["alpha ", "bravo ", "charlie"], pause_at=2,
                                                             resume=resume))
    # The driver asks for deltas: the call streams, and the page shows them (it never makes a call stream).
    thread, outcome = turn_in_background(stack, sid, skey, "spell", stream_deltas=True)
    shows_so_far = "document.querySelector('.live-call pre.delta')?.textContent === 'alpha bravo '"
    console.wait_for(shows_so_far, "#turns")

    # A page that comes in mid-call gets the call's text so far (one catch-up delta per block),
    # then the live deltas after it, then the response that replaces them.
    console.page.reload()
    console.wait_for_stream("live")
    console.wait_for(shows_so_far, "#turns")
    resume.set()
    thread.join(30)
    final = result(outcome["frames"])
    console.wait_for_event(final["events"][-1]["id"])
    assert console.page.query_selector(".live-call") is None
    assert console.event_ids() == [event["id"] for event in all_events(stack, sid, skey)]


def served_again(stack: RunningStack, sid: str, patience: float = 30.0) -> None:
    """Wait until the gateway reaches the restarted session service: until then a call is answered
    503 "try again shortly"."""
    deadline = time.monotonic() + patience
    while (answer := stack.admin.get(f"/admin/v1/sessions/{sid}")).status_code == 503:
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.1)
    assert answer.status_code == 200, answer.text


def test_the_first_load_of_the_sessions_page_is_small(console, stack):
    console.open_signed_in()
    console.page.wait_for_selector("#session-results table, #session-results p")
    loaded = console.wire_bytes({"document", "script", "stylesheet"})
    assert 0 < loaded <= FIRST_LOAD_BUDGET, loaded


def event(event_type: str, payload: dict, at: str) -> dict:
    return {"id": f"evt_{event_type}_{at}", "session_id": "ses_x", "client_key_id": None, "event_type": event_type,
            "payload": payload, "created_at": f"2026-07-06T18:26:{at}Z"}


# Sandbox and subagent events, as docs/reference/events.md gives them, and a turn stopped by the loop limit.
SANDBOX_EVENTS = [
    event("session.sandbox.available", {"images": [{"name": "python:3.12", "status": "available"},
                                                   {"name": "node:22", "status": "error", "detail": "pull failed"}]}, "00.000"),
    event("session.sandbox.start", {"image": "python:3.12", "dispatch": "remote"}, "01.000"),
    event("session.sandbox.running", {"image": "python:3.12", "sandbox_id": "sbx_1", "dispatch": "remote",
                                      "unsandboxed": False}, "02.000"),
    event("session.sandbox.stop", {"image": "python:3.12", "sandbox_id": "sbx_1", "reason": "idle_timeout",
                                   "dispatch": "remote"}, "03.000"),
    event("session.sandbox.stopped", {"image": "python:3.12", "sandbox_id": "sbx_1", "reason": "idle_timeout",
                                      "dispatch": "remote", "unsandboxed": False}, "04.000"),
]
SUBAGENT = {"dispatch": "remote", "harness": "claude-code", "model": "m", "detail": ""}
SUBAGENT_EVENTS = [
    event("session.subagent.start", {**SUBAGENT, "subagent_id": "sba_1"}, "00.000"),
    event("session.subagent.running", {**SUBAGENT, "subagent_id": "sba_1"}, "01.000"),
    event("session.subagent.start", {**SUBAGENT, "subagent_id": "sba_2"}, "01.500"),
    event("session.subagent.failed", {**SUBAGENT, "subagent_id": "sba_1", "reason": "timeout", "exit_code": 137}, "02.000"),
    event("session.subagent.completed", {**SUBAGENT, "subagent_id": "sba_2", "exit_code": 0}, "03.000"),
]
LOOP_LIMIT_TURN = [
    event("client.message.send", {"role": "user", "content": "go"}, "00.000"),
    event("provider.request", {"attempt": 0, "kind": "primary", "provider": "anthropic", "base_url": "http://p/",
                               "model": "m", "max_tokens": 1, "messages": [], "tools": []}, "00.100"),
    event("provider.response", {"attempt": 0, "kind": "primary", "provider": "anthropic", "ok": True, "status": 200,
                                "body": {}, "usage": {"input_tokens": 1000, "output_tokens": 100}}, "00.350"),
    event("tool.call", {"id": "tu_1", "name": "search", "input": {}, "dispatch": "mcp", "server_name": "web"}, "00.360"),
    event("mcp.request", {"method": "tools/call", "server_name": "web", "tool": "search", "input": {}}, "00.370"),
    event("mcp.response", {"server_name": "web", "ok": True, "result": {}}, "00.800"),
    event("tool.result", {"tool_use_id": "tu_1", "dispatch": "mcp", "server_name": "web", "is_error": True,
                          "content": "no"}, "00.810"),
    event("session.error", {"reason": "loop_limit", "max_iterations": 8}, "00.900"),
]


def test_the_page_derives_sandbox_subagent_and_turn_state_from_the_events(console):
    """What the session page shows of events a mock provider cannot make (sandboxes, subagents, MCP,
    the loop limit), from js/timeline.js in the page itself."""
    console.open()
    console.page.wait_for_selector("#admin-token")
    derived = console.page.evaluate(
        """async ([sandboxEvents, subagentEvents, turn]) => {
            const t = await import("./static/js/timeline.js");
            const prices = t.pricesOf([{provider: "anthropic", base_url: "http://p", model: "m",
                                        price_input_per_mtok: 3, price_output_per_mtok: 15}]);
            return {sandboxes: t.sandboxes(sandboxEvents), subagents: t.subagents(subagentEvents),
                    status: t.turnStatus(turn), usage: t.usage(turn, prices), waterfall: t.waterfall(turn),
                    starts: turn.map(t.startsTurn)};
        }""",
        [SANDBOX_EVENTS, SUBAGENT_EVENTS, LOOP_LIMIT_TURN],
    )
    assert [(s["image"], s["state"], s.get("sandbox_id"), s["detail"]) for s in derived["sandboxes"]] == [
        ("python:3.12", "stopped", "sbx_1", "idle_timeout"), ("node:22", "image error", None, "pull failed"),
    ]
    assert [(a["id"], a["state"], a["detail"]) for a in derived["subagents"]] == [
        ("sba_1", "failed", "timeout, exit 137"), ("sba_2", "completed", "exit 0"),
    ]
    assert derived["status"] == "failed: loop_limit"
    assert derived["usage"] == {"calls": 1, "input": 1000, "output": 100, "cost": 0.0045, "priced": True}
    bars = [(b["kind"], b.get("dispatch"), b["end"] - b["start"], b["ok"]) for b in derived["waterfall"]["bars"]]
    assert bars == [("provider", None, 250, True), ("tool", "mcp", 450, False)]
    assert derived["starts"] == [True] + [False] * 7
