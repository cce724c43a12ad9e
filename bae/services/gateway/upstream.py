"""The connections to the session replicas and how their failures read over HTTP."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
from collections import OrderedDict
from typing import Awaitable, Callable, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from google.protobuf.message import Message
from starlette.requests import Request

from google.protobuf.message import DecodeError

from bae.common import error_codes
from bae.common.discovery import Discovery, Resolver, needs_discovery, resolve_all, split_target
from bae.common.errors import BaeError, DeadlineExceeded, Internal, Unavailable
from bae.common.grpcutil import channel
from bae.common.internal import InternalPlane
from bae.common.protos import edge_pb2, session_pb2_grpc
from bae.common.session_routing import REDIRECTED_KEY, owner_of
from bae.services.gateway.session_calls import SessionCallsChannel

log = logging.getLogger("bae.gateway")

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]


# Where the admin port's console cookie filter (console/session.py) leaves the `bae_console` cookie of a
# request without an Authorization header, once its CSRF token was checked.
CONSOLE_SESSION_SCOPE_KEY = "bae.console_session"


def credential_of(request: Request) -> edge_pb2.Credential:
    """The request's Authorization header as it came, or its console cookie: the session service authenticates."""
    authorization = request.headers.get("authorization")
    return edge_pb2.Credential(
        authorization=authorization or "", present=authorization is not None,
        console_session=request.scope.get(CONSOLE_SESSION_SCOPE_KEY, ""),
    )


# A call follows at most this many refusals (one is usual: the session moved once).
MAX_HOPS = 3
# Sessions whose replica is remembered; the oldest are forgotten first.
OWNER_CACHE = 65_536
# Replicas are health-checked this often, each check bounded by the same time: a replica whose host
# vanished (no connection reset, so its connections still look open) is then avoided within about
# two seconds instead of costing a call its full deadline.
PROBE_INTERVAL = 1.0
# A target named by DNS is resolved again this often: a scaled service's new replicas get calls.
RESOLVE_INTERVAL = 2.0

Invoke = Callable[[session_pb2_grpc.SessionServiceStub, Metadata], Awaitable[T]]


def _normal(target: str) -> str:
    """One spelling per address: a lower-case host name, or an IP written as `ipaddress` writes it."""
    host, _, port = target.rpartition(":")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return f"{host.lower()}:{port}"
    return f"[{ip.compressed}]:{port}" if ip.version == 6 else f"{ip.compressed}:{port}"


