"""What every fault test asserts afterwards: each event once, in order, and no container left behind."""

from __future__ import annotations

import time
from collections import Counter
from typing import Callable

from testkit.docker_support import docker_skip_reason, sandboxes_of_hosts


def event_log(stack, sid: str, skey: str) -> list[dict]:
    """The session's events as the client REST API lists them."""
    page = stack.client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200},
                            headers={"Authorization": f"Bearer {skey}"})
    assert page.status_code == 200, page.text
    return page.json()["items"]


def wait_until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def wait_for_log(stack, sid: str, skey: str, ready: Callable[[list[dict]], bool], timeout: float = 15.0) -> list[dict]:
    """The session's events once `ready(events)` holds."""
    deadline = time.monotonic() + timeout
    while not ready(events := event_log(stack, sid, skey)):
        assert time.monotonic() < deadline, f"the log never got there: {[e['event_type'] for e in events]}"
        time.sleep(0.05)
    return events


def count(events: list[dict], event_type: str) -> int:
    return sum(event["event_type"] == event_type for event in events)


def assert_each_event_once(events: list[dict]) -> None:
    ids = Counter(event["id"] for event in events)
    assert max(ids.values(), default=1) == 1, [event_id for event_id, n in ids.items() if n > 1]
    stamps = [event["created_at"] for event in events]
    assert stamps == sorted(stamps), "events out of order"


def assert_history_kept(stack, sid: str, skey: str, before: list[dict]) -> list[dict]:
    """The log now starts with exactly the events seen before the fault, each once; returns the log."""
    events = event_log(stack, sid, skey)
    assert_each_event_once(events)
    assert [event["id"] for event in events[: len(before)]] == [event["id"] for event in before]
    assert events[: len(before)] == before
    return events


def assert_no_container_left(stack, timeout: float = 10.0) -> None:
    """No sandbox container of the stack's host is left (where Docker runs); one whose removal is
    already under way (a stopped auto-remove container) gets `timeout` seconds to go."""
    if docker_skip_reason() is None:
        host_id = stack.stack.env["BAE_SANDBOX_HOST_ID"]
        deadline = time.monotonic() + timeout
        while left := sandboxes_of_hosts(host_id):
            assert time.monotonic() < deadline, [c.labels for c in left]
            time.sleep(0.2)
