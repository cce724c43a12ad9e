"""Sandboxes as a client and a caller of a host see them: a session driver with shorthand for its calls,
waiting until a stack's images are provisioned, and how a host refuses an image."""

from __future__ import annotations

import time

import grpc
import pytest

from bae.common.protos import sandbox_pb2
from testkit.docker_support import containers_with
from testkit.live import result, rpc, terminal


class Driver:
    """One client key's session, registered or not, with shorthand for its calls."""

    def __init__(self, stack, profile: dict, **session) -> None:
        self.stack = stack
        self.profile = profile
        key = stack.create_key(profile["id"])["key"]
        opened = stack.open_session(key, **session)
        self.sid, self.skey = opened["session_id"], opened["session_key"]

    def call(self, method: str, params: dict | None = None) -> list[dict]:
        return rpc(self.stack.client, self.sid, self.skey, method, params)

    def ok(self, method: str, params: dict | None = None) -> dict:
        return result(self.call(method, params))

    def error(self, method: str, params: dict | None = None) -> dict:
        return terminal(self.call(method, params))["error"]

    def register(self) -> "Driver":
        assert self.ok("session.registerDriver") == {"registered": True}
        return self

    def events(self) -> list[dict]:
        reply = self.stack.client.get(
            f"/api/v1/sessions/{self.sid}/events", params={"limit": 500}, headers={"Authorization": f"Bearer {self.skey}"}
        )
        assert reply.status_code == 200, reply.text
        return reply.json()["items"]

    def events_after(self, count: int) -> list[dict]:
        return self.events()[count:]

    def containers(self) -> list:
        return containers_with(f"bae.session_id={self.sid}")

    def close(self) -> None:
        closed = self.stack.client.delete(f"/api/v1/sessions/{self.sid}", headers={"Authorization": f"Bearer {self.skey}"})
        assert closed.status_code == 200, closed.text


def typed_payloads(events: list[dict]) -> list[tuple[str, dict]]:
    """(event_type, payload) of each event, in order."""
    return [(e["event_type"], e["payload"]) for e in events]


def wait_provisioned(stack, timeout: float = 30.0) -> list[dict]:
    """GET /admin/v1/sandbox-status until no image is pending; returns its items."""
    deadline = time.monotonic() + timeout
    while True:
        reply = stack.admin.get("/admin/v1/sandbox-status")
        assert reply.status_code == 200, reply.text
        items = reply.json()["items"]
        if all(image["status"] != "pending" for item in items for image in item["images"]):
            return items
        assert time.monotonic() < deadline, items
        time.sleep(0.1)


async def image_refusals(stub, image: str) -> list[grpc.aio.AioRpcError]:
    """How the host refuses both EnsureImage and Start of `image` (each must fail)."""
    errors = []
    for call in (stub.EnsureImage(sandbox_pb2.EnsureImageRequest(image=image), timeout=10),
                 stub.Start(sandbox_pb2.StartRequest(session_id="ses_refused", image=image), timeout=10)):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        errors.append(caught.value)
    return errors
