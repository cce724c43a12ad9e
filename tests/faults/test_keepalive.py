"""Idle internal streams outlive many keepalive pings (SERVER-SPEC is silent; docs/security.md).

A client pings a quiet connection every BAE_GRPC_KEEPALIVE_INTERVAL seconds.
Had a server kept gRPC's 5-minute ping minimum, it would answer the third such
ping with GOAWAY `too_many_pings` and every idle stream on the connection would
die: at 180 s with the default 30 s interval, within seconds here. The tests
shorten the interval to 1 s and stay idle for many intervals.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bae.common.grpcutil import channel
from bae.common.internal import InternalPlane
from testkit.checks import assert_each_event_once, assert_no_container_left, event_log
from testkit.docker_support import TEST_IMAGE, require_docker
from testkit.live import join, new_session, register, result, rpc, session_state, types
from testkit.stack import launch_stack, mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.docker]

INTERVAL = 1  # seconds between pings
IDLE = 10 * INTERVAL  # far past the third ping


@pytest.fixture(scope="module")
def stack(mock, tmp_path_factory):
    running = launch_stack(
        tmp_path_factory.mktemp("keepalive"),
        mock_provider_toml(mock.base_url),
        BAE_GRPC_KEEPALIVE_INTERVAL=str(INTERVAL),
    )
    yield running
    running.close()


def internal_addresses(stack) -> dict[str, str]:
    settings = stack.stack.settings
    return {
        "session": settings.session_grpc_addr,
        "runner": settings.runner_grpc_addr,
        "sandbox": settings.sandbox_grpc_addrs[0],
    }


@pytest.mark.parametrize("service", ["session", "runner", "sandbox"])
async def test_a_server_accepts_pings_at_the_configured_interval(stack, service):
    # An idle server stream (health Watch) on a channel that pings as the services' own do.
    plane = InternalPlane(stack.stack.env["BAE_INTERNAL_TOKEN"], keepalive=INTERVAL)
    async with channel(internal_addresses(stack)[service], plane) as chan:
        watch = health_pb2_grpc.HealthStub(chan).Watch(health_pb2.HealthCheckRequest(service=""))
        first = await watch.read()
        assert first.status in (health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING)
        try:
            # Nothing arrives while idle; a GOAWAY would end the stream with an error instead.
            next_frame = await asyncio.wait_for(watch.read(), IDLE)
        except TimeoutError:
            next_frame = None
        assert next_frame is None or next_frame.status == first.status, next_frame
        assert chan.get_state() == grpc.ChannelConnectivity.READY
        watch.cancel()


def test_an_idle_subscription_outlives_many_pings(stack):
    sid, skey, profile = new_session(stack)
    lines: list[dict] = []

    def watch() -> None:
        body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe"}
        with httpx.Client(base_url=stack.stack.client_url, timeout=IDLE * 3) as client:
            with client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=body,
                               headers={"Authorization": f"Bearer {skey}"}) as response:
                for line in response.iter_lines():
                    lines.append(json.loads(line))

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(IDLE)
    assert watcher.is_alive() and lines == [], lines  # still open, nothing said
    other = join(stack, sid, profile)
    register(stack, sid, other)  # events for the quiet subscriber
    deadline = time.monotonic() + 10
    while len(lines) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [line["params"]["event_type"] for line in lines] == ["session.join", "session.driver.register"]
    assert result(rpc(stack.client, sid, skey, "session.unsubscribe")) == {"unsubscribed": True}
    watcher.join(10)
    assert not watcher.is_alive()
    # The quiet stream got exactly the events logged while it was open, each once.
    events = event_log(stack, sid, skey)
    assert_each_event_once(events)
    assert types(events) == ["session.open", "session.join", "session.driver.register"]
    assert [line["params"]["id"] for line in lines] == [event["id"] for event in events[1:]]
    assert session_state(stack, sid) == "open"
    assert_no_container_left(stack)


def test_a_long_sandbox_command_outlives_many_pings(stack):
    require_docker()
    profile = stack.create_profile(f"ka-{time.monotonic_ns()}", available_sandboxes=[TEST_IMAGE])
    key = stack.create_key(profile["id"])["key"]
    opened = stack.open_session(key)
    sid, skey = opened["session_id"], opened["session_key"]
    register(stack, sid, skey)
    try:
        result(rpc(stack.client, sid, skey, "session.startRemoteSandbox", {"image": TEST_IMAGE}))
        executed = result(rpc(stack.client, sid, skey, "session.execRemoteSandbox",
                              {"command": f"sleep {IDLE}; echo done"}))
        assert executed == {"stdout": "done\n", "stderr": "", "exit_code": 0}
    finally:
        closed = stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"})
        assert closed.status_code == 200, closed.text
    events = event_log(stack, sid, skey)
    assert_each_event_once(events)
    assert [kind for kind in types(events) if kind.startswith("session.sandbox.")] == [
        "session.sandbox.available", "session.sandbox.start", "session.sandbox.running",
        "session.sandbox.stop", "session.sandbox.stopped",
    ]
    assert session_state(stack, sid) == "closed"
    assert_no_container_left(stack)  # the close stopped the sandbox that outlived the pings
