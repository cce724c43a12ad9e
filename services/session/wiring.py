"""The session service's engine built from its settings: the real runner, sandbox hosts, MCP
servers and peer replicas behind the engine's ports (engine/ports.py)."""

from __future__ import annotations

from bae.common.config import Config
from bae.common.internal import InternalPlane
from bae.common.settings import Settings
from services.session.engine.ownership import advertised_address
from services.session.engine.ports import Sandboxes
from services.session.engine.service import SessionEngine
from services.session.engine.spans import SessionSpans
from services.session.remote.mcp import McpConnector
from services.session.remote.peers import Peers
from services.session.remote.runner import RunnerClient
from services.session.remote.sandbox_pool import NoSandboxHosts, SandboxPool
from services.session.store import Store


def session_engine(settings: Settings, config: Config, store: Store) -> SessionEngine:
    plane = InternalPlane.of(settings)
    sandboxes: Sandboxes = (
        SandboxPool(settings.sandbox_grpc_addrs, settings.rpc_timeout, plane)
        if settings.sandbox_grpc_addrs
        else NoSandboxHosts()
    )
    return SessionEngine(
        store=store,
        steps=RunnerClient(settings.runner_grpc_addr, settings.rpc_timeout, plane),
        sandboxes=sandboxes,
        mcp=McpConnector(config, call_timeout=settings.mcp_timeout),
        peers=Peers(plane, settings.rpc_timeout),
        config=config,
        spans=SessionSpans(),
        address=advertised_address(settings.session_grpc_addr, settings.session_advertise_addr),
        lease_seconds=settings.session_lease_seconds,
        turn_timeout=settings.turn_timeout,
        rpc_timeout=settings.rpc_timeout,
        max_subagents=settings.max_subagents_per_session,
        subagent_timeout=settings.subagent_timeout,
        sandbox_idle_timeout=settings.sandbox_idle_timeout,
    )
