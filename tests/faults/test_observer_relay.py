"""`session.subscribe` observers through the gateway's relay (SERVER-SPEC §6.4, bae/services/gateway/fanout.py).

The session service sends a session's events once per gateway (its `Relay` stream) and the gateway
copies them to each observer. These tests hold the Relay contract at the session service's gRPC
boundary, the §6.4 hand-over from replay to live under a running conversation, and what observers
see when the session service is killed under them.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import grpc
import httpx
import pytest

from bae.common.internal import InternalPlane
from bae.common.protos import session_pb2, session_pb2_grpc
from testkit.checks import assert_each_event_once, event_log, wait_until
from testkit.live import join, new_session, notifications, register, result, rpc, send
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"
NOTICES = ("revoked_key", "subscriptions_ended")


@pytest.fixture
def stack(start_stack, mock):
    mock.reset()
    return start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN)


class Observer:
    """One `session.subscribe` stream through the gateway, read on a thread until it ends."""

    def __init__(self, stack, sid: str, skey: str, since: str | None = None, request_id: int = 7) -> None:
        self.lines: list[dict] = []
        self.opened = threading.Event()
        self.done = threading.Event()
        params = {"since_event_id": since} if since else {}
        body = {"jsonrpc": "2.0", "id": request_id, "method": "session.subscribe", "params": params}
        threading.Thread(target=self._read, args=(stack, sid, skey, body), daemon=True).start()
        assert self.opened.wait(10)

    def _read(self, stack, sid: str, skey: str, body: dict) -> None:
        try:
            with httpx.Client(base_url=stack.client.base_url, timeout=60) as client, client.stream(
                "POST", f"/api/v1/sessions/{sid}/rpc", json=body, headers={"Authorization": f"Bearer {skey}"}
            ) as response:
                assert response.status_code == 200
                self.opened.set()
                for line in response.iter_lines():
                    self.lines.append(json.loads(line))
        finally:
            self.opened.set()
            self.done.set()

    @property
    def ids(self) -> list[str]:
        return [event["id"] for event in notifications(self.lines)]


class RelayReader:
    """The session service's Relay for one session, called as a gateway calls it, read until it ends."""

    def __init__(self, stack, sid: str, *, token: bool = True) -> None:
        self.frames: list[session_pb2.RelayFrame] = []
        self.error: grpc.aio.AioRpcError | None = None
        self.started = threading.Event()
        self.done = threading.Event()
        plane = InternalPlane(stack.stack.env["BAE_INTERNAL_TOKEN"], keepalive=30.0)
        metadata = [plane.token_metadata] if token else []
        address = stack.stack.settings.session_grpc_addr
        threading.Thread(target=asyncio.run, args=(self._read(address, sid, metadata),), daemon=True).start()
        assert self.started.wait(10)

    async def _read(self, address: str, sid: str, metadata: list) -> None:
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                call = session_pb2_grpc.SessionServiceStub(channel).Relay(
                    session_pb2.RelayRequest(session_id=sid), metadata=metadata, timeout=60)
                async for frame in call:
                    self.frames.append(frame)
                    self.started.set()
        except grpc.aio.AioRpcError as error:
            self.error = error
        finally:
            self.started.set()
            self.done.set()

    @property
    def kinds(self) -> list[str]:
        return [frame.WhichOneof("kind") for frame in self.frames]

    def event_ids(self) -> list[str]:
        return [event.id for frame in self.frames for event in frame.events.events]


