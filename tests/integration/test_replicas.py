"""Several session replicas on one PostgreSQL store, behind two gateways.

Each open session is owned by one replica (a lease in the store); a gateway
sends a call to the owner, and a replica that does not own a session refuses
its calls with the owner's address before acting on them. A replica killed
with SIGKILL loses its leases when its heartbeat expires; another replica
takes its sessions, with every event kept once and a parked turn abandoned.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import asyncpg
import httpx
import pytest

from testkit import ROOT
from testkit.docker_support import TEST_IMAGE, require_docker, sandboxes_of_hosts, stack_with_sandbox_hosts
from testkit.live import declared, join, new_session, register, result, rpc, send, turn_in_background, types
from testkit.mockllm import Reply
from testkit.ports import consecutive_ports, free_port
from testkit.streams import Listener, deltas_of, events_of
from testkit.postgres_support import postgres, postgres_url  # noqa: F401 - fixtures
from testkit.stack import mock_provider_toml

pytestmark = [pytest.mark.stack, pytest.mark.docker, pytest.mark.postgres]

TOKEN = "sk-test-secret-token-123456"
LEASE_SECONDS = 2


def event_log(stack, sid: str, skey: str) -> list[dict]:
    page = stack.client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200},
                            headers={"Authorization": f"Bearer {skey}"})
    assert page.status_code == 200, page.text
    return page.json()["items"]


@pytest.fixture
def replicated(start_stack, mock, postgres_url):  # noqa: F811 - the fixture
    mock.reset()
    port = consecutive_ports(2)
    return start_stack(
        config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
        BAE_DATABASE_URL=postgres_url, BAE_SESSION_REPLICAS="2", BAE_SESSION_GRPC_ADDR=f"127.0.0.1:{port}",
        BAE_SESSION_LEASE_SECONDS=str(LEASE_SECONDS), BAE_TURN_TIMEOUT="300",
    )


class Gateway:
    """A second gateway of the same stack, on ports of its own."""

    def __init__(self, stack) -> None:
        self.addr = f"127.0.0.1:{free_port()}"
        env = {**stack.stack.env, "BAE_ADDR": self.addr, "BAE_ADMIN_ADDR": f"127.0.0.1:{free_port()}"}
        self.process = subprocess.Popen([sys.executable, "-m", "bae", "gateway"], cwd=ROOT, env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = httpx.Client(base_url=f"http://{self.addr}", timeout=30)
        deadline = time.monotonic() + 20
        while True:
            try:
                if self.client.get("/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the second gateway did not start"
            time.sleep(0.05)

    def close(self) -> None:
        self.client.close()
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture
def gateway2(replicated):
    gateway = Gateway(replicated)
    yield gateway
    gateway.close()


class Via:
    """The stack as seen through another gateway (what live.py's helpers need)."""

    def __init__(self, stack, gateway: Gateway) -> None:
        self.client = gateway.client
        self.admin = stack.admin


def owners(stack) -> dict[str, str]:
    """session id -> address of the replica holding its lease, read from the store."""

    async def read() -> dict[str, str]:
        url = stack.stack.env["BAE_DATABASE_URL"]
        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch("SELECT session_id, replica_id FROM session_leases")
        finally:
            await conn.close()
        return {row["session_id"]: row["replica_id"] for row in rows}

    return asyncio.run(read())


def replica_addresses(stack) -> dict[str, str]:
    """replica address -> its process name in the stack."""
    host, _, port = stack.stack.env["BAE_SESSION_GRPC_ADDR"].rpartition(":")
    return {f"{host}:{port}": "session", f"{host}:{int(port) + 1}": "session-1"}


def kill_owner_and_wait_for_takeover(stack, sid: str) -> None:
    """SIGKILL the replica that owns `sid`; return once the other one holds its lease."""
    owner = replica_addresses(stack)[owners(stack)[sid]]
    stack.stack.processes[owner].send_signal(signal.SIGKILL)
    stack.stack.processes[owner].wait(10)
    deadline = time.monotonic() + LEASE_SECONDS + 15
    while replica_addresses(stack)[owners(stack)[sid]] == owner:
        assert time.monotonic() < deadline, "the session was not taken over"
        time.sleep(0.1)


def assert_each_event_once(events: list[dict]) -> None:
    ids = Counter(event["id"] for event in events)
    assert max(ids.values(), default=1) == 1


def test_more_than_one_replica_needs_postgresql(tmp_path):
    env = {**os.environ, "BAE_SESSION_REPLICAS": "2", "BAE_DB_PATH": str(tmp_path / "bae.db")}
    env.pop("BAE_DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-m", "bae", "run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "BAE_SESSION_REPLICAS=2" in done.stderr and "postgresql://" in done.stderr


def test_sessions_spread_over_replicas_and_either_gateway_reaches_them(replicated, gateway2, mock):
    stack = replicated
    opened = [new_session(stack) for _ in range(4)]
    held = owners(stack)
    # Each new session went to the replica holding fewest: two each.
    assert sorted(Counter(held[sid] for sid, _, _ in opened).values()) == [2, 2]
    other = Via(stack, gateway2)
    for index, (sid, skey, _) in enumerate(opened):
        register(other, sid, skey)
        mock.enqueue(Reply.text(f"via two {index}"), Reply.text(f"via one {index}"))
        assert result(send(other, sid, skey, "hello"))["message"]["content"][0]["text"] == f"via two {index}"
        assert result(send(stack, sid, skey, "again"))["message"]["content"][0]["text"] == f"via one {index}"
        events = event_log(stack, sid, skey)
        assert_each_event_once(events)
        assert types(events).count("server.message.send") == 2
    assert owners(stack) == held  # nothing moved: every call reached the owner


def test_a_keys_open_session_quota_holds_across_replicas_and_gateways(replicated, gateway2):
    """The count comes from the store, under a lock on the key's row: racing opens on both
    replicas, through both gateways, never take the key past its quota."""
    stack = replicated
    profile = stack.create_profile("quota", allowed_tools=[], limits={"max_open_sessions_per_key": 3})
    key = stack.create_key(profile["id"])["key"]
    clients = [stack.client, gateway2.client] * 4

    def open_one(client: httpx.Client) -> httpx.Response:
        return client.post("/api/v1/sessions", json={}, headers={"Authorization": f"Bearer {key}"})

    with ThreadPoolExecutor(len(clients)) as pool:
        answers = list(pool.map(open_one, clients))
    assert sorted(a.status_code for a in answers) == [201] * 3 + [429] * 5, [a.text for a in answers]
    assert {a.json()["detail"] for a in answers if a.status_code == 429} == {
        "quota_exceeded: max_open_sessions_per_key 3 reached"}
    assert open_one(gateway2.client).status_code == 429


def test_two_drivers_on_two_gateways_take_turns_in_arrival_order(replicated, gateway2, mock):
    stack = replicated
    sid, a_key, profile = new_session(stack)
    b_key = join(stack, sid, profile)
    other = Via(stack, gateway2)
    register(stack, sid, a_key)
    register(other, sid, b_key)
    mock.enqueue(Reply.hang(1.5), Reply.text("for b"))
    first, first_outcome = turn_in_background(stack, sid, a_key, "from a")
    deadline = time.monotonic() + 15
    while len(mock.requests) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    second, second_outcome = turn_in_background(other, sid, b_key, "from b")
    first.join(30)
    second.join(30)
    assert result(first_outcome["frames"])["message"]["content"][0]["text"] == "ok"
    assert result(second_outcome["frames"])["message"]["content"][0]["text"] == "for b"
    events = event_log(stack, sid, a_key)
    sends = [(e["event_type"], e["payload"].get("content")) for e in events
             if e["event_type"] in ("client.message.send", "server.message.send")]
    # B's message waited at the owner for A's turn to end.
    assert [kind for kind, _ in sends] == ["client.message.send", "server.message.send"] * 2
    assert sends[0][1] == "from a" and sends[2][1] == "from b"


def test_a_subscriber_on_the_other_gateway_gets_the_same_deltas(replicated, gateway2, mock):
    """Deltas travel with the owner's feed: an observer on any gateway, whichever replica it first
    reached, gets what the driver's own stream gets, a late one its catch-up first."""
    stack = replicated
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    resume = threading.Event()
    text = "one two three four five six"
    mock.enqueue(Reply.text(text).streaming(pause_at=3, resume=resume))
    params = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe", "params": {"deltas": True}}
    auth = {"Authorization": f"Bearer {skey}"}
    path = f"/api/v1/sessions/{sid}/rpc"
    with Listener(str(gateway2.client.base_url), "POST", path, headers=auth, json_body=params) as early:
        thread, outcome = turn_in_background(stack, sid, skey, "count")
        early.wait_for(lambda items: len(deltas_of(items)) == 3)
        with Listener(str(gateway2.client.base_url), "GET", f"/api/v1/sessions/{sid}/events/stream",
                      headers=auth, params={"deltas": "true"}, sse=True) as late:
            late.wait_for(lambda items: len(deltas_of(items)) == 1)
            resume.set()
            thread.join(30)
            done = lambda items: "server.message.send" in types(events_of(items))  # noqa: E731
            late_items, early_items = late.wait_for(done), early.wait_for(done)
    request_id = next(e["id"] for e in result(outcome["frames"])["events"] if e["event_type"] == "provider.request")
    whole = deltas_of(early_items)
    assert [(d["seq"], d["request_event_id"]) for d in whole] == [(seq, request_id) for seq in range(6)]
    assert "".join(d["text"] for d in whole) == text
    catch_up, *rest = deltas_of(late_items)
    assert (catch_up["seq"], catch_up["text"]) == (2, "one two three ")
    assert rest == whole[3:]


def test_a_revocation_on_any_replica_reaches_the_owner(replicated, mock):
    """Admin calls go to either replica; each session's owner ends its live streams."""
    stack = replicated
    sessions = [new_session(stack) for _ in range(2)]
    held = owners(stack)
    assert len({held[sid] for sid, _, _ in sessions}) == 2  # one on each replica
    subscriptions = []
    for sid, skey, _ in sessions:
        register(stack, sid, skey)
        subscriptions.append(Subscription(stack, sid, skey))
    for sid, skey, _ in sessions:
        (client_key_id,) = {e["client_key_id"] for e in event_log(stack, sid, skey)
                            if e["event_type"] == "session.open"}
        assert stack.admin.delete(f"/admin/v1/keys/{client_key_id}").status_code == 204
    for subscription in subscriptions:
        # The owner published the close and ended the live stream, wherever the revocation ran.
        lines = subscription.finish()
        assert any(line.get("params", {}).get("event_type") == "session.close" for line in lines), lines


class Subscription:
    """A `session.subscribe` stream read on a thread until it ends."""

    def __init__(self, stack, sid: str, skey: str) -> None:
        self.lines: list[dict] = []
        self.thread = threading.Thread(target=self._read, args=(stack, sid, skey))
        self.thread.start()
        time.sleep(0.3)

    def _read(self, stack, sid, skey) -> None:
        self.lines = rpc(stack.client, sid, skey, "session.subscribe")

    def finish(self) -> list[dict]:
        self.thread.join(20)
        assert not self.thread.is_alive(), "the subscription did not end"
        return self.lines


def test_a_replica_killed_mid_turn_loses_no_session_and_its_driver_keeps_driving(replicated, gateway2, mock):
    """kill -9 the owner during a turn: the same client sends its next message through the other gateway,
    with no new registration, and gets its turn; the tools it declared before the kill (the last
    updateClientTools included) are the ones offered to the provider after it."""
    stack = replicated
    sid, skey, _ = new_session(stack, tools=("get_time", "lookup"))
    register(stack, sid, skey)
    updated = rpc(stack.client, sid, skey, "session.updateClientTools", {"tools": declared(("lookup",))})
    assert result(updated) == {"updated": True}
    mock.enqueue(Reply.text("first"))
    assert result(send(stack, sid, skey, "one"))["message"]["content"][0]["text"] == "first"
    offered = [tool["name"] for tool in mock.requests[-1]["body"]["tools"]]
    owner = replica_addresses(stack)[owners(stack)[sid]]
    mock.enqueue(Reply.hang(3))
    thread, outcome = turn_in_background(stack, sid, skey, "two")
    deadline = time.monotonic() + 15
    while types(before := event_log(stack, sid, skey))[-1] != "provider.request":
        assert time.monotonic() < deadline
        time.sleep(0.05)

    killed_at = time.monotonic()
    stack.stack.processes[owner].send_signal(signal.SIGKILL)
    stack.stack.processes[owner].wait(10)
    thread.join(30)
    assert "result" not in (outcome.get("frames") or [{}])[-1]

    # The survivor takes the session once the lease lapses; until then calls are refused (503), never lost.
    mock.enqueue(Reply.text("after the failover"))
    other = Via(stack, gateway2)
    while True:
        response = other.client.post(
            f"/api/v1/sessions/{sid}/rpc", headers={"Authorization": f"Bearer {skey}"},
            json={"jsonrpc": "2.0", "id": 1, "method": "session.sendMessage",
                  "params": {"message": {"role": "user", "content": "three"}}},
        )
        if response.status_code == 200:
            break
        assert response.status_code == 503, response.text
        assert time.monotonic() - killed_at < LEASE_SECONDS + 10, "no replica took the session over"
        time.sleep(0.1)
    failover = time.monotonic() - killed_at
    after = [json.loads(line) for line in response.text.splitlines()][-1]
    assert after["result"]["message"]["content"][0]["text"] == "after the failover", after
    assert failover < LEASE_SECONDS + 10
    assert [tool["name"] for tool in mock.requests[-1]["body"]["tools"]] == offered == ["lookup"]
    participants = other.client.get(f"/api/v1/sessions/{sid}/participants",
                                    headers={"Authorization": f"Bearer {skey}"}).json()
    assert participants["drivers"] == [before[0]["client_key_id"]]

    events = event_log(stack, sid, skey)
    assert_each_event_once(events)
    assert events[: len(before)] == before
    assert types(events[len(before):]) == [
        "client.message.send", "provider.request", "provider.response", "server.message.send",
    ]
    survivor = next(address for address, name in replica_addresses(stack).items() if name != owner)
    assert owners(stack)[sid] == survivor


def test_a_turn_paused_on_a_killed_replica_is_abandoned_on_the_next(replicated, mock):
    """The pause lived in the dead owner's memory: the new owner holds it again, expired, and another
    driver's message answers it with synthetic results, so the provider never sees an unanswered tool_use."""
    stack = replicated
    profile = stack.create_profile(f"p{time.monotonic_ns()}", allowed_tools=["lookup"])
    a_key = stack.create_key(profile["id"], name="a")
    opened = stack.open_session(a_key["key"], tools=declared(("lookup",)))
    sid, a = opened["session_id"], opened["session_key"]
    b = join(stack, sid, profile)
    register(stack, sid, a)
    mock.enqueue(Reply.tool_use([("tu_1", "lookup", {"q": 1})]))
    assert result(send(stack, sid, a, "look"))["message"]["content"][0]["dispatch"] == "client"

    # The survivor adopts the session by itself once the lease lapses (no call needed).
    kill_owner_and_wait_for_takeover(stack, sid)

    register(stack, sid, b)
    mock.enqueue(Reply.text("moved on"))
    outcome = result(send(stack, sid, b, "carry on"))
    assert outcome["message"]["content"][0]["text"] == "moved on"
    assert types(outcome["events"])[:2] == ["client.message.send", "tool.result"]
    events = event_log(stack, sid, b)
    assert_each_event_once(events)
    errors = [e["payload"] for e in events if e["event_type"] == "session.error"]
    assert errors == [{"reason": "driver_turn_abandoned", "owner_client_key_id": a_key["id"]}]
    sent = mock.requests[-1]["body"]["messages"]
    (asked,) = [i for i, m in enumerate(sent) if isinstance(m["content"], list)
                and any(b.get("type") == "tool_use" for b in m["content"])]
    answered = [b.get("tool_use_id") for b in sent[asked + 1]["content"] if b.get("type") == "tool_result"]
    assert answered == ["tu_1"]


def children(pid: int) -> dict[int, str]:
    """pid -> command line of the processes `pid` started."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            found[int(entry)] = command
    return found


def test_bae_run_restarts_a_replica_that_dies(tmp_path, mock, postgres_url):  # noqa: F811 - the fixture
    from testkit.stack import stack_env

    port = consecutive_ports(2)
    config = tmp_path / "bae-config.toml"
    config.write_text(mock_provider_toml(mock.base_url))
    env = stack_env(tmp_path, BAE_DATABASE_URL=postgres_url, BAE_SESSION_REPLICAS="2",
                    BAE_SESSION_GRPC_ADDR=f"127.0.0.1:{port}", BAE_CONFIG=str(config), MOCK_LLM_TOKEN=TOKEN)
    launcher = subprocess.Popen([sys.executable, "-m", "bae", "run"], cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert launcher.stdout is not None
        for line in launcher.stdout:
            if "Press Ctrl-C" in line:
                break
        replicas = {pid: command for pid, command in children(launcher.pid).items() if "session serve" in command}
        assert len(replicas) == 2
        victim = sorted(replicas)[1]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            now = {pid for pid, command in children(launcher.pid).items() if "session serve" in command}
            if len(now) == 2 and victim not in now:
                break  # started again
            assert launcher.poll() is None, "the launcher stopped the stack"
            assert time.monotonic() < deadline, "the dead replica was not started again"
            time.sleep(0.1)
        client = httpx.Client(base_url=f"http://{env['BAE_ADDR']}", timeout=10)
        deadline = time.monotonic() + 30
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        client.close()
    finally:
        launcher.send_signal(signal.SIGTERM)
        _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, stderr
    assert "starting it again" in stderr


def test_metrics_sum_every_replica(start_stack, mock, postgres_url):  # noqa: F811 - the fixture
    telemetry = (f'[telemetry]\nenabled = true\notlp_endpoint = "http://127.0.0.1:{free_port()}"\n'
                 "[telemetry.metrics]\nenabled = true\n")
    stack = start_stack(
        config_toml=mock_provider_toml(mock.base_url) + telemetry, MOCK_LLM_TOKEN=TOKEN,
        BAE_DATABASE_URL=postgres_url, BAE_SESSION_REPLICAS="2",
        BAE_SESSION_GRPC_ADDR=f"127.0.0.1:{consecutive_ports(2)}",
    )
    opened = [new_session(stack) for _ in range(2)]
    assert len({owners(stack)[sid] for sid, _, _ in opened}) == 2
    lines = [line for line in stack.admin.get("/metrics").text.splitlines() if line.startswith("bae_sessions_open")]
    assert lines and float(lines[0].split()[-1]) == 2, lines


def test_a_sandbox_moves_with_its_session_when_the_owner_dies(tmp_path, mock, postgres_url):  # noqa: F811
    require_docker()
    mock.reset()
    host = f"test-replicas-{uuid.uuid4().hex[:8]}"
    env = {"MOCK_LLM_TOKEN": TOKEN, "BAE_DATABASE_URL": postgres_url, "BAE_SESSION_REPLICAS": "2",
           "BAE_SESSION_GRPC_ADDR": f"127.0.0.1:{consecutive_ports(2)}",
           "BAE_SESSION_LEASE_SECONDS": str(LEASE_SECONDS), "BAE_SANDBOX_HOST_ID": host}
    with stack_with_sandbox_hosts(tmp_path, mock.base_url, host, **env) as stack:
        profile = stack.create_profile("sandboxed", available_sandboxes=[TEST_IMAGE])
        opened = stack.open_session(stack.create_key(profile["id"])["key"])
        sid, skey = opened["session_id"], opened["session_key"]
        register(stack, sid, skey)
        started = result(rpc(stack.client, sid, skey, "session.startRemoteSandbox", {"image": TEST_IMAGE}))
        command = {"command": "echo kept > /tmp/mark"}
        assert result(rpc(stack.client, sid, skey, "session.execRemoteSandbox", command))["exit_code"] == 0

        owner = replica_addresses(stack)[owners(stack)[sid]]
        stack.stack.processes[owner].send_signal(signal.SIGKILL)
        stack.stack.processes[owner].wait(10)
        # The driver's next call takes the session over as soon as the lease lapses, whether or not the
        # survivor's heartbeat adopted it first: the same container is the session's (what the first
        # command wrote is there), with no new registration.
        deadline = time.monotonic() + LEASE_SECONDS + 15
        while True:
            response = stack.client.post(
                f"/api/v1/sessions/{sid}/rpc", headers={"Authorization": f"Bearer {skey}"},
                json={"jsonrpc": "2.0", "id": 1, "method": "session.execRemoteSandbox",
                      "params": {"command": "cat /tmp/mark"}},
            )
            if response.status_code == 200:
                break
            assert response.status_code == 503 and time.monotonic() < deadline, response.text
            time.sleep(0.05)
        ran = [json.loads(line) for line in response.text.splitlines()][-1]["result"]
        assert ran["exit_code"] == 0 and ran["stdout"].strip() == "kept", ran
        assert [c.id for c in sandboxes_of_hosts(host)] and started["sandbox_id"]
        assert stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"}).status_code == 200


def test_a_keys_daily_budget_spent_on_one_replica_holds_on_the_other(replicated, mock):
    """Each replica follows a key's day as it records its charges and reads it again once a second
    old (engine/budgets.py): what one replica spent stops the key's session on the other."""
    stack = replicated
    mock.reset()
    profile = stack.create_profile("daily", allowed_tools=[], limits={"key_daily_tokens": 100})
    key = stack.create_key(profile["id"])["key"]
    opened = [stack.open_session(key, tools=[]) for _ in range(2)]  # the second goes to the other replica
    (first, first_key), (second, second_key) = ((o["session_id"], o["session_key"]) for o in opened)
    held = owners(stack)
    assert held[first] != held[second]
    register(stack, first, first_key)
    register(stack, second, second_key)
    mock.enqueue(Reply.text("on the second", usage=(10, 10)))
    assert result(send(stack, second, second_key, "hi"))["message"]["content"][0]["text"] == "on the second"
    mock.enqueue(Reply.text("on the first", usage=(100, 20)))
    assert result(send(stack, first, first_key, "hi"))["message"]["content"][0]["text"] == "on the first"
    time.sleep(1.1)  # the second replica read the key's day (20) less than a second ago
    assert send(stack, second, second_key, "more")[-1]["error"] == {
        "code": -32051, "message": "budget_exhausted: key_daily_tokens 140/100"}
    assert len(mock.requests) == 2
