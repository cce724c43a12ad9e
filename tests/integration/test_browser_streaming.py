"""The page of docs/guides/streaming.md, exactly as printed there, streams a turn in headless Chromium.

The test takes the guide's one ```html block, fills in its three constants as the guide tells the
reader to, and serves it from another origin than the gateway's client port (listed in
BAE_CORS_ORIGINS). The page reads the event stream with deltas through CORS and sends the message
itself; the text it shows comes from the stream's `session.delta` frames alone (it shows nothing
else), and must be the turn's whole text, on both provider wire kinds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from testkit import ROOT
from testkit.browser import PageServer, console_of, wait_for
from testkit.live import all_events, new_session, payloads
from testkit.mockllm import MockLLM, Reply
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.browser]

GUIDE = ROOT / "docs" / "guides" / "streaming.md"
TOKEN = "sk-test-secret-token-123456"
TEXT = "Streamed token by token, through the event stream, to a page of another origin."


def guide_page(gateway: str, session_id: str, session_key: str) -> str:
    """The guide's page with GATEWAY, SESSION_ID and SESSION_KEY filled in."""
    [page] = re.findall(r"^```html\n(.*?)^```$", GUIDE.read_text(), re.MULTILINE | re.DOTALL)
    for name, value in (("GATEWAY", gateway), ("SESSION_ID", session_id), ("SESSION_KEY", session_key)):
        line = f"const {name} = {json.dumps(value)};"
        page, count = re.subn(rf'^const {name} = "[^"\n]*";$', lambda _, line=line: line, page, flags=re.MULTILINE)
        assert count == 1, f"the guide's page has no line `const {name} = \"…\";` to fill in"
    return page


@pytest.fixture(scope="module")
def server() -> Iterator[PageServer]:
    with PageServer() as serving:
        yield serving


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, mock: MockLLM, server: PageServer) -> Iterator[RunningStack]:
    config = mock_provider_toml(mock.base_url) + mock_provider_toml(mock.base_url, name="mock-openai", kind="openai")
    running = launch_stack(tmp_path_factory.mktemp("browser-streaming"), config,
                           BAE_CORS_ORIGINS=server.origin, MOCK_LLM_TOKEN=TOKEN)
    yield running
    running.close()


@pytest.mark.parametrize("provider", ["mock", "mock-openai"])
def test_the_guides_page_streams_a_turn(stack, server, mock, browser_page, provider):
    mock.reset()
    mock.enqueue(Reply.text(TEXT))
    sid, skey, _ = new_session(stack, primary=provider)
    server.html = guide_page(stack.client_url, sid, skey)

    browser_page.goto(server.url)
    wait_for(browser_page, "document.getElementById('state').textContent !== 'connecting'", "#state")
    assert browser_page.text_content("#state") == "connected", console_of(browser_page)
    browser_page.click("#send")
    wait_for(browser_page, "document.getElementById('state').textContent === 'done'", "#state")
    wait_for(browser_page, f"document.getElementById('reply').textContent === {json.dumps(TEXT)}", "#reply")

    # The provider was called through its streaming API, because the page's stream asked for deltas.
    [call] = [request for request in mock.requests if request["path"].startswith("/v1/")]
    assert call["body"]["stream"] is True
    # The log is as for any turn: the whole text, stored once.
    [message] = payloads(all_events(stack, sid, skey), "server.message.send")
    assert message["content"] == [{"type": "text", "text": TEXT}]
