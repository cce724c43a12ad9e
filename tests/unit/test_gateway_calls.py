"""The gateway's `Calls` stream (session.proto) between its two ends, on a loopback gRPC server.

The serving end (bae/services/session/api/gateway_calls.py) with operations of the test's own,
the calling end (bae/services/gateway/session_calls.py) as the gateway uses it, through the
generated stub: calls share one stream and each ends as a call of its own would, a streaming
call runs at most its window ahead of its reader and holds back no other call, a call named
by no method fails alone, a draining replica refuses new calls (sent once more) while it
answers those it took, and a call whose stream broke fails UNAVAILABLE whatever status the
stream ended with.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import grpc
import pytest

from bae.common import error_codes
from bae.common.errors import NotFound, Unavailable
from bae.common.internal import InternalPlane
from bae.common.protos import admin_api_pb2, client_api_pb2, errors_pb2, session_pb2, session_pb2_grpc
from bae.services.gateway.problems import status_of
from bae.services.gateway.session_calls import STREAM_BROKE, SessionCallsChannel
from bae.services.gateway.upstream import Upstream
from bae.services.session.api.gateway_calls import GatewayCalls
from bae.services.session.api.operations import Incoming, operations
from bae.services.session.api.own_calls import register
from bae.services.session.engine.ownership import NotOwner

pytestmark = pytest.mark.unit

WINDOW = session_pb2.GATEWAY_WINDOW


class Servicer:
    """Operations of the test's own, named as SessionService's methods (operations.operations)."""

    def __init__(self) -> None:
        self.streamed = 0  # messages the streaming operation produced so far
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        async def unimplemented(request: object, incoming: Incoming) -> None:
            raise AssertionError(f"{name} is not part of this test")

        return unimplemented

    async def get_profile(self, request: admin_api_pb2.GetProfileRequest, incoming: Incoming) -> admin_api_pb2.Profile:
        if request.profile_id == "missing":
            raise NotFound("profile not found")
        if request.profile_id == "elsewhere":
            raise NotOwner("ses_1", "10.0.0.9:50051")
        if request.profile_id == "held":
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        incoming.trailers.append(("bae-test", "redirected" if incoming.redirected else "placed"))
        return admin_api_pb2.Profile(name=request.profile_id)

    async def subscribe(
        self, request: client_api_pb2.SubscribeRequest, incoming: Incoming
    ) -> AsyncIterator[client_api_pb2.SubscriptionFrame]:
        yield client_api_pb2.SubscriptionFrame(accepted=True)
        for _ in range(4 * WINDOW):
            self.streamed += 1
            yield client_api_pb2.SubscriptionFrame(accepted=True)


class BrokenCalls(GatewayCalls):
    """A `Calls` stream that ends INTERNAL "Internal error from Core" once a call came: the status
    grpc.aio gives the gateway's stream when a write fails on the connection to a replica killed under it."""

    async def serve(
        self, packs: AsyncIterator[session_pb2.GatewayCalls], context: grpc.aio.ServicerContext
    ) -> None:
        async for _ in packs:
            await context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")


