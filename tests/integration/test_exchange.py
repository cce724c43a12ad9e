"""The gateway's calls to a session replica on one `Exchange` stream (session.proto).

Through the gateway: a call past its deadline is stopped on the replica too (the stack in this
process, the call held inside the service), and a replica told to stop answers the calls it
took and exits without waiting out its budget. Through the gateway's own `ExchangeChannel` against a real session service:
calls share one stream and each ends as a call of its own would (reply, problem
trailer, unknown method, oversized request), and a replica killed mid-call fails
that call and is reached on a new stream once it is back.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import grpc
import pytest

from bae.common import error_codes
from bae.common.grpcutil import MAX_CARRIED_BYTES
from bae.common.grpcutil import channel as internal_channel
from bae.common.errors import Unauthenticated
from bae.common.protos import admin_api_pb2, client_api_pb2, edge_pb2, errors_pb2, session_pb2, session_pb2_grpc
from bae.launcher.stack import grpc_serving
from services.gateway.exchange import ExchangeChannel
from testkit.live import new_session, register, result, rpc, send, turn_in_background
from testkit.mockllm import Reply
from testkit.processes import TEST_PLANE
from testkit.stack import mock_provider_toml

TOKEN = "sk-test-secret-token-123456"


def bearer(key: str) -> edge_pb2.Credential:
    return edge_pb2.Credential(authorization=f"Bearer {key}", present=True)


def one_call(**fields) -> session_pb2.ExchangeCalls:
    return session_pb2.ExchangeCalls(calls=[session_pb2.ExchangeCall(**fields)])


@pytest.mark.inprocess
def test_a_call_past_the_gateways_deadline_answers_504_and_is_stopped_on_the_replica(start_inprocess_stack, mock):
    stack = start_inprocess_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                                  BAE_RPC_TIMEOUT="1")
    sid, skey, _ = new_session(stack)
    hold = stack.hold(stack.session.engine.registry, "attach", sid)
    started = time.monotonic()
    response = stack.client.post(
        f"/api/v1/sessions/{sid}/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver"},
        headers={"Authorization": f"Bearer {skey}"},
    )
    assert response.status_code == 504, response.text
    assert response.json()["type"].endswith("gateway_timeout")
    assert time.monotonic() - started < 5
    # The replica cancelled the call where it was held.
    assert hold.cancelled.wait(5)
    hold.release()
    assert rpc(stack.client, sid, skey, "session.registerDriver")[0]["result"] == {"registered": True}


@pytest.mark.stack
def test_a_replica_told_to_stop_answers_the_calls_it_took_and_exits_without_waiting_out_its_budget(
    start_stack, mock
):
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN,
                        BAE_SHUTDOWN_TIMEOUT="30")
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    mock.reset()
    release = threading.Event()
    mock.enqueue(Reply.held(release, then=Reply.text("done")))
    thread, outcome = turn_in_background(stack, sid, skey, "hi")
    deadline = time.monotonic() + 10
    while not mock.requests:  # the turn's provider call is in flight: the replica took the call
        assert time.monotonic() < deadline, "the turn did not reach the provider"
        time.sleep(0.05)
    session = stack.stack.processes["session"]
    session.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while grpc_serving(stack.stack.settings.session_grpc_addr):  # draining once it reports so
        assert time.monotonic() < deadline, "the session service did not start to drain"
        time.sleep(0.05)
    release.set()
    thread.join(10)
    assert result(outcome["frames"])["message"]["content"] == [{"type": "text", "text": "done"}], outcome
    stopping = time.monotonic()
    assert session.wait(15) == 0
    assert time.monotonic() - stopping < 10  # not its 30 s budget: the stream ended once drained


async def _exchange(address: str):
    return ExchangeChannel(internal_channel(address, TEST_PLANE))


@pytest.mark.stack
def test_calls_share_one_stream_and_each_ends_as_its_own_call_would(start_stack, mock):
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN)
    sid, skey, _ = new_session(stack)
    address = stack.stack.settings.session_grpc_addr

    async def scenario():
        chan = await _exchange(address)
        stub = session_pb2_grpc.SessionServiceStub(chan)
        good = client_api_pb2.ListEventsRequest(credential=bearer(skey), session_id=sid, limit="1")
        bad = client_api_pb2.ListEventsRequest(credential=bearer("nope"), session_id=sid)
        calls = [stub.ListEvents(good if i % 2 else bad, timeout=10) for i in range(40)]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        for i, outcome in enumerate(outcomes):
            if i % 2:
                assert outcome.items[0].event_type == "session.open"
            else:
                assert isinstance(outcome, grpc.aio.AioRpcError)
                assert outcome.code() == grpc.StatusCode.UNAUTHENTICATED
                assert isinstance(error_codes.raised_by(outcome), Unauthenticated)

        # A request too large for one message fails alone; the stream carries on.
        huge = admin_api_pb2.CreateProfileRequest(body=admin_api_pb2.ProfileBody(name="x" * (MAX_CARRIED_BYTES + 1)))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.CreateProfile(huge, timeout=10)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (await stub.ListEvents(good, timeout=10)).items
        assert chan.opened_streams == 1
        await chan.close()

    asyncio.run(scenario())


@pytest.mark.stack
def test_an_unknown_method_on_the_stream_fails_alone(start_stack, mock):
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN)
    address = stack.stack.settings.session_grpc_addr

    async def scenario():
        async with internal_channel(address, TEST_PLANE) as chan:
            stream = session_pb2_grpc.SessionServiceStub(chan).Exchange()
            calls = [
                session_pb2.ExchangeStart(method="/baeproto.v1.SessionService/Exchange"),  # not on itself
                session_pb2.ExchangeStart(method="/nope/Nope"),
                session_pb2.ExchangeStart(method="/baeproto.v1.SessionService/CheckCredential",
                                       request=session_pb2.CredentialCheck().SerializeToString()),
            ]
            # Packed into one message, as a gateway's writer packs what queued: each is served alone.
            await stream.write(session_pb2.ExchangeCalls(calls=[
                session_pb2.ExchangeCall(call_id=call_id, start=start) for call_id, start in enumerate(calls, 1)
            ]))
            outcomes = {}
            while len(outcomes) < len(calls):
                for outcome in (await stream.read()).replies:
                    outcomes[outcome.call_id] = outcome
            await stream.done_writing()
            assert outcomes[1].code == outcomes[2].code == grpc.StatusCode.UNIMPLEMENTED.value[0]
            assert outcomes[3].code == grpc.StatusCode.UNAUTHENTICATED.value[0]
            info = errors_pb2.ErrorInfo.FromString(outcomes[3].trailing_metadata[error_codes.TRAILER])
            assert info.reason == "unauthorized"
            assert await stream.read() == grpc.aio.EOF  # half-closed with nothing running: the stream ends

    asyncio.run(scenario())


@pytest.mark.stack
def test_a_replica_killed_mid_call_fails_the_call_and_is_reached_again_on_a_new_stream(start_stack, mock):
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN)
    sid, skey, _ = new_session(stack)
    address = stack.stack.settings.session_grpc_addr
    request = client_api_pb2.RegisterDriverRequest(credential=bearer(skey), session_id=sid)

    async def scenario():
        chan = await _exchange(address)
        stub = session_pb2_grpc.SessionServiceStub(chan)
        # The session's feed: a call that runs on the replica until the session's live state ends.
        call = stub.Relay(session_pb2.RelayRequest(session_id=sid), timeout=30)
        assert (await call.read()).WhichOneof("kind") == "position"
        await asyncio.to_thread(stack.stack.restart, "session", sig=signal.SIGKILL)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        reply = await stub.RegisterDriver(request, timeout=30)
        assert reply.result.registered
        assert chan.opened_streams == 2
        await chan.close()

    asyncio.run(scenario())


@pytest.mark.stack
def test_a_streaming_call_sends_no_more_than_its_credit_and_holds_back_no_other_call(start_stack, mock):
    stack = start_stack(config_toml=mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN=TOKEN)
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    address = stack.stack.settings.session_grpc_addr
    window = session_pb2.EXCHANGE_WINDOW

    async def replies_until_quiet(replies: asyncio.Queue, quiet: float = 1.0) -> list:
        got = []
        while True:
            try:
                got.append(await asyncio.wait_for(replies.get(), quiet))
            except TimeoutError:
                return got

    async def read_all(stream, replies: asyncio.Queue) -> None:
        # A read cancelled by a timeout would cancel the whole call: one task reads, the test waits.
        while (pack := await stream.read()) is not grpc.aio.EOF:
            for reply in pack.replies:
                replies.put_nowait(reply)

    async def scenario():
        async with internal_channel(address, TEST_PLANE) as chan:
            stream = session_pb2_grpc.SessionServiceStub(chan).Exchange()
            relay = session_pb2.ExchangeStart(method="/baeproto.v1.SessionService/Relay",
                                              request=session_pb2.RelayRequest(session_id=sid).SerializeToString())
            await stream.write(one_call(call_id=1, start=relay))
            replies: asyncio.Queue = asyncio.Queue()
            reader = asyncio.ensure_future(read_all(stream, replies))
            for _ in range(10):  # each turn publishes several batches: more than the window in all
                mock.enqueue(Reply.text("ok"))
                await asyncio.to_thread(send, stack, sid, skey, "hi")
            held = await replies_until_quiet(replies)
            assert [reply.call_id for reply in held] == [1] * window and all(reply.more for reply in held)

            # Another call on the same stream is answered meanwhile.
            check = session_pb2.ExchangeStart(method="/baeproto.v1.SessionService/CheckCredential",
                                              request=session_pb2.CredentialCheck().SerializeToString())
            await stream.write(one_call(call_id=2, start=check))
            (answer,) = await replies_until_quiet(replies)
            assert answer.call_id == 2 and answer.code == grpc.StatusCode.UNAUTHENTICATED.value[0]

            # Credit lets the rest come, in order, ending where the session's feed is.
            await stream.write(one_call(call_id=1, credit=window))
            more = await replies_until_quiet(replies)
            assert 0 < len(more) <= window
            frames = [session_pb2.RelayFrame.FromString(reply.message) for reply in held + more]
            assert frames[0].WhichOneof("kind") == "position"
            streamed = [event.id for frame in frames[1:] for event in frame.events.events]
            page = stack.client.get(f"/api/v1/sessions/{sid}/events", params={"limit": 200},
                                    headers={"Authorization": f"Bearer {skey}"}).json()
            assert not page.get("next_cursor")
            assert streamed == [event["id"] for event in page["items"]][-len(streamed):]
            await stream.write(one_call(call_id=1, cancel=True))
            await stream.done_writing()
            await asyncio.wait_for(reader, 10)  # the cancelled relay ended: so does the stream

    asyncio.run(scenario())
