"""What the compose tests (deploy/compose-test/) share: a compose project driven from the host, and a client
of its published port.

The tests run through `make compose-test` (deploy/compose-test/run.sh), which builds the images and
sets the environment: the compose command (COMPOSE), the project name, the
published ports of the gateway and of the mock LLM.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

import docker
import httpx
from docker.models.containers import Container

from dataclasses import dataclass
from typing import Callable, Literal

from testkit import ROOT
from testkit.live import result, rpc

MOCK_URL = f"http://127.0.0.1:{os.environ.get('BAE_E2E_MOCK_PORT', '9100')}"
IMAGE = os.environ.get("BAE_TEST_IMAGE", "bae-busybox:test")
STOP_SECONDS = "40"
SHELL_TOOL = {
    "name": "sh",
    "description": "run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


def progress(message: str, prefix: str = "compose-test") -> None:
    print(f"{prefix}: {message}", file=sys.stderr, flush=True)


def wait_until(what: str, check, timeout: float = 120.0, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def all_healthy(containers_of: Callable[[str], list[Container]], expected: dict[str, int]) -> bool:
    """Whether each service has exactly its expected number of running containers, each healthy."""
    for service, count in expected.items():
        running = containers_of(service)
        states = [c.attrs["State"].get("Health", {}).get("Status") for c in running]
        if len(running) != count or any(state != "healthy" for state in states):
            return False
    return True


class Project:
    """One compose project: its files, its name and the variables its commands get on top of run.sh's."""

    def __init__(self, name: str, files: list[str], env: dict[str, str] | None = None,
                 env_file: str | None = None) -> None:
        """`env_file` stands for the .env beside docker-compose.yml (compose's `--env-file`)."""
        self.name = name
        self.command = [*shlex.split(os.environ.get("COMPOSE", "docker-compose")), "-p", name]
        if env_file is not None:
            self.command += ["--env-file", env_file]
        for file in files:
            self.command += ["-f", file]
        self.env = {**os.environ, **(env or {})}

    def compose(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([*self.command, *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=600)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def containers(self, service: str | None = None, all: bool = False) -> list:
        labels = [f"com.docker.compose.project={self.name}"]
        if service is not None:
            labels.append(f"com.docker.compose.service={service}")
        return docker.from_env().containers.list(all=all, filters={"label": labels})

    def all_healthy(self, expected: dict[str, int]) -> bool:
        return all_healthy(self.containers, expected)

    def volumes(self) -> set[str]:
        found = docker.from_env().volumes.list(filters={"label": f"com.docker.compose.project={self.name}"})
        return {volume.name for volume in found}


class Deployment:
    """A client of one gateway address (the published port), and the mock LLM's control port."""

    def __init__(self, gateway_url: str) -> None:
        self.client = httpx.Client(base_url=gateway_url, timeout=60)
        self.mock = httpx.Client(base_url=MOCK_URL, timeout=10)
        self.key = ""
        self.profile: dict = {}
        self.session_ids: list[str] = []

    def close(self) -> None:
        self.client.close()
        self.mock.close()

    def script(self, *replies: dict) -> None:
        assert self.mock.post("/_mock/enqueue", json=list(replies)).status_code == 200

    def open_session(self) -> tuple[str, str]:
        response = self.client.post("/api/v1/sessions", json={"tools": [
            {"name": "get_time", "description": "the time", "input_schema": {"type": "object"}}
        ], "sandbox_tools": [SHELL_TOOL]}, headers={"Authorization": f"Bearer {self.key}"})
        assert response.status_code == 201, response.text
        opened = response.json()
        self.session_ids.append(opened["session_id"])
        sid, skey = opened["session_id"], opened["session_key"]
        assert result(rpc(self.client, sid, skey, "session.registerDriver")) == {"registered": True}
        return sid, skey

    def events(self, sid: str, skey: str, client: httpx.Client | None = None) -> list[dict]:
        response = (client or self.client).get(f"/api/v1/sessions/{sid}/events",
                                                headers={"Authorization": f"Bearer {skey}"}, params={"limit": 200})
        assert response.status_code == 200, response.text
        return response.json()["items"]

    def send(self, sid: str, skey: str, content, client: httpx.Client | None = None) -> list[dict]:
        return rpc(client or self.client, sid, skey, "session.sendMessage",
                   {"message": {"role": "user", "content": content}})

    def sandbox_host(self, sid: str) -> str:
        """The `bae.host` label of the session's sandbox container: which sandbox replica placed it."""
        found = docker.from_env().containers.list(filters={"label": f"bae.session_id={sid}"})
        assert len(found) == 1, found
        return found[0].labels["bae.host"]


@dataclass
class Failover:
    """What `fault_owner_then_turn` saw: the session's log before the fault and after the next turn, the
    next turn's answer, how long after the fault another replica owned the session and the turn succeeded,
    and the container of the replica the fault struck."""

    before: list[dict]
    after: list[dict]
    outcome: dict
    takeover: float
    failover: float
    victim: Container


def fault_owner_then_turn(deployment: Deployment, sid: str, skey: str, *, owner_of: Callable[[str], list[str]],
                          container_at: Callable[[str], Container], say: Callable[[str], None],
                          fault: Literal["kill", "pause"] = "kill") -> Failover:
    """Run a turn, `docker kill` (SIGKILL) or `docker pause` (frozen: its connections stay open and
    answer nothing, as a lost host's do) the session replica that owns the session, wait for another
    replica to take it over, then run the next turn as a client does after a failover, until it succeeds."""
    deployment.script({"text": "before"})
    result(deployment.send(sid, skey, f"before the {fault}"))
    before = deployment.events(sid, skey)
    (owner,) = owner_of(sid)
    victim = container_at(owner)
    say(f"docker {fault} {victim.name} (owns {sid})")
    getattr(victim, fault)()
    struck = time.monotonic()
    wait_until("another replica to take the session over", lambda: owner_of(sid) not in ([], [owner]),
               timeout=30, every=0.2)
    takeover = time.monotonic() - struck
    say(f"takeover: another replica owned the session {takeover:.1f}s after the {fault}")

    deployment.script({"text": "after"})
    failures: list[str] = []

    def next_turn() -> dict | None:
        # What a client does after a failover: its driver registration was the dead replica's memory.
        try:
            result(rpc(deployment.client, sid, skey, "session.registerDriver"))
            return result(deployment.send(sid, skey, f"after the {fault}"))
        except (AssertionError, httpx.HTTPError) as error:
            failures.append(str(error)[:300])
            return None

    try:
        outcome = wait_until("the next turn on another replica", next_turn, timeout=60, every=0.5)
    finally:
        say(f"failed attempts: {len(failures)}; the last: {failures[-1:]}")
    failover = time.monotonic() - struck
    say(f"failover: the next turn succeeded {failover:.1f}s after the {fault}")
    return Failover(before, deployment.events(sid, skey), outcome, takeover, failover, victim)
