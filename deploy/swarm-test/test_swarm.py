"""End to end through the Docker Swarm stack (deploy/swarm/stack.yml) on a one-node swarm.

Run by deploy/swarm-test/run.sh (`make swarm-test`), which builds the images, creates the
secrets and sets the environment. The tests run in file order and share one deployment:
two session replicas, two gateways, the runner, the sandbox host (global, on the labelled
node), PostgreSQL and the scripted mock LLM. Turns, an Auto sandbox tool among them, go
through the gateways' published ports; the session service is scaled to three; the task
that owns a session is killed and the next turn must succeed once the lease (3 s here) has
run out, every event once; so must the next turn when the owner is frozen (`docker pause`) instead,
and the owner, thawed, leaves the session to its new one. The last test removes the stack and finds
nothing of it left.

One thing of the stack file is changed: the gateways' port. Swarm's routing mesh, like any
service's virtual IP, is made by the kernel's IPVS, and the kernel of the machines this runs
on in CI has none (no `ip_vs`: connections to a virtual IP go nowhere). So each gateway task
publishes a port of its own on the node (`mode: host`), as docs/guides/deploying.md shows
for such kernels, and the tests use both. Everything internal is found by DNS
(`endpoint_mode: dnsrr`) in the stack file itself, so it runs as written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import docker
import httpx
import pytest
import yaml

pytestmark = pytest.mark.compose

if "BAE_SWARM_STACK" not in os.environ:
    pytest.skip("run through `make swarm-test`", allow_module_level=True)

from testkit import ROOT  # noqa: E402
from testkit.compose import IMAGE, Deployment, all_healthy, fault_owner_then_turn, progress as say, wait_until  # noqa: E402
from testkit.live import result, rpc, types  # noqa: E402

STACK = os.environ["BAE_SWARM_STACK"]
LEASE_SECONDS = 3
# As in the compose replicas test: another replica takes the session over within the lease and
# a heartbeat or two; the next turn follows once each gateway's health probe (every two seconds
# or so) routes around the dead address (a call that reaches it meanwhile waits for its deadline).
TAKEOVER_BOUND = LEASE_SECONDS + 4
FAILOVER_BOUND = LEASE_SECONDS + 8
EXPECTED = {"gateway": 2, "session": 2, "runner": 1, "sandbox": 1, "postgres": 1, "mockllm": 1}
TEXT_TURN = ["client.message.send", "provider.request", "provider.response", "server.message.send"]
SANDBOX_TURN = [
    "client.message.send", "provider.request", "provider.response", "tool.call", "sandbox.request",
    "sandbox.response", "tool.result", "provider.request", "provider.response", "server.message.send",
]
engine = docker.from_env()


def progress(message: str) -> None:
    say(message, prefix="swarm-test")


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def tasks(service: str) -> list:
    """The running containers of one service of the stack."""
    return engine.containers.list(filters={"label": f"com.docker.swarm.service.name={STACK}_{service}"})


def healthy(expected: dict[str, int]) -> bool:
    return all_healthy(tasks, expected)


def execute(container, *command: str) -> str:
    """What `command` printed on stdout in `container`."""
    code, (stdout, stderr) = container.exec_run(list(command), demux=True)
    assert code == 0, f"{command} exited {code}: {stdout!r} {stderr!r}"
    return (stdout or b"").decode()


def baectl(*args: str) -> dict:
    """baectl in a gateway task: it reads the admin key from the stack's secret (BAE_ADMIN_KEY_FILE)."""
    return json.loads(execute(tasks("gateway")[0], "baectl", *args, "--json"))


def sql(query: str) -> list[str]:
    (postgres,) = tasks("postgres")
    return execute(postgres, "psql", "--no-psqlrc", "-d", "bae", "-At", "-c", query).splitlines()


def owner_of(sid: str) -> list[str]:
    return sql(f"SELECT r.address FROM session_leases l JOIN replicas r ON r.id = l.replica_id "
               f"WHERE l.session_id = '{sid}'")


def task_at(address: str):
    """The session task whose container has the host of `address` (a replica's id is its address)."""
    host = address.rpartition(":")[0]
    for container in tasks("session"):
        networks = container.attrs["NetworkSettings"]["Networks"].values()
        if any(network["IPAddress"] == host for network in networks):
            return container
    raise AssertionError(f"no session task at {address}")


def logs(service: str) -> str:
    return run("docker", "service", "logs", "--raw", f"{STACK}_{service}", check=False).stdout


def gateway_urls() -> list[str]:
    """Each gateway task's own port on the node."""
    urls = []
    for container in tasks("gateway"):
        (binding, *_) = container.ports["8080/tcp"]
        urls.append(f"http://127.0.0.1:{binding['HostPort']}")
    return sorted(urls)


