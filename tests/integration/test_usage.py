"""Usage accounting through the gateway, on the service processes: the totals of a session, of its
key, profile and day, against the usage the mock provider reported; the admin's groups, and baectl."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Iterator

import pytest

from testkit import ROOT
from testkit.live import all_events, declared, payloads, register, result, rpc, send
from testkit.mcp_support import TOOLS_SERVER
from testkit.mockllm import MockLLM, Reply
from testkit.processes import service_env
from testkit.stack import RunningStack, launch_stack, mock_provider_toml

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"
# "mock" and "free" speak Anthropic Messages, "gpt" OpenAI Chat Completions; all are the same MockLLM.
PRICES = {"mock": (3.0, 15.0), "gpt": (0.5, 1.5)}
TOTALS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
          "provider_calls", "turns", "cost_usd")


def config_toml(mock: MockLLM) -> str:
    entries = []
    for name, kind in (("mock", "anthropic"), ("gpt", "openai"), ("free", "anthropic")):
        entry = mock_provider_toml(mock.base_url, name=name, kind=kind)
        if name in PRICES:
            entry += "price_input_per_mtok = {}\nprice_output_per_mtok = {}\n".format(*PRICES[name])
        entries.append(entry)
    return "".join(entries) + (
        f'[[mcp.servers]]\nname = "local"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
        f'args = ["{TOOLS_SERVER}", "stdio"]\n'
    )


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, mock: MockLLM) -> Iterator[RunningStack]:
    running = launch_stack(tmp_path_factory.mktemp("usage"), config_toml(mock), MOCK_LLM_TOKEN=TOKEN)
    yield running
    running.close()


@pytest.fixture
def stack(shared: RunningStack, mock: MockLLM) -> RunningStack:
    mock.reset()
    return shared


def open_session(stack: RunningStack, primary: str = "mock", fallbacks: tuple[str, ...] = (),
                 mcp_servers: tuple[str, ...] = (), key: str | None = None, profile: dict | None = None):
    """A registered session on a new profile (or `profile`) with a new key (or `key`)."""
    profile = profile or stack.create_profile(f"p{time.monotonic_ns()}", primary=primary, allowed_tools=["get_time"],
                                              fallback_providers=list(fallbacks), mcp_servers=list(mcp_servers))
    key = key or stack.create_key(profile["id"])["key"]
    opened = stack.open_session(key, tools=declared(("get_time",)))
    sid, skey = opened["session_id"], opened["session_key"]
    register(stack, sid, skey)
    return sid, skey, profile


def session_usage(stack: RunningStack, sid: str, skey: str) -> dict:
    response = stack.client.get(f"/api/v1/sessions/{sid}/usage", headers={"Authorization": f"Bearer {skey}"})
    assert response.status_code == 200, response.text
    return response.json()


def cost(provider: str, input_tokens: int, output_tokens: int) -> float:
    """What a response costs at `provider`'s prices: every input token, cached or not, at the input price."""
    price_in, price_out = PRICES[provider]
    return (input_tokens * price_in + output_tokens * price_out) / 1_000_000


def reported(stack: RunningStack, sid: str, skey: str) -> dict:
    """What the provider's successful responses in the log reported, summed as usage counts them."""
    sums = dict.fromkeys(TOTALS[:4], 0)
    for response in payloads(all_events(stack, sid, skey), "provider.response"):
        usage = response["body"].get("usage") if response["ok"] else None
        if usage is None:
            continue
        if "prompt_tokens" in usage:  # OpenAI: the prompt count includes the cached part
            cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
            sums["input_tokens"] += usage["prompt_tokens"] - cached
            sums["cache_read_input_tokens"] += cached
            sums["output_tokens"] += usage["completion_tokens"]
        else:
            for name in TOTALS[:4]:
                sums[name] += usage.get(name, 0)
    return sums