def test_the_relay_carries_every_event_and_the_word_that_streams_end_in_order(stack, mock):
    sid, a, profile = new_session(stack)
    register(stack, sid, a)
    b_client = stack.create_key(profile["id"], name="b")
    joined = stack.client.post(f"/api/v1/sessions/{sid}/join", json={"tools": []},
                               headers={"Authorization": f"Bearer {b_client['key']}"})
    assert joined.status_code == 201, joined.text
    before = [event["id"] for event in event_log(stack, sid, a)]
    relay = RelayReader(stack, sid)
    assert relay.kinds == ["position"]

    mock.enqueue(Reply.text("relayed"))
    result(send(stack, sid, a, "hi"))
    assert stack.admin.delete(f"/admin/v1/keys/{b_client['id']}").status_code == 204
    assert result(rpc(stack.client, sid, a, "session.unsubscribe")) == {"unsubscribed": True}
    assert stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {a}"}).status_code == 200
    assert relay.done.wait(10), "the relay outlived the session's live state"

    assert relay.error is None
    logged = [event["id"] for event in event_log(stack, sid, a)]
    assert relay.event_ids() == logged[len(before):]  # every event after the relay opened, each once
    # Each notice stands where it happened: after the turn's four events, before the close's.
    notices = [(len([event for frame in relay.frames[:index] for event in frame.events.events]),
                frame.revoked_key or frame.WhichOneof("kind"))
               for index, frame in enumerate(relay.frames) if frame.WhichOneof("kind") in NOTICES]
    assert notices == [(4, b_client["id"]), (4, "subscriptions_ended")]

    assert RelayReader(stack, sid).error.code() == grpc.StatusCode.FAILED_PRECONDITION  # closed: no relay
    refused = RelayReader(stack, sid, token=False).error
    assert refused is not None and refused.code() == grpc.StatusCode.UNAUTHENTICATED


def test_observers_joining_a_running_conversation_get_each_event_once_without_gap(stack, mock):
    sid, a, profile = new_session(stack)
    register(stack, sid, a)
    mock.enqueue(Reply.text("first"))
    result(send(stack, sid, a, "first"))
    since = event_log(stack, sid, a)[0]["id"]
    keys = [a, join(stack, sid, profile, "b"), join(stack, sid, profile, "c")]

    turns = 12
    for number in range(turns):
        mock.enqueue(Reply.text(f"turn {number}"))
    talking = threading.Thread(target=lambda: [result(send(stack, sid, a, f"q{n}")) for n in range(turns)])
    talking.start()
    observers: list[tuple[Observer, str | None]] = []
    for number in range(9):  # joining while events are being written and published
        with_since = since if number % 2 == 0 else None
        observers.append((Observer(stack, sid, keys[number % 3], since=with_since), with_since))
        time.sleep(0.03)
    talking.join(60)
    assert result(rpc(stack.client, sid, a, "session.unsubscribe")) == {"unsubscribed": True}
    for observer, _ in observers:
        assert observer.done.wait(10)

    logged = [event["id"] for event in event_log(stack, sid, a)]
    for observer, with_since in observers:
        assert_each_event_once(notifications(observer.lines))
        if with_since is not None:  # the replay and the live events meet without gap or duplicate
            assert observer.ids == logged[logged.index(since) + 1:]
        else:  # live only, from when it joined: a contiguous run that reaches the end
            assert observer.ids == logged[len(logged) - len(observer.ids):]


def test_observers_of_a_killed_session_service_end_with_an_error_and_come_back(stack, mock):
    sid, a, profile = new_session(stack)
    register(stack, sid, a)
    b = join(stack, sid, profile, "b")
    observers = [Observer(stack, sid, key, request_id=number) for number, key in enumerate((a, b, a), start=1)]
    mock.enqueue(Reply.text("seen"))
    result(send(stack, sid, a, "before"))
    wait_until(lambda: all(len(observer.ids) == 4 for observer in observers), timeout=10)

    stack.stack.restart("session", sig=signal.SIGKILL)
    for number, observer in enumerate(observers, start=1):
        assert observer.done.wait(15), "an observer's stream outlived the session service"
        assert observer.lines[-1] == {"jsonrpc": "2.0", "id": number,
                                      "error": {"code": -32603, "message": "Internal error"}}
        assert len(observer.ids) == 4

    # A new subscription after the restart replays what it missed and goes on live.
    last_seen = observers[0].ids[-1]
    again = Observer(stack, sid, b, since=last_seen)
    register(stack, sid, a)
    mock.enqueue(Reply.text("after"))
    result(send(stack, sid, a, "after"))
    logged = [event["id"] for event in event_log(stack, sid, a)]
    wait_until(lambda: again.ids == logged[logged.index(last_seen) + 1:], timeout=10)
    assert result(rpc(stack.client, sid, a, "session.unsubscribe")) == {"unsubscribed": True}
    assert again.done.wait(10)