def stack_file(folder) -> str:
    """deploy/swarm/stack.yml with the gateways publishing a port per task (the module docstring says why)."""
    stack = yaml.safe_load((ROOT / "deploy/swarm/stack.yml").read_text())
    gateway = stack["services"]["gateway"]
    gateway["ports"] = [{"target": 8080, "protocol": "tcp", "mode": "host"}]
    gateway["deploy"]["endpoint_mode"] = "dnsrr"
    path = folder / "stack.yml"
    path.write_text(yaml.safe_dump(stack, sort_keys=False))
    return str(path)


@pytest.fixture(scope="module")
def stack(request, tmp_path_factory):
    progress(f"docker stack deploy {STACK}: 2 session replicas, 2 gateways, the sandbox host, PostgreSQL")
    deployment = None
    try:
        run("docker", "stack", "deploy", "--resolve-image", "never", "--prune",
            "-c", stack_file(tmp_path_factory.mktemp("swarm")), "-c", "deploy/swarm-test/stack.test.yml", STACK)
        wait_until("every service's tasks healthy", lambda: healthy(EXPECTED), timeout=240, every=2)
        deployment = Deployment(gateway_urls()[0])
        wait_until("a gateway answering on its port", lambda: _ready(deployment.client), timeout=60, every=1)
        progress("stack healthy")
        yield deployment
    except BaseException:
        _print_logs()
        raise
    finally:
        if request.session.testsfailed:
            _print_logs()
        if deployment is not None:
            deployment.close()


def _print_logs() -> None:
    for service in EXPECTED:
        print(f"--- {service}\n{logs(service)[-6000:]}", file=sys.stderr)


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.HTTPError:
        return False


def test_secrets_reach_the_services_as_files_only(stack):
    (gateway, *_) = tasks("gateway")
    token = execute(gateway, "cat", "/run/secrets/internal_token").strip()
    admin_key = execute(gateway, "cat", "/run/secrets/admin_key").strip()
    (postgres,) = tasks("postgres")
    password = execute(postgres, "cat", "/run/secrets/postgres_password").strip()
    assert len(token) == 64 and admin_key.startswith("bae_admin_") and len(password) == 48
    for service in EXPECTED:
        for container in tasks(service):
            environment = "\n".join(container.attrs["Config"]["Env"])
            assert token not in environment and password not in environment and admin_key not in environment
            assert "BAE_INTERNAL_TOKEN=" not in environment
        assert token not in logs(service) and password not in logs(service) and admin_key not in logs(service)
    # The replicas started together on an empty database: one migrated, one took in the admin key's hash.
    session_logs = [container.logs().decode() for container in tasks("session")]
    assert sorted(log.count("applied migration 0001") for log in session_logs) == [0, 1], session_logs
    assert sum("admin key hash loaded from pre-provisioned file" in log for log in session_logs) == 1
    assert sql("SELECT count(*) FROM keys WHERE role = 'admin' AND deleted_at IS NULL") == ["1"]


def test_turns_with_an_auto_sandbox_tool_through_the_published_port(stack):
    profile = baectl("profiles", "create", "--name", "swarm", "--primary-provider", "mock",
                     "--allowed-tool", "get_time", "--sandbox-image", IMAGE)
    stack.profile, stack.key = profile, baectl("keys", "create", "--name", "swarm", "--profile-id", profile["id"])["key"]
    sid, skey = stack.open_session()
    urls = gateway_urls()
    assert len(urls) == 2
    for number, url in enumerate(urls):
        with httpx.Client(base_url=url, timeout=60) as client:
            stack.script({"text": f"hello {number} from the swarm"})
            outcome = result(stack.send(sid, skey, f"hello {number}", client=client))
        assert outcome["message"]["content"] == [{"type": "text", "text": f"hello {number} from the swarm"}]
        assert types(outcome["events"]) == TEXT_TURN

    # The model calls a sandbox tool: the session service runs it in the session's sandbox,
    # which the sandbox host started through its node's Docker socket.
    started = result(rpc(stack.client, sid, skey, "session.startRemoteSandbox", {"image": IMAGE}))
    assert started["image"] == IMAGE
    stack.script({"tool_use": [["tu_1", "sh", {"command": "echo hi from $(hostname)"}]]}, {"text": "done"})
    outcome = result(stack.send(sid, skey, "run it"))
    assert types(outcome["events"]) == SANDBOX_TURN
    rendered = outcome["events"][6]["payload"]
    assert rendered["is_error"] is False and rendered["content"][0]["text"].startswith("hi from ")
    (sandbox,) = engine.containers.list(filters={"label": f"bae.session_id={sid}"})
    assert sandbox.labels["bae.host"].startswith(f"{STACK}-")
    closed = stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"})
    assert closed.status_code == 200, closed.text
    assert engine.containers.list(all=True, filters={"label": f"bae.session_id={sid}"}) == []