def test_a_tool_loop_counts_each_call_and_one_turn(stack, mock):
    sid, skey, _ = open_session(stack, mcp_servers=("local",))
    mock.enqueue(Reply.tool_use([("tu_1", "echo", {"text": "x"})], usage=(100, 20, 1000, 50)),
                 Reply.text("done", usage=(30, 7, 1000, 0)))
    outcome = result(send(stack, sid, skey, "use the tool"))
    assert [p["ok"] for p in payloads(outcome["events"], "provider.response")] == [True, True]

    usage = session_usage(stack, sid, skey)
    assert usage == {
        "session_id": sid, "input_tokens": 130, "output_tokens": 27, "cache_read_input_tokens": 2000,
        "cache_creation_input_tokens": 50, "provider_calls": 2, "turns": 1,
        "cost_usd": pytest.approx(cost("mock", 100 + 1000 + 50, 20) + cost("mock", 30 + 1000, 7)),
    }
    assert {name: usage[name] for name in TOTALS[:4]} == reported(stack, sid, skey)

    # A turn that pauses for a client tool, and the one that answers it: two turns more.
    mock.enqueue(Reply.tool_use([("tu_2", "get_time", {})], usage=(5, 1)), Reply.text("ok", usage=(6, 2)))
    send(stack, sid, skey, "what time is it?")
    send(stack, sid, skey, [{"type": "tool_result", "tool_use_id": "tu_2", "content": "noon"}])
    after = session_usage(stack, sid, skey)
    assert (after["input_tokens"], after["output_tokens"], after["provider_calls"], after["turns"]) == (141, 30, 4, 3)


def test_a_fallback_counts_the_failed_call_and_prices_the_entry_that_answered(stack, mock):
    # "free" has no prices; "gpt" (the fallback that answers) has.
    sid, skey, _ = open_session(stack, primary="free", fallbacks=("gpt",))
    mock.enqueue(Reply.error(503, "busy"), Reply.text("hi", usage=(40, 6, 8, 0)))
    walk = [(e["event_type"], e["payload"].get("ok")) for e in result(send(stack, sid, skey, "hi"))["events"]]
    assert [ok for kind, ok in walk if kind == "provider.response"] == [False, True]
    usage = session_usage(stack, sid, skey)
    assert usage == {
        "session_id": sid, "input_tokens": 40, "output_tokens": 6, "cache_read_input_tokens": 8,
        "cache_creation_input_tokens": 0, "provider_calls": 2, "turns": 1, "cost_usd": pytest.approx(cost("gpt", 48, 6)),
    }

    # A compaction's call counts, at its own entry's prices (none: the cost stays the fallback's).
    mock.enqueue(Reply.text("The summary.", usage=(200, 30)))
    completed = result(rpc(stack.client, sid, skey, "session.compact"))
    assert completed["event_type"] == "session.compaction.completed"
    usage = session_usage(stack, sid, skey)
    assert {name: usage[name] for name in TOTALS} == {
        "input_tokens": 240, "output_tokens": 36, "cache_read_input_tokens": 8, "cache_creation_input_tokens": 0,
        "provider_calls": 3, "turns": 1, "cost_usd": pytest.approx(cost("gpt", 48, 6)),
    }
    assert {name: usage[name] for name in TOTALS[:4]} == reported(stack, sid, skey)


def test_a_session_without_calls_and_the_credential(stack, mock):
    sid, skey, _ = open_session(stack)
    assert session_usage(stack, sid, skey) == {
        "session_id": sid, **dict.fromkeys(TOTALS[:6], 0), "cost_usd": None,
    }
    other, other_key, _ = open_session(stack)
    for auth in ("Bearer nope", f"Bearer {other_key}", None):
        headers = {"Authorization": auth} if auth else {}
        response = stack.client.get(f"/api/v1/sessions/{sid}/usage", headers=headers)
        assert response.status_code == 401, response.text
        assert response.json()["type"] == "unauthorized"


