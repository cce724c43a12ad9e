"""End to end through docker-compose.replicas.yml: PostgreSQL, two session replicas, two gateways behind haproxy.

Run by deploy/compose-test/run.sh (`make compose-test`) after test_compose.py; the
tests run in file order and share one deployment. Both replicas start at once on an
empty database, so the first tests check what they must not both do (migrate, make
an admin key). Turns go through the load balancer and through each gateway directly;
then the replica that owns a session is killed (SIGKILL) and the session's next turn
must succeed on the other one once the lease (3 s here) has run out, with the log of
events intact.
"""

from __future__ import annotations

import json
import os
import secrets
import sys

import docker
import httpx
import pytest

pytestmark = pytest.mark.compose

if "BAE_E2E_PROJECT" not in os.environ:
    pytest.skip("run through `make compose-test`", allow_module_level=True)

from testkit.compose import STOP_SECONDS, Deployment, Project, fault_owner_then_turn, progress, wait_until  # noqa: E402
from testkit.live import result, types  # noqa: E402

LEASE_SECONDS = 3
# The other replica takes the session over within the lease and a heartbeat or two.
TAKEOVER_BOUND = LEASE_SECONDS + 4
# The next turn: a killed container's address stops answering without a reset; each gateway's
# health probe notices within about two seconds and routes around it (a call that reaches the
# dead owner meanwhile waits for its deadline), and the session is served once taken over.
FAILOVER_BOUND = LEASE_SECONDS + 8
POSTGRES_PASSWORD = secrets.token_hex(24)
PROJECT = Project(f"{os.environ['BAE_E2E_PROJECT']}-replicas", [
    "docker-compose.replicas.yml",
    "deploy/compose-test/docker-compose.test.yml",
    "deploy/compose-test/docker-compose.replicas-test.yml",
], env={"BAE_POSTGRES_PASSWORD": POSTGRES_PASSWORD, "BAE_PUBLISH_ADDR": os.environ["BAE_REPLICAS_PUBLISH_ADDR"]})
LB_URL = f"http://{os.environ['BAE_REPLICAS_PUBLISH_ADDR']}"
TEXT_TURN = ["client.message.send", "provider.request", "provider.response", "server.message.send"]
compose, containers = PROJECT.compose, PROJECT.containers


def turns(events: list[dict]) -> list[str]:
    """The types of the events from the first turn on (what comes before is the session's opening)."""
    logged = types(events)
    return logged[logged.index("client.message.send"):]


def baectl(*args: str) -> dict:
    return json.loads(compose("exec", "-T", "gateway", "baectl", *args, "--json").stdout)


def sql(query: str) -> list[str]:
    """Rows of `query` on the store, as psql prints them unaligned (over the container's socket, no password)."""
    done = compose("exec", "-T", "postgres", "psql", "--no-psqlrc", "-d", "bae", "-At", "-c", query)
    return done.stdout.splitlines()


def owner_of(sid: str) -> list[str]:
    return sql(f"SELECT r.address FROM session_leases l JOIN replicas r ON r.id = l.replica_id "
               f"WHERE l.session_id = '{sid}'")


def gateway_urls() -> list[str]:
    """Each gateway replica's own published address."""
    urls = []
    for container in containers("gateway"):
        (binding,) = container.ports["8080/tcp"]
        urls.append(f"http://{binding['HostIp']}:{binding['HostPort']}")
    return sorted(urls)


def container_at(address: str):
    """The session replica whose container has the host of `address` (a replica's id is its address)."""
    host = address.rpartition(":")[0]
    for container in containers("session"):
        networks = container.attrs["NetworkSettings"]["Networks"].values()
        if any(network["IPAddress"] == host for network in networks):
            return container
    raise AssertionError(f"no session replica at {address}")