def test_the_session_service_scales_to_three(stack):
    progress(f"docker service scale {STACK}_session=3")
    run("docker", "service", "scale", "--detach", f"{STACK}_session=3")
    wait_until("three healthy session tasks", lambda: healthy({"session": 3}), timeout=120, every=2)
    assert len(sql("SELECT address FROM replicas")) >= 3
    # The gateways re-resolve `session` and the new replica, the least loaded, gets new sessions.
    newest = max(tasks("session"), key=lambda container: container.attrs["Created"])
    newest_ip = {network["IPAddress"] for network in newest.attrs["NetworkSettings"]["Networks"].values()}

    def opened_on_the_new_replica() -> bool:
        sid, _ = stack.open_session()
        return any(owner.rpartition(":")[0] in newest_ip for owner in owner_of(sid))

    wait_until("a new session owned by the third replica", opened_on_the_new_replica, timeout=60, every=1)


def test_the_killed_owner_tasks_session_goes_on(stack):
    sid, skey = stack.open_session()
    seen = fault_owner_then_turn(stack, sid, skey, owner_of=owner_of, container_at=task_at, say=progress)
    assert seen.takeover < TAKEOVER_BOUND
    assert seen.outcome["message"]["content"] == [{"type": "text", "text": "after"}]
    assert seen.failover < FAILOVER_BOUND
    # Nothing lost, nothing twice: the first turn, then the one that succeeded, once.
    assert seen.after[: len(seen.before)] == seen.before
    assert [kind for kind in types(seen.after[len(seen.before):]) if kind != "session.driver.register"] == TEXT_TURN
    ids = [event["id"] for event in seen.after]
    assert len(ids) == len(set(ids))
    # Swarm replaces the killed task.
    wait_until("three healthy session tasks again", lambda: healthy({"session": 3}), timeout=120, every=2)


def test_a_frozen_owner_tasks_session_goes_on_and_the_owner_fences_itself_when_it_thaws(stack):
    """`docker pause`: the owner's connections stay open and answer nothing, so no gateway sees a reset.
    Each gateway's health checks find it silent and route around it; its lease lapses and another
    replica takes the session. Thawed, it finds its lease gone and leaves the session alone."""
    sid, skey = stack.open_session()
    seen = fault_owner_then_turn(stack, sid, skey, owner_of=owner_of, container_at=task_at, say=progress,
                                 fault="pause")
    frozen = seen.victim
    try:
        assert seen.takeover < TAKEOVER_BOUND
        assert seen.outcome["message"]["content"] == [{"type": "text", "text": "after"}]
        assert seen.failover < FAILOVER_BOUND
        # Calls that belong to no session, each gateway taking turns over the replicas it resolved: none
        # is sent to the frozen one, whose open connection would hold it to its deadline (a 504).
        for url in gateway_urls():
            with httpx.Client(base_url=url, timeout=60) as client:
                for _ in range(6):
                    opened = client.post("/api/v1/sessions", json={}, headers={"Authorization": f"Bearer {stack.key}"})
                    assert opened.status_code == 201, opened.text
                    closed = client.delete(f"/api/v1/sessions/{opened.json()['session_id']}",
                                           headers={"Authorization": f"Bearer {opened.json()['session_key']}"})
                    assert closed.status_code == 200, closed.text
    finally:
        progress(f"docker unpause {frozen.name}")
        frozen.unpause()
    # Thawed, it does not take the session back: the next turns, through both gateways, run on the new
    # owner, and the log holds every turn once.
    (owner,) = owner_of(sid)
    for number, url in enumerate(gateway_urls()):
        with httpx.Client(base_url=url, timeout=60) as client:
            stack.script({"text": f"thawed {number}"})
            result(rpc(client, sid, skey, "session.registerDriver"))
            outcome = result(stack.send(sid, skey, f"thawed {number}", client=client))
        assert outcome["message"]["content"] == [{"type": "text", "text": f"thawed {number}"}]
    assert owner_of(sid) == [owner]
    after = stack.events(sid, skey)
    assert after[: len(seen.after)] == seen.after
    assert [kind for kind in types(after[len(seen.before):]) if kind != "session.driver.register"] == TEXT_TURN * 3
    assert len({event["id"] for event in after}) == len(after)
    wait_until("three healthy session tasks again", lambda: healthy({"session": 3}), timeout=120, every=2)


def test_removing_the_stack_leaves_nothing_behind(stack):
    progress(f"removing {STACK}")
    run("bash", "deploy/swarm-test/remove.sh", STACK)
    label = {"label": f"com.docker.stack.namespace={STACK}"}
    assert engine.containers.list(all=True, filters=label) == []
    assert engine.volumes.list(filters=label) == []
    assert engine.networks.list(filters=label) == []
    assert [s.name for s in engine.secrets.list() if s.name.startswith(f"{STACK}_")] == []
    sandboxes = engine.containers.list(all=True, filters={"label": "bae.host"})
    assert [c.name for c in sandboxes if c.labels["bae.host"].startswith(f"{STACK}-")] == []
