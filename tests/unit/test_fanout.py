"""The gateway's fan-out of a session's relay to its observers (bae/services/gateway/fanout.py), against a
scripted relay: what each observer gets, what ends it, and that a session has one relay."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from bae.common.protos import client_api_pb2, edge_pb2, session_pb2
from bae.services.gateway.fanout import LAG_LIMIT, Ending, Fanout, Observer, ReplayedCalls
from bae.services.gateway.frames import SSE_WIRE

pytestmark = pytest.mark.unit


class ScriptedCall:
    """A Relay call whose frames the test puts in; an exception put in is raised by `read`."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue = asyncio.Queue()
        self.cancelled = False

    async def read(self):
        item = await self.frames.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True


class ScriptedUpstream:
    """Answers every Relay with a new ScriptedCall that starts at `start`, or with `refusal`."""

    def __init__(self, start: int = 10) -> None:
        self.start = start
        self.refusal: grpc.aio.AioRpcError | None = None
        self.calls: list[tuple[str, ScriptedCall]] = []

    async def open_stream(self, session_id, rpc_name, request):
        assert (rpc_name, request.session_id) == ("Relay", session_id)
        if self.refusal is not None:
            raise self.refusal
        call = ScriptedCall()
        self.calls.append((session_id, call))
        return call, session_pb2.RelayFrame(position=self.start)


def status(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "scripted")


def events(*ids: str) -> session_pb2.RelayFrame:
    batch = [client_api_pb2.Event(id=event_id, payload=edge_pb2.JsonValue(json="{}")) for event_id in ids]
    return session_pb2.RelayFrame(events=client_api_pb2.EventBatch(events=batch))


def admitted(observer: Observer, key: str, position: int, live: bool = True) -> Observer:
    observer.admit(client_api_pb2.Observer(key=key, position=position, live=live))
    return observer