def test_admin_groups_by_key_profile_and_day(stack, mock):
    profile = stack.create_profile(f"p{time.monotonic_ns()}", primary="free", allowed_tools=["get_time"])
    keys = [stack.create_key(profile["id"], name=name) for name in ("a", "b")]
    for number, key in enumerate(keys, start=1):
        sid, skey, _ = open_session(stack, key=key["key"], profile=profile)
        mock.enqueue(Reply.text("ok", usage=(10 * number, number)))
        send(stack, sid, skey, "hi")

    def groups(**params) -> list[dict]:
        response = stack.admin.get("/admin/v1/usage", params=params)
        assert response.status_code == 200, response.text
        return response.json()["items"]

    by_key = {group["client_key_id"]: group for group in groups(group_by="key", limit="200")}
    expected = {"cache_read_input_tokens": 0, "cache_creation_input_tokens": 0, "provider_calls": 1, "turns": 1,
                "cost_usd": None}
    assert by_key[keys[0]["id"]] == {"client_key_id": keys[0]["id"], "input_tokens": 10, "output_tokens": 1, **expected}
    assert by_key[keys[1]["id"]] == {"client_key_id": keys[1]["id"], "input_tokens": 20, "output_tokens": 2, **expected}
    by_profile = {group["profile_id"]: group for group in groups(group_by="profile", limit="200")}
    assert by_profile[profile["id"]] == {"profile_id": profile["id"], "input_tokens": 30, "output_tokens": 3,
                                         **expected, "provider_calls": 2, "turns": 2}
    # Every grouping adds up to the same totals.
    days = groups(group_by="day")
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    assert days[-1]["day"] == today
    for name in TOTALS[:6]:
        assert sum(g[name] for g in days) == sum(g[name] for g in by_key.values()) == \
            sum(g[name] for g in by_profile.values())
    assert groups(group_by="day", since="2000-01-01", until="2000-12-31") == []
    assert groups(group_by="day", since=today, until=today) == [days[-1]]

    # Pages of one group, each starting after the last one's key.
    paged, cursor = [], ""
    while cursor is not None:
        page = stack.admin.get("/admin/v1/usage", params={"group_by": "key", "limit": "1", "cursor": cursor}).json()
        assert len(page["items"]) == 1
        paged += page["items"]
        cursor = page["next_cursor"]
    assert paged == sorted(by_key.values(), key=lambda group: group["client_key_id"])

    for params, detail in [
        ({}, "invalid group_by (missing); expected one of key, profile, day"),
        ({"group_by": "session"}, 'invalid group_by ("session"); expected one of key, profile, day'),
        ({"group_by": "day", "since": "2026-2-01"}, 'invalid since "2026-2-01"; expected a UTC day, YYYY-MM-DD'),
        ({"group_by": "day", "until": "2026-02-30"}, 'invalid until "2026-02-30"; expected a UTC day, YYYY-MM-DD'),
        ({"group_by": "day", "since": "2026-02-02", "until": "2026-02-01"}, "since (2026-02-02) is after until (2026-02-01)"),
        ({"group_by": "key", "cursor": "a b"}, 'invalid cursor: "a b"'),
        ({"group_by": "key", "limit": "0"}, "limit must be a positive integer"),
    ]:
        response = stack.admin.get("/admin/v1/usage", params=params)
        assert response.status_code == 400, (params, response.text)
        assert response.json() == {"type": "bad_request", "title": "Bad Request", "status": 400, "detail": detail}
    assert stack.admin.get("/admin/v1/usage", params={"group_by": "key"},
                           headers={"Authorization": "Bearer nope"}).status_code == 401


