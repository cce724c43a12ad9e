"""The close race through the whole stack (SERVER-SPEC §5.5, §6.3, §7.2): a session closed
after a live call checked its state, but before the call took the session's live state,
never gets its live state back.

The stack runs in this process, so the test holds the call exactly inside that window (where
it goes for the live state: the registry's `attach`, a subscription's `_attach_observed`, a
turn's `run_turn`), closes the session over REST, then lets it go.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from testkit.live import new_session, notifications, register, rpc
from testkit.mockllm import Reply
from testkit.inprocess import launch_inprocess_stack
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.inprocess

TOKEN = "sk-test-secret-token-123456"
CLOSED = {"code": -32000, "message": "session is closed, not open"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, mock):
    running = launch_inprocess_stack(tmp_path_factory.mktemp("close-race"), mock_provider_toml(mock.base_url),
                                     MOCK_LLM_TOKEN=TOKEN)
    yield running
    running.close()


def events(stack, sid: str, skey: str) -> list[dict]:
    page = stack.client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200},
                            headers={"Authorization": f"Bearer {skey}"})
    return page.json()["items"]


@pytest.mark.parametrize("method", ["session.registerDriver", "session.subscribe", "session.sendMessage"])
def test_a_session_closed_after_the_state_check_gets_no_live_state_again(stack, mock, method):
    mock.reset()
    sid, skey, _ = new_session(stack)
    if method == "session.sendMessage":
        register(stack, sid, skey)  # the driver gate comes before the state check
        mock.enqueue(Reply.text("never asked"))
    params = {"message": {"role": "user", "content": "hi"}} if method == "session.sendMessage" else None
    if method == "session.registerDriver":
        hold = stack.hold(stack.session.engine.registry, "attach", sid)
    elif method == "session.subscribe":
        hold = stack.hold(stack.session.servicer.live, "_attach_observed", sid, lambda session: session.id)
    else:
        hold = stack.hold(stack.session.engine.turns, "run_turn", sid, lambda request: request.session_id)
    frames: list[dict] = []
    answered = threading.Event()

    def call() -> None:
        # A stream that never ends (a subscriber left on a live state nobody closes) times out here.
        with httpx.Client(base_url=stack.client.base_url, timeout=10) as client:
            frames.extend(rpc(client, sid, skey, method, params))
        answered.set()

    caller = threading.Thread(target=call)
    caller.start()
    hold.wait_held()  # the call found the session open ...
    closed = stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"})
    assert closed.json() == {"session_id": sid, "state": "closed"}  # ... and now it is not
    hold.release()
    caller.join(15)
    assert answered.is_set()

    if method == "session.subscribe":
        assert frames == []  # the stream ended: no live feed was created for it
    else:
        assert [frame.get("error") for frame in frames] == [CLOSED], json.dumps(frames)
        assert notifications(frames) == []
    # No live state: no driver registry, nothing recorded after the close, no provider call.
    participants = stack.client.get(f"/api/v1/sessions/{sid}/participants",
                                    headers={"Authorization": f"Bearer {skey}"})
    assert participants.json() == {"drivers": []}
    assert events(stack, sid, skey)[-1]["event_type"] == "session.close"
    assert mock.requests == []
