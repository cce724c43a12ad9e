"""Calls from this session replica to the others (over the internal plane)."""

from __future__ import annotations

import asyncio
import logging

import grpc

from bae.common.grpcutil import channel
from bae.common.internal import InternalPlane
from bae.common.protos import session_pb2, session_pb2_grpc
from bae.services.session.engine.ports import ClosedSession, Revocation

log = logging.getLogger("bae.session.peers")


class Peers:
    """One channel per replica address, made on first use."""

    def __init__(self, plane: InternalPlane, timeout: float) -> None:
        self._plane = plane
        self._timeout = timeout
        self._stubs: dict[str, session_pb2_grpc.SessionServiceStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    def _stub(self, address: str) -> session_pb2_grpc.SessionServiceStub:
        stub = self._stubs.get(address)
        if stub is None:
            chan = channel(address, self._plane)
            self._channels.append(chan)
            stub = self._stubs[address] = session_pb2_grpc.SessionServiceStub(chan)
        return stub

    async def apply_revocation(self, address: str, revocation: Revocation) -> None:
        """Best effort: a replica that cannot be reached holds nothing live for long (its lease lapses)."""
        try:
            await self._stub(address).ApplyRevocation(revocation_message(revocation), timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            log.warning("replica at %s did not take the revocation of %s: %s",
                        address, revocation.key_id, error.code().name)

    async def close(self) -> None:
        await asyncio.gather(*(chan.close() for chan in self._channels))


def revocation_message(revocation: Revocation) -> session_pb2.Revocation:
    message = session_pb2.Revocation(key_id=revocation.key_id, session_ids=revocation.session_ids)
    for closed in revocation.closed:
        message.closed.add(session_id=closed.session_id, event_ids=closed.event_ids)
    return message


def revocation_of(message: session_pb2.Revocation) -> Revocation:
    """The revocation another replica sent (SessionService.ApplyRevocation)."""
    return Revocation(
        message.key_id,
        [ClosedSession(closed.session_id, list(closed.event_ids)) for closed in message.closed],
        list(message.session_ids),
    )