@pytest.fixture(scope="module")
def stack(request):
    progress(f"docker-compose up ({PROJECT.name}): 2 session replicas, 2 gateways, haproxy, PostgreSQL")
    compose("down", "-v", "--remove-orphans", "-t", "5", check=False)
    deployment = Deployment(LB_URL)
    try:
        compose("up", "-d")
        wait_until("every service healthy", lambda: PROJECT.all_healthy(
            {"gateway": 2, "session": 2, "postgres": 1, "runner": 1, "sandbox": 1, "mockllm": 1}))
        wait_until("haproxy answering", lambda: _ready(deployment.client), timeout=30, every=0.5)
        progress("replicas stack healthy")
    except BaseException:
        print(compose("logs", "--no-color", "--tail", "150", check=False).stdout, file=sys.stderr)
        compose("down", "-v", "--remove-orphans", "-t", STOP_SECONDS, check=False)
        deployment.close()
        raise
    try:
        yield deployment
    finally:
        if request.session.testsfailed:
            print(compose("logs", "--no-color", "--tail", "150", check=False).stdout, file=sys.stderr)
        compose("down", "-v", "--remove-orphans", "-t", STOP_SECONDS, check=False)
        deployment.close()


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.HTTPError:
        return False


def test_replicas_starting_together_migrate_once_and_make_one_admin_key(stack):
    # The migrations ran in one replica; the other found the schema at head (an advisory lock orders them).
    logs = [container.logs().decode() for container in containers("session")]
    assert sorted(log.count("applied migration 0001") for log in logs) == [0, 1], logs
    assert sql("SELECT count(*) FROM keys WHERE role = 'admin' AND deleted_at IS NULL") == ["1"]
    assert len(sql("SELECT id FROM replicas")) == 2
    # The database password reached no log.
    assert POSTGRES_PASSWORD not in compose("logs", "--no-color").stdout


def test_turns_through_the_load_balancer_and_each_gateway(stack):
    profile = baectl("profiles", "create", "--name", "e2e", "--primary-provider", "mock", "--allowed-tool", "get_time")
    key = baectl("keys", "create", "--name", "e2e", "--profile-id", profile["id"])
    stack.profile, stack.key = profile, key["key"]
    urls = gateway_urls()
    assert len(urls) == 2
    sid, skey = stack.open_session()
    entries = [stack.client, *(httpx.Client(base_url=url, timeout=60) for url in urls)]
    try:
        for number, client in enumerate(entries):
            stack.script({"text": f"answer {number}"})
            outcome = result(stack.send(sid, skey, f"question {number}", client=client))
            assert outcome["message"]["content"] == [{"type": "text", "text": f"answer {number}"}]
            assert types(outcome["events"]) == TEXT_TURN
        logs = [stack.events(sid, skey, client=client) for client in entries]
        assert logs[1] == logs[0] and logs[2] == logs[0]
        assert turns(logs[0]) == TEXT_TURN * len(entries)
    finally:
        for client in entries[1:]:
            client.close()
    # Sessions opened through the load balancer land on both replicas (each new one on the least loaded).
    for _ in range(3):
        stack.open_session()
    owners = sql("SELECT DISTINCT replica_id FROM session_leases")
    assert len(owners) == 2, owners


def test_killed_replica_its_session_goes_on_on_the_other(stack):
    sid, skey = stack.open_session()
    seen = fault_owner_then_turn(stack, sid, skey, owner_of=owner_of, container_at=container_at, say=progress)
    assert seen.takeover < TAKEOVER_BOUND
    assert seen.outcome["message"]["content"] == [{"type": "text", "text": "after"}]
    assert seen.failover < FAILOVER_BOUND
    # Nothing lost, nothing twice: the log is the first turn, then the one that succeeded.
    assert seen.after[: len(seen.before)] == seen.before
    assert turns(seen.before) == TEXT_TURN
    # Then the turn once, after the driver's registrations that reached the new owner.
    assert [kind for kind in types(seen.after[len(seen.before):]) if kind != "session.driver.register"] == TEXT_TURN
    assert len({event["id"] for event in seen.after}) == len(seen.after)


def test_down_leaves_nothing_behind(stack):
    compose("down", "-v", "--remove-orphans", "-t", STOP_SECONDS)
    assert containers(all=True) == []
    leftover = [c for s in stack.session_ids for c in docker.from_env().containers.list(
        all=True, filters={"label": f"bae.session_id={s}"})]
    assert leftover == []
    assert PROJECT.volumes() == set()
