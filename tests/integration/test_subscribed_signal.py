"""The subscribed signal: the gateway answers `session.subscribe` with its headers only once the session
service has fixed where the subscriber starts, so a client that sends as soon as they arrive misses
nothing (bae_client's `subscribe()` returns then).

The stack runs in this process, so the test holds the subscription inside the session service just before
that point and checks that no headers have gone out meanwhile.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from testkit.inprocess import launch_inprocess_stack
from testkit.live import new_session, register, result, send
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.inprocess

TOKEN = "sk-test-secret-token-123456"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, mock):
    running = launch_inprocess_stack(tmp_path_factory.mktemp("subscribed"), mock_provider_toml(mock.base_url),
                                     MOCK_LLM_TOKEN=TOKEN)
    yield running
    running.close()


def test_the_headers_come_once_the_subscription_is_held(stack, mock):
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    hold = stack.hold(stack.session.servicer.live, "_attach_observed", sid, lambda session: session.id)
    answered = threading.Event()
    lines: list[str] = []

    def subscribe() -> None:
        body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}
        with httpx.Client(base_url=stack.client.base_url, timeout=30) as client:
            with client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=body,
                               headers={"Authorization": f"Bearer {skey}"}) as response:
                assert response.status_code == 200
                answered.set()
                for line in response.iter_lines():
                    lines.append(line)
                    if '"server.message.send"' in line:
                        return

    subscriber = threading.Thread(target=subscribe)
    subscriber.start()
    hold.wait_held()  # accepted by the session service, its starting point not fixed yet
    time.sleep(0.5)
    assert not answered.is_set()
    hold.release()
    assert answered.wait(10)
    mock.enqueue(Reply.text("hello"))
    events = result(send(stack, sid, skey, "sent once the headers came"))["events"]
    subscriber.join(30)
    assert [event["id"] for event in events] == [line.split('"id":"', 1)[1].split('"', 1)[0] for line in lines]
