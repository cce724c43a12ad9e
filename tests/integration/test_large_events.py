"""No event makes a session's log unreadable: pages stop at their payload budget, and an event of
any size is served whole through the gateway (events listing, client and admin; a turn's stream and
result; subscribe, replayed and live), though it crosses the internal plane in pieces."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from bae.common.grpcutil import MAX_MESSAGE_BYTES
from bae.common.jsontext import RawJson
from bae.services.session.api.event_messages import EVENT_PIECE_CHARS
from bae.services.session.api.pagination import PAGE_PAYLOAD_CHARS
from testkit.inprocess import launch_inprocess_stack
from testkit.live import new_session, notifications, register, result, send, types
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.inprocess

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def stack(tmp_path_factory, mock):
    running = launch_inprocess_stack(tmp_path_factory.mktemp("large"), mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN="sk-test")
    yield running
    running.close()


def payload_text(chars: int, mark: str) -> str:
    """A JSON object of about `chars` characters, with non-ASCII text in it (pieces cut characters)."""
    return json.dumps({"text": (mark + "é✓" + "x" * 61) * (chars // 64)}, ensure_ascii=False, separators=(",", ":"))


def store_events(stack, sid: str, texts: list[str]) -> None:
    """Events of these payload texts, written through the store as the service writes any."""
    items = [(None, "tool.result", RawJson(text)) for text in texts]
    stack.loop.run(stack.session.store.append_events(sid, items))


def pages(client: httpx.Client, path: str, auth: dict, limit: int = 200) -> list[dict]:
    """Every page of an events listing, following next_cursor."""
    out, cursor = [], ""
    while True:
        response = client.get(path, params={"limit": limit, "cursor": cursor}, headers=auth)
        assert response.status_code == 200, response.text[:200]
        page = response.json()
        out.append(page)
        cursor = page["next_cursor"]
        if cursor is None:
            return out


def test_pages_stop_at_their_payload_budget_and_the_cursor_loses_no_event(stack):
    sid, skey, _ = new_session(stack)
    texts = [payload_text(int(1.5 * MIB), f"m{index}") for index in range(5)]
    store_events(stack, sid, texts)
    routes = [
        (stack.client, f"/api/v1/sessions/{sid}/events", {"Authorization": f"Bearer {skey}"}),
        (stack.admin, f"/admin/v1/sessions/{sid}/events", {}),
    ]
    listed = []
    for client, path, auth in routes:
        read = pages(client, path, auth)
        items = [item for page in read for item in page["items"]]
        assert len({item["id"] for item in items}) == len(items)  # none twice
        assert types(items)[0] == "session.open"
        # Two large events fit a page's budget, a third does not: fewer than `limit`, and more follow.
        large = [[item for item in page["items"] if item["event_type"] == "tool.result"] for page in read]
        assert [len(page) for page in large if page] == [2, 2, 1]
        for page in read[:-1]:
            assert page["next_cursor"] is not None and len(page["items"]) < 200
        payloads = [json.dumps(item["payload"], ensure_ascii=False, separators=(",", ":")) for item in items]
        assert payloads[-5:] == texts
        listed.append(items)
    assert listed[0] == listed[1]
    assert 2 * 1.5 * MIB < PAGE_PAYLOAD_CHARS < 3 * 1.5 * MIB


def test_an_event_over_the_internal_message_limit_is_served_byte_for_byte(stack):
    sid, skey, _ = new_session(stack)
    huge = '{"text":"' + ("hé✓" + "x" * 61) * ((MAX_MESSAGE_BYTES + 4 * MIB) // 64) + '"}'
    assert len(huge.encode()) > MAX_MESSAGE_BYTES
    store_events(stack, sid, [payload_text(1000, "before"), huge, payload_text(1000, "after")])
    path, auth = f"/api/v1/sessions/{sid}/events", {"Authorization": f"Bearer {skey}"}
    first = stack.client.get(path, headers=auth).json()
    assert first["items"][-1]["payload"]["text"].startswith("before")
    # Alone on its page, with its payload exactly as stored (the body is not parsed: it is large).
    response = stack.client.get(path, params={"cursor": first["next_cursor"]}, headers=auth)
    assert response.status_code == 200
    body = response.content
    assert body.startswith(b'{"items":[{"id":"evt_') and body.count(b'"id":"evt_') == 1
    start, end = body.index(b',"payload":') + len(b',"payload":'), body.rindex(b',"created_at":')
    assert body[start:end] == huge.encode()
    tail = json.loads(b"{" + body[end + 1:].split(b"}],", 1)[1])
    last = stack.client.get(path, params={"cursor": tail["next_cursor"]}, headers=auth).json()
    assert [item["payload"]["text"][:5] for item in last["items"]] == ["after"]
    assert last["next_cursor"] is None


def test_a_turn_with_large_events_streams_and_answers_them_whole(stack, mock):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    text = ("é" + "y" * 99) * (6 * MIB // 100)  # over a frame's few MiB, several pieces each
    assert len(text) > 4 * EVENT_PIECE_CHARS
    mock.enqueue(Reply.text(text))
    frames = send(stack, sid, skey, "write a lot")
    outcome = result(frames)
    assert outcome["message"]["content"] == [{"type": "text", "text": text}]
    assert types(outcome["events"]) == [
        "client.message.send", "provider.request", "provider.response", "server.message.send",
    ]
    assert notifications(frames) == outcome["events"][1:]
    listed = [item for page in pages(stack.admin, f"/admin/v1/sessions/{sid}/events", {}) for item in page["items"]]
    assert outcome["events"] == [item for item in listed if item["id"] in {e["id"] for e in outcome["events"]}]
    # Replayed after the first event of the turn: the large ones come whole.
    replay = subscribe(stack, sid, skey, since=outcome["events"][0]["id"], until=outcome["events"][-1]["id"])
    assert replay == outcome["events"][1:]


def test_a_live_subscriber_gets_a_large_event_whole(stack, mock):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    last = stack.admin.get(f"/admin/v1/sessions/{sid}/events").json()["items"][-1]["id"]
    text = "z" * (3 * MIB)
    seen: list[dict] = []
    opened = threading.Event()
    # From the last event before the turn: what the relay carries, less what the replay sent.
    watching = threading.Thread(
        target=lambda: seen.extend(subscribe(stack, sid, skey, since=last, until="server.message.send", opened=opened))
    )
    watching.start()
    try:
        assert opened.wait(10)
        mock.enqueue(Reply.text(text))
        outcome = result(send(stack, sid, skey, "again"))
    finally:
        watching.join(30)
    assert seen == outcome["events"]  # own input included: a subscriber gets every event
    assert seen[-1]["payload"]["content"] == [{"type": "text", "text": text}]


def subscribe(stack, sid: str, skey: str, *, until: str, since: str, opened: threading.Event | None = None) -> list[dict]:
    """The events a `session.subscribe` stream sends, up to the one whose id or type is `until`."""
    body = {"jsonrpc": "2.0", "id": 7, "method": "session.subscribe", "params": {"since_event_id": since}}
    events = []
    with stack.client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=body, timeout=30,
                             headers={"Authorization": f"Bearer {skey}"}) as response:
        assert response.status_code == 200
        if opened is not None:
            opened.set()
        for line in response.iter_lines():
            event = json.loads(line)["params"]
            events.append(event)
            if until in (event["id"], event["event_type"]):
                return events
    raise AssertionError("the stream ended first")