class Reader:
    """Reads an observer's lines in the background, as its HTTP stream would."""

    def __init__(self, observer: Observer, replayed: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.ids: list[str] = []
        self.task = asyncio.create_task(self._read(observer, set(replayed)))

    async def _read(self, observer: Observer, replayed: set[str]) -> None:
        async for chunk in observer.lines(replayed, ReplayedCalls()):
            self.ids += [json.loads(line)["params"]["id"] for line in chunk.splitlines()]

    async def ended(self) -> list[str]:
        await asyncio.wait_for(self.task, 5)
        return self.ids


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_observers_of_a_session_share_one_relay_and_each_gets_what_follows_its_position():
    upstream = ScriptedUpstream(start=10)
    fanout = Fanout(upstream)  # type: ignore[arg-type]
    early, late = await fanout.join("ses_a"), await fanout.join("ses_a")
    other = await fanout.join("ses_b")
    assert early is not None and late is not None and other is not None
    assert [session_id for session_id, _ in upstream.calls] == ["ses_a", "ses_b"]
    relay = upstream.calls[0][1]
    relay.frames.put_nowait(events("e11", "e12"))  # positions 11 and 12
    relay.frames.put_nowait(events("e13"))
    await settle()
    # `early` joined the feed at 10 and replayed e11; `late` joined at 12.
    early_reader = Reader(admitted(early, "key_1", 10), replayed={"e11"})
    late_reader = Reader(admitted(late, "key_2", 12))
    relay.frames.put_nowait(events("e14"))
    relay.frames.put_nowait(grpc.aio.EOF)  # the session's live state ended
    assert await early_reader.ended() == ["e12", "e13", "e14"]
    assert await late_reader.ended() == ["e13", "e14"]
    assert early.ending is late.ending is Ending.CLEAN
    assert other.ending is None  # another session's relay goes on


async def test_word_that_streams_end_applies_to_those_who_joined_before_it():
    upstream = ScriptedUpstream(start=0)
    fanout = Fanout(upstream)  # type: ignore[arg-type]
    first, revoked, joined_after = [await fanout.join("ses_a") for _ in range(3)]
    assert first is not None and revoked is not None and joined_after is not None
    relay = upstream.calls[0][1]
    relay.frames.put_nowait(session_pb2.RelayFrame(revoked_key="key_2"))  # position 1
    relay.frames.put_nowait(events("e2"))
    relay.frames.put_nowait(session_pb2.RelayFrame(revoked_key="key_3"))  # position 3: key_3 joined at 3
    relay.frames.put_nowait(events("e4"))
    await settle()
    readers = [Reader(admitted(first, "key_1", 0)), Reader(admitted(revoked, "key_2", 0)),
               Reader(admitted(joined_after, "key_3", 3))]
    await settle()
    assert readers[1].task.done() and await readers[1].ended() == []  # revoked before e2
    relay.frames.put_nowait(session_pb2.RelayFrame(subscriptions_ended=True))  # session.unsubscribe
    relay.frames.put_nowait(events("e6"))
    assert await readers[0].ended() == ["e2", "e4"]
    assert await readers[2].ended() == ["e4"]
    assert {observer.ending for observer in (first, revoked, joined_after)} == {Ending.CLEAN}


async def test_an_observer_that_stops_reading_is_cut_off_alone():
    upstream = ScriptedUpstream(start=0)
    fanout = Fanout(upstream)  # type: ignore[arg-type]
    stalled, reading = await fanout.join("ses_a"), await fanout.join("ses_a")
    assert stalled is not None and reading is not None
    admitted(stalled, "key_1", 0)
    reader = Reader(admitted(reading, "key_2", 0))
    relay = upstream.calls[0][1]
    for number in range(LAG_LIMIT + 1):
        relay.frames.put_nowait(events(f"e{number}"))
        await settle()
    assert stalled.ending is Ending.LAGGED
    assert [line async for line in stalled.lines(set(), ReplayedCalls())] == []  # the lagged error follows at once
    assert reading.ending is None and len(reader.ids) == LAG_LIMIT + 1
    relay.frames.put_nowait(grpc.aio.EOF)
    await reader.ended()


@pytest.mark.parametrize("end,ending", [
    (status(grpc.StatusCode.UNAVAILABLE), Ending.FAILED),
    (session_pb2.RelayFrame(lagged=True), Ending.LAGGED),
    (grpc.aio.EOF, Ending.CLEAN),
])
async def test_how_the_relay_ends_is_how_its_observers_end(end, ending):
    upstream = ScriptedUpstream(start=0)
    fanout = Fanout(upstream)  # type: ignore[arg-type]
    observers = [await fanout.join("ses_a") for _ in range(3)]
    upstream.calls[0][1].frames.put_nowait(end)
    await settle()
    assert [observer.ending for observer in observers if observer is not None] == [ending] * 3
    assert upstream.calls[0][1].cancelled
    assert await fanout.join("ses_a") is not None and len(upstream.calls) == 2  # the next one opens a new relay


async def test_the_relay_ends_with_its_last_observer():
    upstream = ScriptedUpstream()
    fanout = Fanout(upstream)  # type: ignore[arg-type]
    first, second = await fanout.join("ses_a"), await fanout.join("ses_a")
    assert first is not None and second is not None
    fanout.leave("ses_a", first)
    await settle()
    assert not upstream.calls[0][1].cancelled
    fanout.leave("ses_a", second)
    await settle()
    assert upstream.calls[0][1].cancelled
    assert await fanout.join("ses_a") is not None and len(upstream.calls) == 2


async def test_a_session_that_is_not_open_has_no_relay_and_other_refusals_reach_the_caller():
    upstream = ScriptedUpstream()
    fanout = Fanout(upstream)  # type: ignore[arg-type]
    upstream.refusal = status(grpc.StatusCode.FAILED_PRECONDITION)
    assert await fanout.join("ses_closed") is None
    upstream.refusal = status(grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await fanout.join("ses_a")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    upstream.refusal = None
    assert await fanout.join("ses_a") is not None


async def test_an_observer_without_live_access_gets_nothing_live():
    upstream = ScriptedUpstream(start=0)
    fanout = Fanout(upstream)  # type: ignore[arg-type]
    observer = await fanout.join("ses_a")
    assert observer is not None
    upstream.calls[0][1].frames.put_nowait(events("e1"))
    await settle()
    assert await Reader(admitted(observer, "key_1", 0, live=False)).ended() == []


def deltas(request_id: str, *texts: str, first_seq: int = 0) -> session_pb2.RelayFrame:
    batch = [client_api_pb2.Delta(request_event_id=request_id, seq=first_seq + n, kind=client_api_pb2.DELTA_TEXT,
                                  text=text) for n, text in enumerate(texts)]
    return session_pb2.RelayFrame(deltas=client_api_pb2.DeltaBatch(deltas=batch))


async def test_deltas_reach_only_the_observers_that_asked_each_in_its_wire_and_position():
    upstream = ScriptedUpstream(start=10)
    fanout = Fanout(upstream)  # type: ignore[arg-type]
    plain = await fanout.join("ses_a")
    ndjson = await fanout.join("ses_a", deltas=True)
    sse = await fanout.join("ses_a", wire=SSE_WIRE, deltas=True)
    assert plain is not None and ndjson is not None and sse is not None
    relay = upstream.calls[0][1]
    relay.frames.put_nowait(events("e11"))  # position 11
    relay.frames.put_nowait(deltas("e11", "He", "llo"))  # 12 and 13
    relay.frames.put_nowait(deltas("e9", "stale"))  # 14: a call the replay showed over
    relay.frames.put_nowait(events("e15"))
    relay.frames.put_nowait(session_pb2.RelayFrame(subscriptions_ended=True))
    await settle()
    for observer in (plain, ndjson, sse):
        admitted(observer, "key_1", 12)  # joined after the first delta: its catch-up held it
    calls = ReplayedCalls()  # the replay sent e9's request and response, then e11's request
    for event_id, event_type in (("e9", "provider.request"), ("e10", "provider.response"), ("e11", "provider.request")):
        calls.saw(client_api_pb2.Event(id=event_id, event_type=event_type))
    plain_lines = [line async for line in plain.lines(set(), calls)]
    ndjson_lines = b"".join([line async for line in ndjson.lines(set(), calls)]).decode().splitlines()
    sse_text = b"".join([line async for line in sse.lines(set(), calls)]).decode()
    assert [json.loads(line)["params"]["id"] for line in b"".join(plain_lines).decode().splitlines()] == ["e15"]
    assert [json.loads(line) for line in ndjson_lines] == [
        {"jsonrpc": "2.0", "method": "session.delta", "params": {
            "session_id": "ses_a", "request_event_id": "e11", "seq": 1, "index": 0, "kind": "text", "text": "llo"}},
        {"jsonrpc": "2.0", "method": "session.event", "params": json.loads(ndjson_lines[1])["params"]},
    ]
    # The same two, as Server-Sent Events: the event with its id, the delta without.
    delta_json = ndjson_lines[0][len('{"jsonrpc":"2.0","method":"session.delta","params":'):-1]
    event_json = ndjson_lines[1][len('{"jsonrpc":"2.0","method":"session.event","params":'):-1]
    assert sse_text == f"event: session.delta\ndata: {delta_json}\n\nid: e15\nevent: session.event\ndata: {event_json}\n\n"


async def test_an_idle_sse_observer_says_it_is_alive():
    upstream = ScriptedUpstream(start=0)
    fanout = Fanout(upstream)  # type: ignore[arg-type]
    observer = await fanout.join("ses_a", wire=SSE_WIRE)
    assert observer is not None
    admitted(observer, "key_1", 0)
    lines = observer.lines(set(), ReplayedCalls(), keepalive=0.01)
    assert await asyncio.wait_for(anext(lines), 5) == b": keepalive\n\n"
    observer.finish(Ending.CLEAN)
    assert [line async for line in lines] == []


def test_a_replayed_response_ends_every_call_but_those_begun_after_it():
    calls = ReplayedCalls()
    assert not calls.over("e1")  # nothing replayed: any call may be running
    calls.saw(client_api_pb2.Event(id="e2", event_type="provider.response"))  # e1's, replayed after it
    assert calls.over("e1")
    calls.saw(client_api_pb2.Event(id="e3", event_type="provider.request"))
    assert not calls.over("e3") and calls.over("e1")
