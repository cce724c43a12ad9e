"""Periodic reconciliation (BAE_RECONCILE_INTERVAL) through the whole stack, on real Docker: what a
sandbox host runs is compared with the store every interval, not only when the session service starts.

The harness is tests/harness/fake-harness inside the sandbox image (test_subagents.py).
"""

from __future__ import annotations

import itertools
import signal
import time
import uuid
from pathlib import Path

import grpc
import pytest

from bae.common.protos import sandbox_pb2, sandbox_pb2_grpc
from testkit.docker_support import containers_with, ensure_harness_image, require_docker
from testkit.live import result, rpc, types
from testkit.mockllm import Reply
from testkit.ports import consecutive_ports
from testkit.postgres_support import postgres, postgres_url  # noqa: F401 - fixtures
from testkit.stack import mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.docker]

RUN = f"test-reconcile-{uuid.uuid4().hex[:8]}"
_stacks = itertools.count()
INTERVAL = 2  # BAE_RECONCILE_INTERVAL of these stacks, in seconds
TOOL = "launch_subagent"


@pytest.fixture(scope="module")
def image():
    require_docker()
    return ensure_harness_image()


@pytest.fixture
def stack(start_stack, mock):
    mock.reset()
    return start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN="t0ken-for-tests",
                       BAE_SANDBOX_HOST_ID=f"{RUN}-{next(_stacks)}", BAE_RECONCILE_INTERVAL=str(INTERVAL))


class Session:
    """An open session with a registered driver and a running remote sandbox."""

    def __init__(self, stack, image: str, key: str | None = None) -> None:
        self.stack = stack
        key = key or new_key(stack, image)
        subagents = [{"harness": "fake", "command_template": "fake-harness --model {model}"}]
        opened = stack.open_session(key, subagent_tools=[
            {"name": TOOL, "description": "launch", "input_schema": {"type": "object"}, "image": image,
             "subagents": subagents}])
        self.sid, self.skey = opened["session_id"], opened["session_key"]
        assert self.ok("session.registerDriver") == {"registered": True}
        self.ok("session.startRemoteSandbox", {"image": image})
        [self.container] = containers_with(f"bae.session_id={self.sid}")

    def call(self, method: str, params: dict | None = None) -> list[dict]:
        return rpc(self.stack.client, self.sid, self.skey, method, params)

    def ok(self, method: str, params: dict | None = None) -> dict:
        return result(self.call(method, params))

    def events(self) -> list[dict]:
        reply = self.stack.admin.get(f"/admin/v1/sessions/{self.sid}/events", params={"limit": 500})
        return reply.json()["items"]

    def close(self) -> None:
        reply = self.stack.client.delete(f"/api/v1/sessions/{self.sid}", headers={"Authorization": f"Bearer {self.skey}"})
        assert reply.status_code == 200, reply.text


def opened_after_restart(stack, image: str, key: str) -> Session:
    """A Session, once the gateway reaches the restarted replica that owns it (503 until then)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return Session(stack, image, key)
        except AssertionError as failure:
            if '"status": 503' not in str(failure) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def new_key(stack, image: str) -> str:
    """A client key on a new profile that allows `image`."""
    profile = stack.create_profile(f"p{time.monotonic_ns()}", available_sandboxes=[image])
    return stack.create_key(profile["id"])["key"]


def wait_for_line(log: Path, text: str, start: int = 0, timeout: float = 20.0) -> None:
    """Until `text` appears in `log` past byte `start`."""
    deadline = time.monotonic() + timeout
    while text not in log.read_bytes()[start:].decode(errors="replace"):
        assert time.monotonic() < deadline, f"no {text!r} in {log.name} within {timeout}s"
        time.sleep(0.1)


def gone_within(label: str, seconds: float) -> bool:
    """Whether no container carries `label` before `seconds` have passed (polled)."""
    deadline = time.monotonic() + seconds
    while containers_with(label):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def start_orphan(stack, image: str, session_id: str) -> str:
    """A container the host runs for `session_id`, which the store does not know."""
    address = stack.stack.settings.sandbox_grpc_addrs[0]
    metadata = (("bae-internal-token", stack.stack.env["BAE_INTERNAL_TOKEN"]),)
    with grpc.insecure_channel(address) as channel:
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        stub.AllowImages(sandbox_pb2.AllowImagesRequest(images=[image]), metadata=metadata, timeout=10)
        return stub.Start(sandbox_pb2.StartRequest(session_id=session_id, image=image),
                          metadata=metadata, timeout=30).sandbox_id


def test_a_sandbox_whose_stop_failed_at_close_is_stopped_within_two_intervals(stack, mock, image):
    """The acceptance test: the close's sandbox stop fails (its host is frozen), the host is thawed,
    and the next pass stops the closed session's container, with the subagent running in it; the
    closed session's log is not written to again."""
    session = Session(stack, image)
    mock.enqueue(Reply.tool_use([("tu_launch", TOOL, {"harness": "fake", "model": "m1", "prompt": "sleep 300"})]))
    mock.enqueue(Reply.text("launched"))
    session.ok("session.sendMessage", {"message": {"content": "go"}})
    processes = session.container.exec_run(["ps", "-o", "args"]).output.decode()
    assert "sleep 300" in processes  # the subagent's command runs in the sandbox
    host = stack.stack.processes["sandbox"]
    address = stack.stack.settings.sandbox_grpc_addrs[0]
    session_log = stack.tmp / "logs" / "session.log"
    before = len(session.events())

    frozen_at = session_log.stat().st_size
    host.send_signal(signal.SIGSTOP)
    try:
        # Once the service has seen the host down, the close's stop fails at once.
        wait_for_line(session_log, f"sandbox host {address} is down", frozen_at)
        session.close()
    finally:
        host.send_signal(signal.SIGCONT)
    wait_for_line(session_log, f"sandbox host {address} is up", frozen_at)
    assert gone_within(f"bae.session_id={session.sid}", 2 * INTERVAL), \
        f"the closed session's container {session.container.id} still runs two intervals after its host came back"
    wait_for_line(session_log, f"stopping sandbox {session.container.id} of closed session {session.sid}", frozen_at)

    stop = {"image": image, "sandbox_id": session.container.id, "dispatch": "remote"}
    closing = session.events()[before:]
    assert [(e["event_type"], e["payload"]) for e in closing] == [
        ("session.close", {"reason": "client_close"}),
        ("session.subagent.cancelled", closing[1]["payload"]),
        ("session.sandbox.stop", {**stop, "reason": "session_close"}),
        ("session.sandbox.error", {**stop, "phase": "stop", "detail": "the sandbox host is unavailable",
                                   "unsandboxed": False}),
    ]
    kinds = types(session.events())
    assert all(kinds.count(kind) == 1 for kind in kinds if kind.startswith("session.sandbox.") or
               kind in ("session.close", "session.subagent.cancelled"))
    assert stack.admin.get(f"/admin/v1/sessions/{session.sid}").json()["state"] == "closed"