def baectl(stack: RunningStack, *args: str) -> subprocess.CompletedProcess:
    env = service_env(BAE_ADMIN_ADDR=str(stack.settings.admin_addr), BAE_ADMIN_TOKEN=stack.admin_key)
    return subprocess.run([sys.executable, "-m", "bae.ctl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_baectl_usage(stack, mock):
    sid, skey, profile = open_session(stack, primary="mock")
    mock.enqueue(Reply.text("ok", usage=(1000, 100)))
    send(stack, sid, skey, "hi")

    shown = baectl(stack, "usage", "--group-by", "profile", "--json")
    assert shown.returncode == 0, shown.stderr
    groups = json.loads(shown.stdout)  # every page, one flat array
    (mine,) = [group for group in groups if group["profile_id"] == profile["id"]]
    assert mine["input_tokens"] == 1000 and mine["cost_usd"] == pytest.approx(cost("mock", 1000, 100))

    table = baectl(stack, "usage", "--group-by", "profile")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["PROFILE_ID", "INPUT", "OUTPUT", "CACHE_READ", "CACHE_WRITE", "CALLS", "TURNS", "COST_USD"]
    (row,) = [row.split() for row in rows if row.startswith(profile["id"])]
    assert row[1:7] == ["1000", "100", "0", "0", "1", "1"] and float(row[7]) == pytest.approx(cost("mock", 1000, 100))

    page = baectl(stack, "usage", "--limit", "1", "--json")  # by day (the default), one page
    assert page.returncode == 0, page.stderr
    assert set(json.loads(page.stdout)) == {"items", "next_cursor"}
    assert baectl(stack, "usage", "--since", "2000-01-01", "--until", "2000-01-02").stdout == "no usage recorded\n"

    refused = baectl(stack, "usage", "--since", "yesterday")
    assert refused.returncode == 1
    assert refused.stderr == 'baectl: invalid since "yesterday"; expected a UTC day, YYYY-MM-DD\n'


def budget_profile(stack: RunningStack, **limits) -> dict:
    return stack.create_profile(f"b{time.monotonic_ns()}", allowed_tools=["get_time"], mcp_servers=["local"],
                                limits=limits)


def test_a_used_up_budget_refuses_the_next_message_and_records_nothing(stack, mock):
    sid, skey, profile = open_session(stack, profile=budget_profile(stack, session_tokens=100))
    mock.enqueue(Reply.text("first", usage=(90, 30)))
    result(send(stack, sid, skey, "hi"))  # 0 used before the call: it runs, and uses 120
    before = all_events(stack, sid, skey)
    frames = send(stack, sid, skey, "more")
    assert frames[-1]["error"] == {"code": -32051, "message": "budget_exhausted: session_tokens 120/100"}
    assert all_events(stack, sid, skey) == before and len(mock.requests) == 1
    assert rpc(stack.client, sid, skey, "session.compact")[-1]["error"] == {
        "code": -32051, "message": "budget_exhausted: session_tokens 120/100"}  # a compaction is a call too
    # Raising the budget lets the session go on.
    body = {"name": profile["name"], "primary_provider": "mock", "allowed_tools": ["get_time"],
            "mcp_servers": ["local"], "limits": {"session_tokens": 1000}}
    assert stack.admin.put(f"/admin/v1/profiles/{profile['id']}", json=body).status_code == 200
    mock.enqueue(Reply.text("again"))
    assert result(send(stack, sid, skey, "more"))["message"]["content"][0]["text"] == "again"


def test_a_budget_used_up_inside_a_tool_loop_ends_the_turn_with_a_valid_history(stack, mock):
    sid, skey, _ = open_session(stack, profile=budget_profile(stack, session_cost_usd=0.001))
    # 1000 input tokens at $3/Mtok and 100 output at $15/Mtok: $0.0045, over the $0.001 budget.
    mock.enqueue(Reply.tool_use([("tu_1", "echo", {"text": "x"})], usage=(1000, 100)))
    frames = send(stack, sid, skey, "use the tool")
    assert frames[-1]["error"] == {"code": -32051, "message": "budget_exhausted: session_cost_usd 0.0045/0.001"}
    assert len(mock.requests) == 1  # the loop's second call was never made
    events = all_events(stack, sid, skey)
    error = events[-1]
    assert error["event_type"] == "session.error"
    assert error["payload"] == {"reason": "budget_exhausted", "budget": "session_cost_usd", "used": 0.0045,
                                "limit": 0.001}
    kinds = [e["event_type"] for e in events]
    assert kinds[-3:-1] == ["server.message.send", "server.message.send"]  # the tool call, then its result
    call, answer = (e["payload"] for e in events[-3:-1])
    assert [b["id"] for b in call["content"] if b["type"] == "tool_use"] == ["tu_1"]
    assert answer["synthetic"] == "budget_exhausted_tool_results"
    assert [b["tool_use_id"] for b in answer["content"]] == ["tu_1"]
    assert stack.admin.get(f"/admin/v1/sessions/{sid}").json()["state"] == "open"


def test_a_keys_daily_budget_spans_its_sessions(stack, mock):
    profile = budget_profile(stack, key_daily_tokens=100)
    key = stack.create_key(profile["id"])["key"]
    first, first_key, _ = open_session(stack, key=key, profile=profile)
    second, second_key, _ = open_session(stack, key=key, profile=profile)
    mock.enqueue(Reply.text("first", usage=(100, 20)))
    result(send(stack, first, first_key, "hi"))
    assert send(stack, second, second_key, "hi")[-1]["error"] == {
        "code": -32051, "message": "budget_exhausted: key_daily_tokens 120/100"}
    other, other_key, _ = open_session(stack, profile=profile)  # another key of the profile has its own day
    mock.enqueue(Reply.text("mine"))
    assert result(send(stack, other, other_key, "hi"))["message"]["content"][0]["text"] == "mine"