class Replica:
    """The serving end on a loopback port, and a gateway's channel to it."""

    def __init__(self, calls: type[GatewayCalls] = GatewayCalls) -> None:
        self.servicer = Servicer()
        self.calls = calls(operations(self.servicer))

    async def __aenter__(self) -> "Replica":
        self.server = grpc.aio.server()
        register(operations(self.servicer), self.calls)(self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.address = f"127.0.0.1:{port}"
        self.channel = SessionCallsChannel(grpc.aio.insecure_channel(self.address))
        self.stub = session_pb2_grpc.SessionServiceStub(self.channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.server.stop(None)


def test_calls_share_one_stream_and_each_ends_as_a_call_of_its_own_would() -> None:
    async def scenario() -> None:
        async with Replica() as replica:
            names = ["found", "missing", "elsewhere"] * 10
            calls = [replica.stub.GetProfile(admin_api_pb2.GetProfileRequest(profile_id=name), timeout=10) for name in names]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            for name, outcome in zip(names, outcomes):
                if name == "found":
                    assert isinstance(outcome, admin_api_pb2.Profile) and outcome.name == "found"
                    continue
                assert isinstance(outcome, grpc.aio.AioRpcError)
                if name == "missing":  # a domain error: its status and the bae-error-bin trailer
                    assert outcome.code() == grpc.StatusCode.NOT_FOUND
                    raised = error_codes.raised_by(outcome)
                    assert isinstance(raised, NotFound) and raised.detail == "profile not found"
                else:  # another replica's session: refused with the owner's address
                    assert outcome.code() == grpc.StatusCode.UNAVAILABLE
                    assert ("bae-session-owner", "10.0.0.9:50051") in list(outcome.trailing_metadata())

            # What came with the call reaches the operation; what it ends with comes back.
            call = replica.stub.GetProfile(
                admin_api_pb2.GetProfileRequest(profile_id="x"), timeout=10, metadata=(("bae-redirected", "1"),)
            )
            assert (await call).name == "x"
            assert ("bae-test", "redirected") in list(await call.trailing_metadata())

    asyncio.run(scenario())


def test_a_call_past_its_deadline_is_cancelled_on_the_replica() -> None:
    async def scenario() -> None:
        async with Replica() as replica:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await replica.stub.GetProfile(admin_api_pb2.GetProfileRequest(profile_id="held"), timeout=0.5)
            assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.wait_for(replica.servicer.cancelled.wait(), 5)

    asyncio.run(scenario())


def test_a_streaming_call_runs_at_most_its_window_ahead_and_holds_back_no_other_call() -> None:
    async def scenario() -> None:
        async with Replica() as replica:
            servicer = replica.servicer
            stream = replica.stub.Subscribe(client_api_pb2.SubscribeRequest(session_id="ses_1"))
            assert (await stream.read()).accepted
            await asyncio.sleep(0.5)
            # The first message was read and credited only once half a window was: the replica
            # waits, a window ahead of its reader at most.
            assert servicer.streamed <= WINDOW
            # Another call on the same stream is answered meanwhile.
            assert (await replica.stub.GetProfile(admin_api_pb2.GetProfileRequest(profile_id="y"), timeout=10)).name == "y"
            read = 1
            while (frame := await stream.read()) is not grpc.aio.EOF:
                assert frame.accepted
                read += 1
                assert servicer.streamed <= read + WINDOW
            assert read == 4 * WINDOW + 1

    asyncio.run(scenario())


def test_a_call_named_by_no_method_fails_alone_and_a_half_closed_stream_ends() -> None:
    async def scenario() -> None:
        async with Replica() as replica:
            stream = session_pb2_grpc.SessionServiceStub(grpc.aio.insecure_channel(replica.address)).Calls()
            # Packed into one message, as a gateway's writer packs what queued: each is served alone.
            await stream.write(session_pb2.GatewayCalls(calls=[
                session_pb2.GatewayCall(call_id=1),
                session_pb2.GatewayCall(call_id=2, get_profile=admin_api_pb2.GetProfileRequest(profile_id="missing")),
                session_pb2.GatewayCall(call_id=3, get_profile=admin_api_pb2.GetProfileRequest(profile_id="z")),
            ]))
            outcomes: dict[int, session_pb2.GatewayReply] = {}
            while len(outcomes) < 3:
                for outcome in (await stream.read()).replies:
                    outcomes[outcome.call_id] = outcome
            await stream.done_writing()
            assert outcomes[1].code == grpc.StatusCode.UNIMPLEMENTED.value[0]
            assert outcomes[2].code == grpc.StatusCode.NOT_FOUND.value[0]
            info = errors_pb2.ErrorInfo.FromString(outcomes[2].trailing_metadata[error_codes.TRAILER])
            assert info.detail == "profile not found"
            assert outcomes[3].code == 0 and outcomes[3].get_profile.name == "z"
            assert await stream.read() == grpc.aio.EOF  # half-closed with nothing running: the stream ends

    asyncio.run(scenario())


def test_a_draining_replica_answers_the_calls_it_took_and_refuses_new_ones_as_never_started() -> None:
    async def scenario() -> None:
        async with Replica() as replica:
            servicer = replica.servicer
            held = asyncio.ensure_future(
                replica.stub.GetProfile(admin_api_pb2.GetProfileRequest(profile_id="held"), timeout=10)
            )
            await asyncio.sleep(0.2)
            replica.calls.drain()
            # Refused as never started, sent once more on a new stream, refused again: it fails
            # UNAVAILABLE, as a call to a replica that stopped does, and the gateway goes elsewhere.
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await replica.stub.GetProfile(admin_api_pb2.GetProfileRequest(profile_id="new"), timeout=10)
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
            servicer.release.set()
            assert (await held).name == "held"

    asyncio.run(scenario())


def test_a_call_whose_stream_broke_fails_unavailable_whatever_status_the_stream_ended_with() -> None:
    async def scenario() -> None:
        async with Replica(BrokenCalls) as replica:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await replica.stub.GetProfile(admin_api_pb2.GetProfileRequest(profile_id="x"), timeout=10)
            assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.UNAVAILABLE, STREAM_BROKE)
            # What the gateway answers: 503, the session service being unavailable, not a 500.
            upstream = Upstream([replica.address], 10.0, InternalPlane("t" * 32, 30.0))
            failure = upstream.failure(raised.value)
            assert isinstance(failure, Unavailable) and status_of(failure) == 503

    asyncio.run(scenario())


def test_every_method_but_relay_and_import_has_its_request_and_reply_field_on_the_stream() -> None:
    service = session_pb2.DESCRIPTOR.services_by_name["SessionService"]
    requests = session_pb2.GatewayCall.DESCRIPTOR.oneofs_by_name["kind"].fields
    replies = session_pb2.GatewayReply.DESCRIPTOR.oneofs_by_name["reply"].fields
    carried = {field.name: field.message_type.full_name for field in requests if field.message_type is not None}
    answered = {field.name: field.message_type.full_name for field in replies}
    expected = {
        operation.name: (operation.request.DESCRIPTOR.full_name, operation.reply.DESCRIPTOR.full_name)
        for operation in operations(Servicer()).values()
        if operation.method != "Relay" and not operation.client_streaming
    }
    assert len(expected) == len(service.methods) - 3  # all but Relay, ImportSession and Calls
    assert {name: (carried.get(name), answered.get(name)) for name in expected} == expected
    assert set(carried) == set(answered) == set(expected)
