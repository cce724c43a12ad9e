"""Merge rules, tool scoping and the multi-driver sequence through the whole stack.

SERVER-SPEC §7.4 (resuming a paused turn), §7.5 (tool scoping), §6.4 (echo
suppression) and §14 (typical sequences 5, 9 and 10). The server-side half of
a mixed assistant turn is a tool name no driver declared and no MCP server
serves: it is classified `mcp`, answered by the server with an error result and
never pauses, so a mixed client + server pause needs no MCP child process.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

import httpx
import pytest

from testkit.live import at, declared, notifications, payloads, result, rpc, session_state, terminal, types
from testkit.mockllm import Reply
from testkit.inprocess import launch_inprocess_stack
from testkit.stack import StackClients, mock_provider_toml

pytestmark = pytest.mark.inprocess

TOKEN = "sk-test-secret-token-merge"
ABANDONED = "Client tool call was abandoned before returning a result."
TURN_TIMEOUT = 1.0  # seconds; BAE_TURN_TIMEOUT of the shared stack


# --- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared(tmp_path_factory, mock) -> Iterator[StackClients]:
    """One stack for the module: every test opens sessions of its own (a stack start costs seconds)."""
    running = launch_inprocess_stack(
        tmp_path_factory.mktemp("merge"), mock_provider_toml(mock.base_url),
        MOCK_LLM_TOKEN=TOKEN, BAE_TURN_TIMEOUT=str(int(TURN_TIMEOUT)),
    )
    yield running
    running.close()


@pytest.fixture
def stack(shared, mock) -> StackClients:
    mock.reset()
    return shared


# --- helpers ------------------------------------------------------------------------


@dataclass(frozen=True)
class Driver:
    key_id: str  # the client key id every event of this driver is attributed to
    skey: str  # its session key


def open_session(stack, tools: tuple[str, ...], allowed: tuple[str, ...] = ("get_time", "get_date")):
    """A new profile and key; the key opens a session declaring `tools` and registers."""
    profile = stack.create_profile(f"p{time.monotonic_ns()}", allowed_tools=list(allowed))
    key = stack.create_key(profile["id"], name="a")
    opened = stack.open_session(key["key"], tools=declared(tools))
    driver = Driver(key["id"], opened["session_key"])
    register(stack, opened["session_id"], driver)
    return opened["session_id"], profile, driver


def join(stack, sid: str, profile: dict, name: str, tools: tuple[str, ...] = (), *, as_driver: bool = True) -> Driver:
    key = stack.create_key(profile["id"], name=name)
    joined = stack.client.post(
        f"/api/v1/sessions/{sid}/join",
        json={"tools": declared(tools)},
        headers={"Authorization": f"Bearer {key['key']}"},
    )
    assert joined.status_code == 201, joined.text
    participant = Driver(key["id"], joined.json()["session_key"])
    if as_driver:
        register(stack, sid, participant)
    return participant


def register(stack, sid: str, driver: Driver) -> None:
    assert result(rpc(stack.client, sid, driver.skey, "session.registerDriver")) == {"registered": True}


def send(stack, sid: str, driver: Driver, content, role: str = "user") -> list[dict]:
    return rpc(stack.client, sid, driver.skey, "session.sendMessage", {"message": {"role": role, "content": content}})


def log(stack, sid: str, driver: Driver) -> list[dict]:
    page = stack.client.get(
        f"/api/v1/sessions/{sid}/events", params={"limit": 200}, headers={"Authorization": f"Bearer {driver.skey}"}
    )
    assert page.status_code == 200, page.text
    return page.json()["items"]


def authors(events: list[dict]) -> set[str]:
    return {e["client_key_id"] for e in events}


def answer(tool_use_id: str, content: Any = "12:00") -> dict:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def abandoned(tool_use_id: str) -> dict:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": ABANDONED, "is_error": True}


def unroutable(name: str) -> str:
    return f"no MCP server is configured for tool '{name}'"


# --- 1. merge rules (§7.4) -------------------------------------------------------------

# The paused assistant turn of every merge case: one server-side block, then two client blocks.
PAUSING_CALLS = [("tu_s", "lookup", {"q": "x"}), ("tu_c", "get_time", {}), ("tu_d", "get_date", {})]
SERVER_RESULT = {
    "type": "tool_result",
    "tool_use_id": "tu_s",
    "content": [text(f"MCP error: {unroutable('lookup')}")],
    "is_error": True,
}
PAUSED_MESSAGE = {
    "role": "assistant",
    "content": [
        {"type": "tool_use", "id": "tu_s", "name": "lookup", "input": {"q": "x"}, "dispatch": "mcp"},
        {"type": "tool_use", "id": "tu_c", "name": "get_time", "input": {}, "dispatch": "client"},
        {"type": "tool_use", "id": "tu_d", "name": "get_date", "input": {}, "dispatch": "client"},
    ],
}


def pause_mixed(stack, mock) -> tuple[str, dict, Driver]:
    """Spec sequence 5, call 1: the server block is answered, the turn parks on the client blocks."""
    sid, profile, driver = open_session(stack, tools=("get_time", "get_date"))
    mock.enqueue(Reply.tool_use(PAUSING_CALLS))
    frames = send(stack, sid, driver, "three tools please")
    paused = result(frames)
    assert paused["message"] == PAUSED_MESSAGE
    events = paused["events"]
    assert types(events) == [
        "client.message.send", "provider.request", "provider.response",
        "tool.call", "tool.call", "tool.call", "mcp.request", "mcp.response", "tool.result",
        "server.message.send",
    ]
    assert [(p["id"], p["dispatch"], p["server_name"]) for p in payloads(events, "tool.call")] == [
        ("tu_s", "mcp", None), ("tu_c", "client", None), ("tu_d", "client", None),
    ]
    assert payloads(events, "mcp.response") == [{"server_name": None, "ok": False, "error": unroutable("lookup")}]
    assert payloads(events, "tool.result") == [
        {"tool_use_id": "tu_s", "dispatch": "mcp", "server_name": None, "is_error": True,
         "content": SERVER_RESULT["content"]},
    ]
    assert events[-1]["payload"] == PAUSED_MESSAGE
    assert authors(events) == {driver.key_id}
    assert types(notifications(frames)) == types(events)[1:]
    return sid, profile, driver


@pytest.mark.parametrize(
    "content, merged",
    [
        pytest.param([answer("tu_c"), answer("tu_d", "today")],
                     [SERVER_RESULT, answer("tu_c"), answer("tu_d", "today")], id="answers-every-client-id"),
        pytest.param([answer("tu_d", "today"), answer("tu_c")],
                     [SERVER_RESULT, answer("tu_c"), answer("tu_d", "today")], id="results-follow-tool-use-order"),
        pytest.param([answer("tu_s", "forged"), answer("tu_c"), answer("tu_d", "today")],
                     [SERVER_RESULT, answer("tu_c"), answer("tu_d", "today")],
                     id="client-copy-of-a-server-id-is-dropped"),
        pytest.param([text("and a note"), answer("tu_c"), answer("tu_d", [text("today")])],
                     [SERVER_RESULT, answer("tu_c"), answer("tu_d", [text("today")]), text("and a note")],
                     id="text-blocks-follow-the-results"),
        pytest.param("never mind",
                     [SERVER_RESULT, abandoned("tu_c"), abandoned("tu_d"), text("never mind")],
                     id="plain-string-abandons"),
        pytest.param([text("skip those")],
                     [SERVER_RESULT, abandoned("tu_c"), abandoned("tu_d"), text("skip those")],
                     id="text-only-array-abandons"),
    ],
)
def test_accepted_continuation_records_one_merged_user_turn(stack, mock, content, merged):
    sid, _, driver = pause_mixed(stack, mock)
    mock.enqueue(Reply.text("all answered"))
    frames = send(stack, sid, driver, content)
    outcome = result(frames)
    assert outcome["message"] == {"role": "assistant", "content": [text("all answered")]}
    events = outcome["events"]
    assert types(events) == [
        "client.message.send", "tool.result", "tool.result", "provider.request", "provider.response",
        "server.message.send",
    ]
    assert events[0]["payload"] == {"role": "user", "content": merged}
    # tool.result only for the client ids: the server's was logged when it was dispatched.
    assert payloads(events, "tool.result") == [
        {"tool_use_id": block["tool_use_id"], "dispatch": "client", "server_name": None,
         "is_error": block.get("is_error", False), "content": block["content"]}
        for block in merged[1:3]
    ]
    assert authors(events) == {driver.key_id}
    assert types(notifications(frames)) == ["provider.request", "provider.response", "server.message.send"]
    assert session_state(stack, sid) == "open"

    # Every tool_use is answered exactly once, in the log and in what the provider received.
    answered = [p["tool_use_id"] for p in payloads(log(stack, sid, driver), "tool.result")]
    assert answered == ["tu_s", "tu_c", "tu_d"]
    sent = mock.requests[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == [{k: v for k, v in b.items() if k != "dispatch"} for b in PAUSED_MESSAGE["content"]]
    assert sent[2]["content"] == merged


@pytest.mark.parametrize(
    "role, content, detail",
    [
        pytest.param("user", [answer("tu_c"), answer("tu_d"), answer("tu_x")],
                     'tool_result id "tu_x" is not in the paused assistant turn', id="id-not-in-the-paused-turn"),
        pytest.param("user", [answer("tu_c"), answer("tu_c"), answer("tu_d")],
                     'client returned a duplicate tool_result for id "tu_c"', id="duplicate-id"),
        pytest.param("user", [answer("tu_s"), answer("tu_s"), answer("tu_c"), answer("tu_d")],
                     'client returned a duplicate tool_result for id "tu_s"', id="duplicate-server-id"),
        pytest.param("user", [answer("tu_c")], 'no tool_result for tool_use id "tu_d"', id="missing-id"),
        pytest.param("user", [answer("tu_s")], 'no tool_result for tool_use id "tu_c"',
                     id="server-id-only-answers-nothing"),
        pytest.param("user", [], 'no tool_result for tool_use id "tu_c"', id="empty-array"),
        pytest.param("user", "", 'no tool_result for tool_use id "tu_c"', id="empty-string"),
        pytest.param("assistant", [answer("tu_c"), answer("tu_d")],
                     'paused tool continuation must have role "user", got "assistant"', id="assistant-role"),
        pytest.param("system", "never mind",
                     'paused tool continuation must have role "user", got "system"',
                     id="role-checked-before-abandoning"),
    ],
)
def test_invalid_continuation_moves_the_session_to_error(stack, mock, role, content, detail):
    sid, _, driver = pause_mixed(stack, mock)
    frames = send(stack, sid, driver, content, role=role)
    assert len(frames) == 1  # nothing streamed: the stream subscribes only after the merge
    assert terminal(frames)["error"] == {"code": -32000, "message": f"tool result merge invalid: {detail}"}
    events = log(stack, sid, driver)
    assert types(events)[-2:] == ["server.message.send", "session.error"]
    assert events[-1]["payload"] == {"reason": "tool_result_merge_invalid", "detail": detail}
    assert events[-1]["client_key_id"] == driver.key_id
    assert session_state(stack, sid) == "error"
    assert len(mock.requests) == 1  # the provider never saw the broken exchange
    refused = terminal(send(stack, sid, driver, "hello again"))["error"]
    assert refused == {"code": -32000, "message": "session is error, not open"}


def test_a_paused_turn_with_duplicate_tool_use_ids_cannot_be_resumed(stack, mock):
    sid, _, driver = open_session(stack, tools=("get_time",))
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {}), ("tu_1", "get_time", {})]))
    paused = result(send(stack, sid, driver, "twice"))
    assert [p["id"] for p in payloads(paused["events"], "tool.call")] == ["tu_1", "tu_1"]
    frames = send(stack, sid, driver, [answer("tu_1")])
    detail = "paused assistant turn contains duplicate tool_use ids"
    assert terminal(frames)["error"] == {"code": -32000, "message": f"tool result merge invalid: {detail}"}
    assert log(stack, sid, driver)[-1]["payload"] == {"reason": "tool_result_merge_invalid", "detail": detail}
    assert session_state(stack, sid) == "error"


def test_duplicate_ids_are_classified_per_block_and_refused_at_resume(stack, mock):
    """A model reusing one id for a client and a server tool: each block keeps its own dispatch (§7.5)."""
    sid, _, driver = open_session(stack, tools=("get_time",))
    mock.enqueue(Reply.tool_use([("tu_1", "get_time", {}), ("tu_1", "lookup", {})]))
    paused = result(send(stack, sid, driver, "same id twice"))
    assert [(p["name"], p["dispatch"]) for p in payloads(paused["events"], "tool.call")] == [
        ("get_time", "client"), ("lookup", "mcp"),
    ]
    assert [p["tool"] for p in payloads(paused["events"], "mcp.request")] == ["lookup"]
    assert [block["dispatch"] for block in paused["message"]["content"]] == ["client", "mcp"]
    assert len(mock.requests) == 1  # the client block paused the turn
    frames = send(stack, sid, driver, [answer("tu_1")])
    detail = "paused assistant turn contains duplicate tool_use ids"
    assert terminal(frames)["error"] == {"code": -32000, "message": f"tool result merge invalid: {detail}"}
    assert session_state(stack, sid) == "error"


def test_owner_resumes_its_own_pause_after_the_deadline(stack, mock):
    sid, _, driver = pause_mixed(stack, mock)
    time.sleep(TURN_TIMEOUT + 0.2)  # nobody else arrived, so nothing reclaimed it
    mock.enqueue(Reply.text("late but fine"))
    outcome = result(send(stack, sid, driver, [answer("tu_c"), answer("tu_d")]))
    assert outcome["message"]["content"] == [text("late but fine")]
    assert outcome["events"][0]["payload"]["content"] == [SERVER_RESULT, answer("tu_c"), answer("tu_d")]
    assert "session.error" not in types(log(stack, sid, driver))


def test_expired_pause_reclaimed_by_another_driver_then_the_owner_is_an_orphan(stack, mock):
    """Spec sequence 10, then the owner's late results (00-client-api: nothing recorded, still open)."""
    sid, profile, owner = pause_mixed(stack, mock)
    other = join(stack, sid, profile, "b")
    time.sleep(TURN_TIMEOUT + 0.2)
    mock.enqueue(Reply.text("B served"))
    frames = send(stack, sid, other, "B here")
    outcome = result(frames)
    events = outcome["events"]
    # driver_turn_abandoned is written before B subscribes: in the log, not in B's result (O-5).
    assert types(events) == [
        "client.message.send", "tool.result", "tool.result", "provider.request", "provider.response",
        "server.message.send",
    ]
    assert events[0]["payload"] == {
        "role": "user", "content": [SERVER_RESULT, abandoned("tu_c"), abandoned("tu_d"), text("B here")],
    }
    assert [(p["tool_use_id"], p["is_error"], p["content"]) for p in payloads(events, "tool.result")] == [
        ("tu_c", True, ABANDONED), ("tu_d", True, ABANDONED),
    ]
    assert authors(events) == {other.key_id}
    assert types(notifications(frames)) == ["provider.request", "provider.response", "server.message.send"]
    recorded = log(stack, sid, owner)
    reclaim = recorded[-len(events) - 1]
    assert (reclaim["event_type"], reclaim["client_key_id"]) == ("session.error", owner.key_id)
    assert reclaim["payload"] == {"reason": "driver_turn_abandoned", "owner_client_key_id": owner.key_id}
    assert [m["role"] for m in mock.requests[-1]["body"]["messages"]] == ["user", "assistant", "user"]

    late = terminal(send(stack, sid, owner, [answer("tu_c"), answer("tu_d")]))["error"]
    assert late == {
        "code": -32000,
        "message": "tool result merge invalid: no paused turn is awaiting tool results "
                   "(it may have timed out and been retired)",
    }
    assert [e["id"] for e in log(stack, sid, owner)] == [e["id"] for e in recorded]
    assert session_state(stack, sid) == "open"


