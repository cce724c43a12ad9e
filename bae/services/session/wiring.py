"""The session service built from its settings: the store, the engine with the real runner,
sandbox hosts, MCP servers and peer replicas behind its ports (engine/ports.py), and the gRPC
servicer in front. `python -m bae.services.session serve` and the tests' in-process stack build it here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import grpc

from bae.common.config import Config
from bae.common.internal import InternalPlane
from bae.common.settings import Settings
from bae.services.session.api.admin import AdminApi
from bae.services.session.api.admin_key import AdminKeyOptions, bootstrap_admin_key
from bae.services.session.api.auth import Authenticator
from bae.services.session.api.console import ConsoleApi
from bae.services.session.api.live import LiveApi
from bae.services.session.api.rest import ClientRestApi
from bae.services.session.api.sandbox_methods import SandboxMethods
from bae.services.session.api.schedules import SchedulesApi
from bae.services.session.api.triggers import TriggersApi
from bae.services.session.api.gateway_calls import GatewayCalls
from bae.services.session.api.operations import Operation, operations
from bae.services.session.api.own_calls import register
from bae.services.session.api.servicer import SessionServicer
from bae.services.session.engine.fire import Fire
from bae.services.session.api.webhooks import WebhooksApi
from bae.services.session.engine.gauges import register_gauges
from bae.services.session.engine.ownership import advertised_address
from bae.services.session.engine.ports import Sandboxes
from bae.services.session.engine.retention_sweep import RetentionSweep
from bae.services.session.engine.schedules import ScheduleTicker
from bae.services.session.engine.triggers import TriggerRuns
from bae.services.session.engine.service import SessionEngine
from bae.services.session.engine.spans import SessionSpans
from bae.services.session.engine.webhook_delivery import WebhookDeliverer
from bae.services.session.remote.mcp import McpConnector
from bae.services.session.remote.peers import Peers
from bae.services.session.remote.runner import RunnerClient
from bae.services.session.remote.sandbox_pool import NoSandboxHosts, SandboxPool
from bae.services.session.remote.webhook_sender import WebhookSender
from bae.services.session.store import Store


# How often each replica looks for due webhook deliveries: the longest a new event waits to be sent.
WEBHOOK_POLL_SECONDS = 0.5


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
        mcp=McpConnector(config, call_timeout=settings.mcp_timeout, output_limit=settings.mcp_output_limit),
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
        reconcile_interval=settings.reconcile_interval,
    )


@dataclass
class SessionService:
    """The session service's parts, built and not yet started."""

    store: Store
    auth: Authenticator
    engine: SessionEngine
    servicer: SessionServicer
    operations: dict[str, Operation]  # the servicer's methods, however a call arrives
    gateway_calls: GatewayCalls
    sweep: RetentionSweep
    ticker: ScheduleTicker
    trigger_runs: TriggerRuns
    deliverer: WebhookDeliverer
    webhook_sender: WebhookSender

    def registrar(self) -> Callable[[grpc.aio.Server], list[str]]:
        """Registers SessionService on a gRPC server: its methods and the gateway's `Calls` stream."""
        return register(self.operations, self.gateway_calls)

    async def start(self) -> None:
        register_gauges(self.engine.registry, self.store)
        await self.engine.start()
        self.auth.start()
        self.sweep.start()
        self.ticker.start()
        self.trigger_runs.start()
        self.deliverer.start()

    async def drain(self, budget: float) -> None:
        """Stop taking work; running turns and the sandbox stops of closed sessions end within `budget`."""
        self.gateway_calls.drain()
        # No new tick fires; a run whose turn is under way drains as any turn does, and one cut
        # short stays `running` for a replica to resume (engine/schedules.py).
        await self.ticker.stop()
        await self.trigger_runs.drain()  # no more takeovers; a call's turn under way drains as any turn
        await self.engine.drain(budget)

    async def stop(self) -> None:
        """Tear down sessions, MCP, sandboxes and the store."""
        await self.ticker.stop()  # done already when the service drained first
        # Turns still running after the drain stop; their runs stay `running`, finished by a replica that finds them.
        await self.trigger_runs.stop()
        await self.sweep.stop()
        await self.deliverer.stop()
        await self.webhook_sender.close()
        await self.engine.stop()
        await self.auth.stop()  # writes the last coalesced last_used_at stamps
        await self.store.close()


async def session_service(settings: Settings, config: Config, options: AdminKeyOptions) -> SessionService:
    """Open the store (migrated), provision the admin key and build the engine and servicer on them."""
    store = await Store.open(settings.sqlalchemy_url, settings.sqlite_synchronous)
    await bootstrap_admin_key(store, options)
    auth = Authenticator(store, admin_auth_disabled=options.disabled)
    engine = session_engine(settings, config, store)
    rest = ClientRestApi(
        store=store, auth=auth, sessions=engine.registry, mcp=engine.mcp, closer=engine.closer,
        spans=engine.spans, config=config,
    )
    fire = Fire(
        store=store, registry=engine.registry, turns=engine.turns, mcp=engine.mcp, sandboxes=engine.sandboxes,
        closer=engine.closer, spans=engine.spans, vetting=rest,
    )
    trigger_runs = TriggerRuns(store=store, fire=fire, ownership=engine.ownership)
    webhook_sender = WebhookSender()
    deliverer = WebhookDeliverer(
        store, webhook_sender, config.webhooks, holder=engine.ownership.replica_id, max_age=settings.webhook_max_age,
        backoff_scale=settings.webhook_backoff_scale, poll_interval=WEBHOOK_POLL_SECONDS, turns=engine.turns,
    )
    servicer = SessionServicer(
        rest=rest,
        admin=AdminApi(
            store=store, auth=auth, sandboxes=engine.sandboxes, revocations=engine.revocations, config=config
        ),
        schedules=SchedulesApi(store=store, auth=auth, test_seconds=settings.schedule_test_seconds),
        triggers=TriggersApi(store=store, auth=auth, runs=trigger_runs),
        webhooks=WebhooksApi(
            store=store, auth=auth, transport=webhook_sender, settings=config.webhooks, deliverer=deliverer
        ),
        console=ConsoleApi(store=store, auth=auth),
        auth=auth,
        live=LiveApi(
            store=store, sessions=engine.registry, turns=engine.turns, sandboxes=engine.sandboxes,
            subagents=engine.subagents, limits=config.limits,
        ),
        sandboxes=SandboxMethods(
            sessions=engine.registry, sandboxes=engine.sandboxes, reconciler=engine.reconciler, limits=config.limits
        ),
        ownership=engine.ownership,
        spans=engine.spans,
    )
    served = operations(servicer)
    sweep = RetentionSweep(
        store, config.retention, engine.ownership.replica_id, settings.retention_interval, settings.session_lease_seconds
    )
    ticker = ScheduleTicker(
        store=store, fire=fire, ownership=engine.ownership, test_seconds=settings.schedule_test_seconds
    )
    return SessionService(
        store=store, auth=auth, engine=engine, servicer=servicer, operations=served, gateway_calls=GatewayCalls(served),
        sweep=sweep, ticker=ticker, trigger_runs=trigger_runs, deliverer=deliverer, webhook_sender=webhook_sender,
    )
