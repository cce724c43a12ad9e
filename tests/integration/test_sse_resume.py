"""A Server-Sent Events client cut off at a random moment of a streamed turn, that reconnects with
Last-Event-ID, rebuilds the turn exactly: no event or delta missing, none twice.

The client rebuilds as the streaming guide (docs/guides/streaming.md) tells one to: events by id;
a call's text from its deltas, the first delta of a content block on a new connection replacing
what it had (the catch-up holds everything so far), each later one appended; a call whose
`provider.response` it has is whole.
"""

from __future__ import annotations

import random
import threading

import httpx
import pytest

from testkit.inprocess import launch_inprocess_stack
from testkit.live import new_session, register, result, rpc
from testkit.mockllm import Reply
from testkit.stack import mock_provider_toml
from testkit.streams import sse_records

pytestmark = pytest.mark.inprocess

RUNS = 200
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november".split()


class Rebuilt:
    """What one client knows of the turn, over its connections."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.texts: dict[tuple[str, int], str] = {}  # (request event, block) -> text
        self.missing = 0  # deltas skipped over (a gap in seq)
        self.duplicated = 0  # deltas received again

    def read(self, records, last_seq: dict[tuple[str, int], int], limit: int | None) -> int:
        """Apply records of one connection (at most `limit`); how many it applied."""
        count = 0
        for record in records:
            if "comment" in record:
                continue
            if limit is not None and count >= limit:
                break
            count += 1
            if record["event"] == "session.event":
                self.events.append(record["data"])
                if record["data"]["event_type"] == "server.message.send":
                    break
                continue
            delta = record["data"]
            block = (delta["request_event_id"], delta["index"])
            if block not in last_seq:  # the first on this connection: what it holds replaces ours
                self.texts[block] = delta["text"]
            else:
                expected = last_seq[block] + 1
                if delta["seq"] <= last_seq[block]:
                    self.duplicated += 1
                    continue
                self.missing += delta["seq"] - expected
                self.texts[block] = self.texts.get(block, "") + delta["text"]
            last_seq[block] = delta["seq"]
        return count


def test_two_hundred_cut_connections_rebuild_every_turn_exactly(tmp_path, mock):
    mock.reset()
    stack = launch_inprocess_stack(tmp_path, mock_provider_toml(mock.base_url), MOCK_LLM_TOKEN="sk-test-resume")
    try:
        run_all(stack, mock)
    finally:
        stack.close()


def send_into(outcome: dict, stack, sid: str, skey: str, params: dict) -> None:
    outcome["frames"] = rpc(stack.client, sid, skey, "session.sendMessage", params)


def run_all(stack, mock) -> None:
    chance = random.Random(35)
    sid, skey, _ = new_session(stack)
    register(stack, sid, skey)
    auth = {"Authorization": f"Bearer {skey}"}
    url = f"/api/v1/sessions/{sid}/events/stream"
    client = httpx.Client(base_url=str(stack.client.base_url), timeout=30)
    last_event = client.get(f"/api/v1/sessions/{sid}/events", headers=auth, params={"limit": 200}).json()["items"][-1]["id"]
    totals = {"missing events": 0, "duplicated events": 0, "missing deltas": 0, "duplicated deltas": 0, "wrong text": 0}
    cut_points = set()
    for run in range(RUNS):
        text = "".join(word + " " for word in chance.sample(WORDS, chance.randint(4, 12))).rstrip()
        mock.enqueue(Reply.text(text).streaming(pace=chance.choice((0.0, 0.001, 0.003))))
        rebuilt = Rebuilt()
        outcome: dict = {}
        # Records of a text turn: its 4 events and a delta per word; cut after any number of them.
        cut = chance.randint(0, 3 + len(text.split()))
        cut_points.add(cut)
        with client.stream("GET", url, headers={**auth, "Last-Event-ID": last_event},
                           params={"deltas": "true"}) as first:
            assert first.status_code == 200
            params = {"message": {"role": "user", "content": f"run {run}"}, "stream_deltas": True}
            turn = threading.Thread(target=send_into, args=(outcome, stack, sid, skey, params))
            turn.start()
            rebuilt.read(sse_records(first.iter_lines()), {}, cut)
        on_first = {event["id"] for event in rebuilt.events}
        resume_after = rebuilt.events[-1]["id"] if rebuilt.events else last_event
        second_seqs: dict[tuple[str, int], int] = {}
        if not rebuilt.events or rebuilt.events[-1]["event_type"] != "server.message.send":
            with client.stream("GET", url, headers={**auth, "Last-Event-ID": resume_after},
                               params={"deltas": "true"}) as second:
                assert second.status_code == 200
                rebuilt.read(sse_records(second.iter_lines()), second_seqs, None)
        turn.join(30)
        stored = result(outcome["frames"])["events"]
        ids = [event["id"] for event in rebuilt.events]
        totals["duplicated events"] += len(ids) - len(set(ids))
        totals["missing events"] += len({event["id"] for event in stored} - set(ids))
        assert [event["id"] for event in stored] == list(dict.fromkeys(ids))  # in order
        totals["missing deltas"] += rebuilt.missing
        totals["duplicated deltas"] += rebuilt.duplicated
        request = next(event for event in stored if event["event_type"] == "provider.request")
        response = next(event for event in stored if event["event_type"] == "provider.response")
        answer = response["payload"]["body"]["content"][0]["text"]
        # What the client made of the call's deltas is the whole text when it got its response on
        # the first connection, or got deltas on the second (a catch-up, then the rest). Else its
        # response came in the second one's replay, which left the call's stale deltas out.
        if response["id"] in on_first or (request["id"], 0) in second_seqs:
            totals["wrong text"] += rebuilt.texts.get((request["id"], 0)) != answer
        last_event = stored[-1]["id"]
    client.close()
    assert totals == dict.fromkeys(totals, 0)
    assert len(cut_points) > 8  # cut at many different places