def test_a_reclaimer_sending_tool_results_breaks_the_session(stack, mock):
    sid, profile, owner = pause_mixed(stack, mock)
    other = join(stack, sid, profile, "b")
    time.sleep(TURN_TIMEOUT + 0.2)
    frames = send(stack, sid, other, [answer("tu_c"), answer("tu_d")])
    detail = "timed-out replacement message must not contain tool_result blocks"
    assert terminal(frames)["error"] == {"code": -32000, "message": f"tool result merge invalid: {detail}"}
    tail = log(stack, sid, owner)[-2:]
    assert [(e["event_type"], e["client_key_id"], e["payload"]) for e in tail] == [
        ("session.error", owner.key_id, {"reason": "driver_turn_abandoned", "owner_client_key_id": owner.key_id}),
        ("session.error", other.key_id, {"reason": "tool_result_merge_invalid", "detail": detail}),
    ]
    assert session_state(stack, sid) == "error"
    assert len(mock.requests) == 1


# --- 2. tool scoping between drivers (§7.5) ------------------------------------------


def test_each_driver_sees_and_dispatches_only_its_own_tools(stack, mock):
    sid, profile, a = open_session(stack, tools=("get_time",))
    b = join(stack, sid, profile, "b", tools=("get_date",))

    # A's model calls B's tool: not A's, so it is classified mcp and answered unroutable.
    mock.enqueue(Reply.tool_use([("tu_1", "get_date", {})]), Reply.text("A done"))
    a_turn = result(send(stack, sid, a, "A asks"))
    assert a_turn["message"]["content"] == [text("A done")]
    events = a_turn["events"]
    assert types(events) == [
        "client.message.send", "provider.request", "provider.response",
        "tool.call", "mcp.request", "mcp.response", "tool.result",
        "provider.request", "provider.response", "server.message.send",
    ]
    assert payloads(events, "tool.call") == [
        {"id": "tu_1", "name": "get_date", "input": {}, "dispatch": "mcp", "server_name": None},
    ]
    assert payloads(events, "mcp.response") == [{"server_name": None, "ok": False, "error": unroutable("get_date")}]
    assert payloads(events, "tool.result") == [
        {"tool_use_id": "tu_1", "dispatch": "mcp", "server_name": None, "is_error": True,
         "content": [text(f"MCP error: {unroutable('get_date')}")]},
    ]
    assert authors(events) == {a.key_id}
    assert [r["body"]["tools"] for r in mock.requests] == [declared(("get_time",))] * 2

    # B's model calls A's tool and its own: only its own pauses the turn for B.
    mock.reset()
    mock.enqueue(Reply.tool_use([("tu_2", "get_time", {}), ("tu_3", "get_date", {})]), Reply.text("B done"))
    b_paused = result(send(stack, sid, b, "B asks"))
    assert [(p["id"], p["dispatch"]) for p in payloads(b_paused["events"], "tool.call")] == [
        ("tu_2", "mcp"), ("tu_3", "client"),
    ]
    assert [block["dispatch"] for block in b_paused["message"]["content"]] == ["mcp", "client"]
    b_turn = result(send(stack, sid, b, [answer("tu_3", "today")]))
    assert b_turn["message"]["content"] == [text("B done")]
    assert payloads(b_turn["events"], "tool.result") == [
        {"tool_use_id": "tu_3", "dispatch": "client", "server_name": None, "is_error": False, "content": "today"},
    ]
    assert authors(b_paused["events"] + b_turn["events"]) == {b.key_id}
    assert [r["body"]["tools"] for r in mock.requests] == [declared(("get_date",))] * 2

    # Replacing A's declarations leaves B's untouched.
    assert result(rpc(stack.client, sid, a.skey, "session.updateClientTools", {"tools": []})) == {"updated": True}
    mock.reset()
    result(send(stack, sid, a, "A again"))
    result(send(stack, sid, b, "B again"))
    assert [r["body"]["tools"] for r in mock.requests] == [[], declared(("get_date",))]


