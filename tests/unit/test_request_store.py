"""Provider requests stored by reference (store/requests.py), on a SQLite file and on PostgreSQL: what
is read back is what was appended, byte for byte, and a turn stores a constant number of bytes."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from bae.common.jsontext import RawJson, dump
from bae.services.session.store import Store
from bae.services.session.store.requests import RequestJson
from testkit.postgres_support import STORES, store_url  # noqa: F401 - the fixture
from tests.unit.test_store import new_session, store  # noqa: F401 - the fixture

pytestmark = pytest.mark.parametrize("store_url", STORES, indirect=True)

HEAD = '{"attempt":0,"kind":"primary","provider":"anthropic","base_url":"http://x","model":"m","max_tokens":64,"tools":[]'


def as_sent(texts: list[str]) -> RequestJson:
    """A request as the runner client builds it (remote/runner.py)."""
    head = HEAD + ',"messages":'
    return RequestJson(head + "[" + ",".join(texts) + "]}", messages=tuple(texts), at=len(head))


def message(role: str, text: str) -> str:
    return dump({"role": role, "content": [{"type": "text", "text": text}]})


async def stored_sizes(db: Store, session_id: str) -> tuple[int, int]:
    """(characters of the session's request messages, of its provider.request rows' payloads)."""
    def read(conn):
        messages = conn.execute(text("SELECT coalesce(sum(length(text)), 0) FROM request_messages WHERE session_id = :s"),
                                {"s": session_id}).scalar_one()
        payloads = conn.execute(text("SELECT coalesce(sum(length(payload)), 0) FROM session_events "
                                     "WHERE session_id = :s AND event_type = 'provider.request'"), {"s": session_id}).scalar_one()
        return int(messages), int(payloads)
    return await db.read(read)


async def all_json(db: Store, session_id: str, limit: int = 1000) -> list[str]:
    return [view.json for _, view in await db.list_events(session_id, 0, limit)]


async def test_a_growing_history_stores_a_constant_amount_per_turn_and_reads_back_whole(store):  # noqa: F811 - the fixture
    sid = await new_session(store)
    history: list[str] = []
    appended: list[str] = []
    growth = []
    for turn in range(60):
        history.append(message("user", f"question {turn:03d} é"))
        before = await stored_sizes(store, sid)
        views = await store.append_events(sid, [("key_a", "client.message.send", {"n": turn}),
                                                (None, "provider.request", as_sent(list(history)))])
        after = await stored_sizes(store, sid)
        growth.append(sum(after) - sum(before))
        history.append(message("assistant", f"answer {turn:03d}"))
        appended += [view.json for view in views]
    # Every turn adds its new messages and a fixed-size row, whatever the history's length.
    assert max(growth[1:]) - min(growth[1:]) <= 4
    assert await all_json(store, sid) == appended
    # Pages cut anywhere read the same (a page's requests share their messages' reads).
    seqs = [seq for seq, _ in await store.list_events(sid, 0, 1000)]
    for start in range(0, len(seqs), 7):
        page = await store.list_events(sid, seqs[start - 1] if start else 0, 7)
        assert [view.json for _, view in page] == appended[start: start + 7]


async def test_requests_the_runner_normalized_and_odd_payloads_read_back_as_appended(store):  # noqa: F811 - the fixture
    sid = await new_session(store)
    nested = {"role": "user", "content": [{"type": "tool_result", "content": '{"messages":[1]}',
                                           "input": {"messages": [{"role": "user"}]}}]}
    normalized = HEAD + ',"normalized":{"prepended_user":false,"merged":[[0,1]]},"messages":' + dump([nested]) + "}"
    odd = [
        RawJson(normalized),
        RawJson(normalized.replace(',"messages":', ', "messages": ')),  # not as this server writes JSON: kept whole
        RawJson('{"messages":[]}'),
        RawJson('{"messages":"not a list"}'),
        RawJson('{"n":1}'),
        RawJson("[1,2]"),
        {"messages": [{"role": "user", "content": "a dict payload"}], "z": 1},
        as_sent([]),
    ]
    views = await store.append_events(sid, [(None, "provider.request", payload) for payload in odd])
    assert await all_json(store, sid) == [view.json for view in views]
    whole = await store.read(lambda conn: conn.execute(text(
        "SELECT count(*) FROM session_events WHERE session_id = :s AND messages_runs IS NULL"), {"s": sid}).scalar_one())
    assert whole == 4  # the spaced one, the string, no messages, an array


async def test_a_compaction_and_another_writer_and_a_rollback_still_read_back_whole(store_url):  # noqa: F811
    """Two stores on one database (two replicas in turn), a rewritten history, and a transaction that
    rolls back after storing: each request's references stay those of the texts it sent."""
    first, second = await Store.open(store_url), await Store.open(store_url)
    try:
        sid = await new_session(first)
        history = [message("user", "one"), message("assistant", "two")]
        appended = []
        for writer in (first, second, first):
            history.append(message("user", f"by {id(writer)} {len(history)}"))
            appended += [v.json for v in await writer.append_events(sid, [(None, "provider.request", as_sent(history))])]

        def append_then_fail(conn):
            from bae.services.session.store import events
            events.append(conn, sid, [(None, "provider.request", as_sent([*history, message("user", "lost")]))],
                          previous=first._previous_requests)
            raise RuntimeError("the transaction rolls back")
        with pytest.raises(RuntimeError):
            await first.write(append_then_fail)
        history = [message("user", "summary"), *history[-2:]]  # compacted: a new start
        for writer in (first, second):
            history.append(message("user", f"after {len(history)}"))
            appended += [v.json for v in await writer.append_events(sid, [(None, "provider.request", as_sent(history))])]
        assert await all_json(first, sid) == appended
        assert await all_json(second, sid) == appended
    finally:
        await first.close()
        await second.close()
