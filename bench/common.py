"""What every benchmark uses: the mock LLM in a process of its own, a private stack, a client key,
a session, a JSON-RPC call, and the figures' percentiles."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.http1 import Connection
from testkit import ROOT
from testkit.ports import free_port
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

TOKEN = "bench-token"


class MockProcess:
    """The mock LLM in a process of its own, so it shares no interpreter lock with the load generator."""

    def __init__(self, *options: str) -> None:
        """`options`: more of the mock's command line, e.g. "--text-pieces", "200" for a longer answer."""
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "testkit.mockllm", "--port", str(port), *options], cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.base_url, timeout=1)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("the mock LLM did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(int(len(ordered) * q), len(ordered) - 1)]


def report(name: str, samples: list[float], wall: float) -> None:
    print(
        f"{name:<52} p50 {percentile(samples, 0.5) * 1000:7.2f} ms   p99 {percentile(samples, 0.99) * 1000:7.2f} ms"
        f"   {len(samples) / wall:8.0f} req/s   (n={len(samples)})",
        flush=True,
    )


async def load(make_request, concurrency: int, total: int, base_url: str | None = None,
               lean: bool = False) -> tuple[list[float], float]:
    """`total` calls of `make_request(client)` from `concurrency` workers, each with its own
    connection when `base_url` is given (a pool shared by many workers costs the load
    generator more than the server): an httpx client, or with `lean` an http1.Connection."""
    samples: list[float] = []
    remaining = iter(range(total))

    async def worker(client):
        for _ in remaining:
            started = time.perf_counter()
            await make_request(client)
            samples.append(time.perf_counter() - started)

    clients: list = []
    for _ in range(concurrency):  # connected before timing
        if base_url is None:
            clients.append(None)
        elif lean:
            clients.append(await Connection.open(base_url))
        else:
            clients.append(httpx.AsyncClient(base_url=base_url, timeout=30))
            await clients[-1].get("/healthz")
    started = time.perf_counter()
    await asyncio.gather(*(worker(client) for client in clients))
    wall = time.perf_counter() - started
    for client in clients:
        if isinstance(client, Connection):
            await client.close()
        elif client is not None:
            await client.aclose()
    return samples, wall


def start_stack(tmp: Path, mock, **env: str) -> RunningStack:
    """A private stack whose provider `mock` is the mock LLM (a MockProcess or a MockLLM), with `env` on top."""
    return launch_stack(tmp, mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN, BAE_LOG="warning", **env)


def client_key(running: RunningStack, **profile) -> str:
    """A client key on a new profile with `profile` fields."""
    created = running.create_profile(f"bench{time.time_ns()}", **profile)
    return running.create_key(created["id"], name="bench")["key"]


async def open_session(client: httpx.AsyncClient, key: str) -> tuple[str, str]:
    reply = await client.post("/api/v1/sessions", json={}, headers={"Authorization": f"Bearer {key}"})
    body = reply.json()
    return body["session_id"], body["session_key"]


async def rpc(client, sid, skey, method, params=None):
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    reply = await client.post(f"/api/v1/sessions/{sid}/rpc", json=body, headers={"Authorization": f"Bearer {skey}"})
    last = json.loads(reply.text.splitlines()[-1])
    assert "result" in last, last
    return last["result"]

def ms(samples: list[float], q: float = 0.5) -> str:
    return f"{percentile(samples, q) * 1000:.2f} ms"