def test_a_vanished_sandbox_is_logged_stopped_once(stack, image):
    """A container removed behind the server's back: the owner logs the session's sandbox as
    stopped (reason `vanished`) within two intervals, and later passes log nothing more."""
    session = Session(stack, image)
    before = len(session.events())
    session.container.remove(force=True)

    deadline = time.monotonic() + 2 * INTERVAL
    while "session.sandbox.stopped" not in types(session.events()[before:]):
        assert time.monotonic() < deadline, f"no stopped event two intervals on: {types(session.events())}"
        time.sleep(0.1)
    stop = {"image": image, "sandbox_id": session.container.id, "reason": "vanished", "dispatch": "remote"}
    logged = [(e["event_type"], e["payload"], e["client_key_id"]) for e in session.events()[before:]]
    assert logged == [("session.sandbox.stop", stop, None),
                      ("session.sandbox.stopped", {**stop, "unsandboxed": False}, None)]

    # A later pass has run once the container of an unknown session is gone: it logged nothing more.
    start_orphan(stack, image, "ses_unknown_to_the_store")
    assert gone_within("bae.session_id=ses_unknown_to_the_store", 2 * INTERVAL)
    assert [(e["event_type"], e["payload"], e["client_key_id"]) for e in session.events()[before:]] == logged
    # The session holds no sandbox any more, and may start another.
    assert session.call("session.execRemoteSandbox", {"command": "true"})[-1]["error"] == {
        "code": -32013, "message": "sandbox_not_running: no remote sandbox is running for this session"}
    session.ok("session.startRemoteSandbox", {"image": image})
    assert session.ok("session.execRemoteSandbox", {"command": "echo again"})["stdout"] == "again\n"
    session.close()


@pytest.mark.postgres
def test_two_replicas_stop_each_stray_once_and_each_owner_logs_its_own_vanished_sandbox(start_stack, mock, image,
                                                                                      postgres_url):  # noqa: F811
    """Two replicas on one PostgreSQL store pass every interval: each container of an unknown session
    is stopped by one of them, once; each session's vanished sandbox is logged by its owner, once."""
    mock.reset()
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN="t0ken-for-tests",
                        BAE_SANDBOX_HOST_ID=f"{RUN}-{next(_stacks)}", BAE_RECONCILE_INTERVAL=str(INTERVAL),
                        BAE_DATABASE_URL=postgres_url, BAE_SESSION_REPLICAS="2",
                        BAE_SESSION_GRPC_ADDR=f"127.0.0.1:{consecutive_ports(2)}")
    keys = [new_key(stack, image) for _ in range(2)]
    # A replica provisions the images of profiles created elsewhere only when it starts.
    for replica in ("session", "session-1"):
        stack.stack.restart(replica)
    sessions = [opened_after_restart(stack, image, key) for key in keys]  # each on the replica holding fewest
    befores = [len(session.events()) for session in sessions]
    for session in sessions:
        session.container.remove(force=True)
    strays = [start_orphan(stack, image, f"ses_unknown_{n}") for n in range(3)]

    for n in range(3):
        assert gone_within(f"bae.session_id=ses_unknown_{n}", 2 * INTERVAL)
    deadline = time.monotonic() + 2 * INTERVAL
    while not all("session.sandbox.stopped" in types(s.events()[b:]) for s, b in zip(sessions, befores)):
        assert time.monotonic() < deadline, "a vanished sandbox was not logged two intervals on"
        time.sleep(0.1)
    # Later passes of both replicas have run once a new stray is gone.
    start_orphan(stack, image, "ses_unknown_later")
    assert gone_within("bae.session_id=ses_unknown_later", 2 * INTERVAL)

    logs = "".join(log.read_text() for log in (stack.tmp / "logs").glob("session*.log"))
    for stray in strays:
        assert logs.count(f"stopping sandbox {stray} of unknown session") == 1, stray
    for session, before in zip(sessions, befores):
        assert types(session.events()[before:]) == ["session.sandbox.stop", "session.sandbox.stopped"]
        assert logs.count(f"sandbox {session.container.id} of session {session.sid} vanished") == 1
