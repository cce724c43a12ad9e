"""A live stream's events travel in as few gRPC messages as fit, in order, each message bounded."""

from __future__ import annotations

import json

import pytest

from bae.common.protos import client_api_pb2
from bae.services.gateway.proto_to_json import to_json
from bae.services.session.api import live
from bae.services.session.store.events import EventView

pytestmark = pytest.mark.unit


def event(index: int, payload_chars: int) -> EventView:
    fields = {"id": f"evt_{index}", "session_id": "ses_a", "client_key_id": None, "event_type": "x",
              "payload": None, "created_at": "2026-12-01T00:00:00.000Z"}
    return EventView(fields, '"' + "p" * payload_chars + '"')


def batches(events: list[EventView]) -> list[list[str]]:
    """Each frame's events as the gateway writes them."""
    return [[to_json(e) for e in frame.events.events] for frame in live.event_frames(events, client_api_pb2.TurnFrame)]


def test_events_ready_together_are_one_frame():
    events = [event(i, 10) for i in range(5)]
    assert batches(events) == [[e.json for e in events]]


def test_frames_are_bounded_and_a_larger_event_travels_alone(monkeypatch):
    monkeypatch.setattr(live, "FRAME_EVENTS_CHARS", 1000)
    small = [event(i, 300) for i in range(4)]  # about 430 characters each: two fit in a frame
    large = event(9, 5000)
    sent = batches([small[0], small[1], small[2], large, small[3]])
    assert sent == [[small[0].json, small[1].json], [small[2].json], [large.json], [small[3].json]]
    assert [e for frame in sent for e in frame] == [e.json for e in (*small[:3], large, small[3])]


def test_a_frame_carries_each_event_as_stored():
    view = EventView({"id": "evt_1", "session_id": "ses_a", "client_key_id": "key_1", "event_type": "x",
                      "payload": None, "created_at": "t"}, '{"created_at":1,"payload":{"b":1.50}}')
    (frame,) = live.event_frames([view], client_api_pb2.SubscriptionFrame)
    assert frame.events.events[0].payload.json == '{"created_at":1,"payload":{"b":1.50}}'
    assert to_json(frame.events.events[0]) == view.json


def test_nothing_to_send_is_no_frame():
    assert batches([]) == []


def test_an_event_over_a_piece_goes_in_pieces_and_the_gateway_writes_its_line_whole(monkeypatch):
    from bae.services.gateway.frames import StreamLines
    from bae.services.session.api import event_messages

    monkeypatch.setattr(event_messages, "EVENT_PIECE_CHARS", 100)
    small, large = event(1, 10), event(2, 350)
    frames = list(live.event_frames([small, large, small], client_api_pb2.TurnFrame))
    assert [(len(f.events.events), f.events.continued) for f in frames] == [
        (1, False), (1, True), (1, True), (1, True), (1, False), (1, False)
    ]
    assert all(len(f.events.events[0].payload.json) <= 100 for f in frames)
    lines = StreamLines('"1"')
    written = b"".join(line for f in frames if (line := lines.frame(f)))
    notification = '{"jsonrpc":"2.0","method":"session.event","params":'
    assert written == "".join(notification + e.json + "}\n" for e in (small, large, small)).encode()
    assert lines.end() == ""


def test_a_result_whose_events_go_on_is_one_line(monkeypatch):
    from bae.services.gateway.frames import StreamLines
    from bae.services.session.api import event_messages

    monkeypatch.setattr(event_messages, "EVENT_PIECE_CHARS", 100)
    small, large = event(1, 10), event(2, 350)
    first = client_api_pb2.TurnFrame(result=client_api_pb2.SendMessageResult(
        message=client_api_pb2.Message(role="assistant", content={"json": "[]"}),
        events=[event_messages.event_of_view(small)]), result_continues=True)
    rest = list(live.event_frames([large, small], lambda events: client_api_pb2.TurnFrame(result_events=events)))
    lines = StreamLines("7")
    written = b"".join(line for f in [first, *rest] if (line := lines.frame(f))) + lines.end().encode()
    assert written.endswith(b"\n") and written.count(b"\n") == 1
    parsed = json.loads(written)
    assert parsed["id"] == 7
    assert [json.dumps(e, separators=(",", ":")) for e in parsed["result"]["events"]] == [
        small.json, large.json, small.json
    ]