# --- 3. the multi-driver sequence and who sees what (§14.9, §6.4) --------------------


class Subscription:
    """A `session.subscribe` stream read on its own thread; replays from `since` so no event is missed."""

    def __init__(self, stack, sid: str, participant: Driver, since: str) -> None:
        self.lines: list[dict] = []
        body = {"jsonrpc": "2.0", "id": 1, "method": "session.subscribe", "params": {"since_event_id": since}}
        self._thread = threading.Thread(target=self._read, args=(stack.client.base_url, sid, participant, body))
        self._thread.start()

    def _read(self, base_url, sid: str, participant: Driver, body: dict) -> None:
        with httpx.Client(base_url=base_url, timeout=30) as client:
            with client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=body,
                               headers={"Authorization": f"Bearer {participant.skey}"}) as response:
                for line in response.iter_lines():
                    self.lines.append(json.loads(line))

    def events(self) -> list[dict]:
        return notifications(self.lines)

    def wait_for(self, event_type: str, count: int = 1, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while types(self.events()).count(event_type) < count:
            assert time.monotonic() < deadline, types(self.events())
            time.sleep(0.02)

    def join(self) -> None:
        self._thread.join(10)
        assert not self._thread.is_alive()


def test_multi_driver_sequence_attribution_and_echo_suppression(stack, mock):
    sid, profile, a = open_session(stack, tools=("get_time",))
    b = join(stack, sid, profile, "b")
    observer = join(stack, sid, profile, "observer", as_driver=False)
    before_turns = log(stack, sid, a)
    assert [(e["event_type"], e["client_key_id"]) for e in before_turns] == [
        ("session.open", a.key_id), ("session.driver.register", a.key_id),
        ("session.join", b.key_id), ("session.driver.register", b.key_id),
        ("session.join", observer.key_id),
    ]
    since = before_turns[-1]["id"]
    watchers = {"observer": Subscription(stack, sid, observer, since), "A's own": Subscription(stack, sid, a, since)}

    mock.enqueue(Reply.hang(1), Reply.text("for B"))  # A's provider call is slow: B arrives mid-turn
    a_frames: list[dict] = []
    a_thread = threading.Thread(target=lambda: a_frames.extend(send(stack, sid, a, "A asks")))
    a_thread.start()
    watchers["observer"].wait_for("provider.request")
    b_sent = time.time()
    b_lines: list[dict] = []
    b_first_byte = 0.0
    with httpx.Client(base_url=stack.client.base_url, timeout=30) as client:
        body = {"jsonrpc": "2.0", "id": 2, "method": "session.sendMessage",
                "params": {"message": {"role": "user", "content": "B asks"}}}
        with client.stream("POST", f"/api/v1/sessions/{sid}/rpc", json=body,
                           headers={"Authorization": f"Bearer {b.skey}"}) as response:
            for line in response.iter_lines():
                b_first_byte = b_first_byte or time.time()
                b_lines.append(json.loads(line))
    a_thread.join(15)
    for watcher in watchers.values():
        watcher.wait_for("server.message.send", count=2)
    assert result(rpc(stack.client, sid, observer.skey, "session.unsubscribe")) == {"unsubscribed": True}
    for watcher in watchers.values():
        watcher.join()

    turn = ["client.message.send", "provider.request", "provider.response", "server.message.send"]
    recorded = log(stack, sid, a)[len(before_turns):]
    assert types(recorded) == turn + turn
    assert [e["client_key_id"] for e in recorded] == [a.key_id] * 4 + [b.key_id] * 4
    a_events, b_events = recorded[:4], recorded[4:]
    assert [e["payload"]["content"] for e in (a_events[0], b_events[0])] == ["A asks", "B asks"]
    assert result(a_frames)["events"] == a_events
    assert result(b_lines)["events"] == b_events

    # B's request was silent until A's turn released the gate.
    assert b_sent < at(a_events[-1]) <= b_first_byte
    # Each sendMessage stream: its own turn minus its own client.message.send, nothing of the other turn.
    assert notifications(a_frames) == a_events[1:]
    assert notifications(b_lines) == b_events[1:]
    # Subscribers get everything, even the subscribing key's own messages: echo suppression is per request.
    assert watchers["observer"].events() == recorded
    assert watchers["A's own"].events() == recorded
    assert all("id" not in line for w in watchers.values() for line in w.lines)
    # B's provider call carried A's finished turn: one shared history.
    assert mock.requests[-1]["body"]["messages"] == [
        {"role": "user", "content": "A asks"},
        {"role": "assistant", "content": [text("ok")]},
        {"role": "user", "content": "B asks"},
    ]