def _loopback_alias(address: str, target: str) -> bool:
    """Whether `address` is a loopback IP on the port of a `localhost` target (a replica on this
    machine that advertises 127.0.0.1 while the gateway was given `localhost`)."""
    host, _, port = address.rpartition(":")
    target_host, _, target_port = target.rpartition(":")
    if target_host.lower() != "localhost" or port != target_port:
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Upstream:
    """Channels to the session replicas, and which replica each session was last served by.

    A target named by DNS stands for every address it resolves to (a scaled
    compose service, a Swarm `dnsrr` or Kubernetes headless service): each
    address is a replica of its own, with its own channel, resolved again every
    RESOLVE_INTERVAL (bae.common.discovery). Every replica is health-checked, so
    one that stopped answering is routed around within seconds.

    A call for a session goes to its replica; one without a session (or for a
    session not seen yet) goes to the next replica that is not known to be
    down. A replica that does not own the session refuses the call before
    acting on it and names the owner (bae.common.session_routing), and the call
    is sent there.

    A call is sent again elsewhere only when it was never sent (its replica
    refused the connection); one cut off mid-way fails, as it may have acted.
    """

    def __init__(self, targets: list[str], timeout: float, plane: InternalPlane, *,
                 resolve: Resolver = resolve_all) -> None:
        # Must be made inside the event loop that will use the channels (grpc.aio binds to it).
        self.targets = targets
        self.timeout = timeout
        self._plane = plane
        # Each replica's channel (its calls share one `Calls` stream) and the stub on it.
        self._channels: dict[str, tuple[grpc.aio.Channel, session_pb2_grpc.SessionServiceStub]] = {}
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._turn = itertools.count()
        self._silent: set[str] = set()  # replicas whose last health check went unanswered
        self._probe: asyncio.Task[None] | None = None
        # Health checks go over channels of their own: their failed connects while a replica is
        # down must not put the calls' channel into reconnect backoff when it comes back.
        self._probes: dict[str, tuple[grpc.aio.Channel, health_pb2_grpc.HealthStub]] = {}
        self._target_addresses = {_normal(target) for target in targets}
        # The replicas calls go to: the targets, each name replaced by its addresses once it resolved.
        self._replicas = [_normal(target) for target in targets]
        self._discovery = Discovery(self, targets, what="session replicas", interval=RESOLVE_INTERVAL,
                                    resolve=resolve)

    def start(self) -> None:
        self._probe = asyncio.create_task(self._probe_replicas(), name="upstream-probe")
        if needs_discovery(self.targets):
            # Not awaited: until a name resolves, its calls go to the name itself (gRPC resolves it).
            self._discovery.start(resolve_now=True)

    @property
    def address(self) -> str:
        return ", ".join(self.targets)

    @property
    def replicas(self) -> list[str]:
        """The replicas' addresses as last resolved (a name not resolved yet stands as itself)."""
        return list(self._replicas)

    @property
    def silent(self) -> set[str]:
        """The replicas whose last health check went unanswered."""
        return set(self._silent)

    def set_addrs(self, addrs: list[str]) -> None:
        """Discovery's answer: the replicas every target stands for now."""
        self._replicas = [_normal(address) for address in addrs]

    def _opened(self, address: str) -> tuple[grpc.aio.Channel, session_pb2_grpc.SessionServiceStub]:
        opened = self._channels.get(address)
        if opened is None:
            chan = SessionCallsChannel(channel(address, self._plane))
            opened = self._channels[address] = (chan, session_pb2_grpc.SessionServiceStub(chan))
        return opened

    def channel(self, address: str) -> grpc.aio.Channel:
        return self._opened(address)[0]

    def stub(self, address: str) -> session_pb2_grpc.SessionServiceStub:
        return self._opened(address)[1]

    async def close(self) -> None:
        await self._discovery.close()
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await asyncio.gather(*(chan.close() for chan, _ in [*self._channels.values(), *self._probes.values()]))

    async def _probe_replicas(self) -> None:
        while True:
            await asyncio.sleep(PROBE_INTERVAL)
            # Every replica calls may go to, and any other one a call went to (an owner a refusal named).
            addresses = [address for address in dict.fromkeys([*self._replicas, *self._channels])
                         if split_target(address) is None]
            answers = await asyncio.gather(*(self._answers(address) for address in addresses))
            silent = {address for address, answered in zip(addresses, answers) if not answered}
            for address in silent - self._silent:
                log.warning("session replica at %s stopped answering; routing around it", address)
                for session_id in [sid for sid, owner in self._owners.items() if owner == address]:
                    del self._owners[session_id]
            self._silent = silent
            await self._forget_gone(silent)

    async def _forget_gone(self, silent: set[str]) -> None:
        """Close the channels of replicas that are silent and no longer resolved (a task or pod that
        was replaced): a scaled service must not leave a channel and a probe behind per address it had.
        One still answering keeps its channel while it drains its calls."""
        closing: list[grpc.aio.Channel] = []
        for address in [address for address in silent if address not in self._replicas]:
            for table in (self._channels, self._probes):
                if (opened := table.pop(address, None)) is not None:
                    closing.append(opened[0])
            self._silent.discard(address)
        await asyncio.gather(*(chan.close() for chan in closing))

    async def _answers(self, address: str) -> bool:
        probe = self._probes.get(address)
        if probe is None:
            # A subchannel pool of its own too: gRPC shares connections (and their backoff) between
            # channels with the same arguments. Health checks need no internal token.
            chan = grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
            probe = self._probes[address] = (chan, health_pb2_grpc.HealthStub(chan))
        _, stub = probe
        try:
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=PROBE_INTERVAL)
        except grpc.aio.AioRpcError:
            return False
        return True

    def _refused(self, address: str) -> bool:
        """Whether the last attempt to connect to `address` failed (so a call there was never sent)."""
        return bool(self.channel(address).get_state(try_to_connect=True) == grpc.ChannelConnectivity.TRANSIENT_FAILURE)

    def _usable(self, address: str) -> bool:
        return address not in self._silent and not self._refused(address)

    def _pick(self, session_id: str | None, avoid: str | None = None) -> str:
        owner = self._owners.get(session_id) if session_id else None
        if owner is not None and owner != avoid and self._usable(owner):
            return owner
        replicas = self._replicas
        start = next(self._turn)
        for offset in range(len(replicas)):
            replica = replicas[(start + offset) % len(replicas)]
            if replica != avoid and self._usable(replica):
                return replica
        return replicas[start % len(replicas)]

    async def _is_replica(self, address: str) -> bool:
        """Whether `address` is a target or one of their addresses. A refusal naming any other address
        is not followed: the call would carry the internal token there. The names are resolved again
        when an address is not known yet (a service scaled up since the last resolution)."""
        if self._known(_normal(address)):
            return True
        await self._discovery.refresh()  # looks up the names only: literal targets need no I/O
        return self._known(_normal(address))

    def _known(self, address: str) -> bool:
        return (address in self._replicas or address in self._target_addresses
                or any(_loopback_alias(address, target) for target in self.targets))

    def _remember(self, session_id: str, address: str) -> None:
        self._owners[session_id] = address
        self._owners.move_to_end(session_id)
        if len(self._owners) > OWNER_CACHE:
            self._owners.popitem(last=False)

    async def call(self, session_id: str | None, invoke: Invoke[T]) -> T:
        """`invoke(stub, metadata)` on the replica for `session_id`, following refusals."""
        address = self._pick(session_id)
        metadata: Metadata = ()
        for hop in range(MAX_HOPS):
            try:
                result = await invoke(self.stub(address), metadata)
            except grpc.aio.AioRpcError as error:
                named = owner_of(error)
                owner = _normal(named) if named is not None else None
                unreachable = error.code() == grpc.StatusCode.UNAVAILABLE and owner is None and self._refused(address)
                if session_id and (owner is not None or unreachable
                                   or error.code() == grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._owners.pop(session_id, None)  # the next call asks afresh
                # An owner that stopped answering holds its sessions until its lease lapses: 503 now.
                if hop == MAX_HOPS - 1 or not (owner or unreachable) or owner in self._silent:
                    raise
                if owner is not None and not await self._is_replica(owner):
                    log.warning("session replica refused a call naming %s as its owner, which is none of "
                                "the session targets (%s) nor their addresses; not followed",
                                owner, self.address)
                    raise
                if owner is not None:
                    address, metadata = owner, ((REDIRECTED_KEY, "1"),)
                else:  # never sent: another replica takes the session or names its owner
                    address, metadata = self._pick(session_id, avoid=address), ()
                continue
            if session_id:
                self._remember(session_id, address)
            return result
        raise AssertionError("unreachable")

    async def open_stream(
        self, session_id: str, rpc_name: str, request: Message
    ) -> tuple[grpc.aio.UnaryStreamCall, Message | object]:
        """Start a live call on the session's replica and read its first frame (`accepted`, or a
        relay's start), or EOF; a refusal before it raises as any call's does. Live calls carry no
        deadline: a turn or a subscription lasts as long as it lasts."""

        async def invoke(
            stub: session_pb2_grpc.SessionServiceStub, metadata: Metadata
        ) -> tuple[grpc.aio.UnaryStreamCall, Message | object]:
            grpc_call = getattr(stub, rpc_name)(request, metadata=metadata)
            try:
                return grpc_call, await grpc_call.read()
            except BaseException:
                grpc_call.cancel()
                raise

        return await self.call(session_id, invoke)

    def failure(self, error: grpc.aio.AioRpcError) -> BaeError:
        """The error a failed call answers: the service's own, or a generic one that names the outage.

        Addresses and gRPC's own texts go to the log only, never to the client.
        """
        try:
            raised = error_codes.raised_by(error)
        except DecodeError:
            log.error("session service sent a malformed error trailer: %s", error.details())
            return Internal("internal server error")
        if raised is not None:
            return raised
        code = error.code()
        log.error("session service at %s: call failed: %s %s", self.address, code.name, error.details())
        if code == grpc.StatusCode.UNAVAILABLE:
            return Unavailable("the session service is unavailable; try again shortly")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return DeadlineExceeded(f"the session service did not answer within {self.timeout:g}s")
        return Internal("internal server error")
