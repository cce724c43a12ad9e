"""The store, against a real SQLite file and a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlalchemy import create_engine, event, insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.util import await_only

from bae.common.errors import Unavailable
from bae.common.jsontext import RawJson, dump
from bae.services.gateway.proto_to_json import to_json
from bae.services.session.api.event_messages import event_of_row, event_of_view
from bae.services.session.store import Store, access, events, keys, profiles, sessions
from bae.services.session.store.schema import session_events
from bae.services.session.store.schema import sessions as sessions_table
from testkit import REVISIONS
from testkit.postgres_support import STORES, store_url  # noqa: F401 - the fixture

# Each test on a SQLite file (unit) and on PostgreSQL (postgres).
pytestmark = pytest.mark.parametrize("store_url", STORES, indirect=True)

HEAD = REVISIONS[-1]


@pytest.fixture
async def store(store_url):  # noqa: F811 - the fixture
    store = await Store.open(store_url)
    yield store
    await store.close()


async def new_session(store: Store) -> str:
    return await store.write(
        lambda conn: sessions.create(
            conn, client_key_id="key_a", profile_id="pro_a", state="open", client_version=None,
            client_tools=[], sandbox_tools=[], subagent_tools=[], compaction={"mode": "client", "prompt": None},
        )
    )


async def test_append_list_and_state(store):
    sid = await new_session(store)
    views = await store.append_events(sid, [("key_a", "client.message.send", {"role": "user", "content": "é"}),
                                            (None, "provider.request", RawJson('{"n":1.5}'))])
    assert [v["event_type"] for v in views] == ["client.message.send", "provider.request"]
    assert json.loads(views[1].json)["payload"] == {"n": 1.5}  # raw payload text spliced in as is
    listed = await store.list_events(sid, 0, 10)
    assert [view.json for _, view in listed] == [view.json for view in views]
    assert json.loads(views[0].json) == {**views[0], "payload": {"role": "user", "content": "é"}}
    first_seq = listed[0][0]
    assert await store.event_seq(sid, views[1]["id"]) == listed[1][0] > first_seq
    assert await store.event_seq("ses_other", views[1]["id"]) is None
    assert [v["id"] for v in await store.message_events(sid)] == [views[0]["id"]]
    await store.append_events(sid, [(None, "session.error", {"reason": "x"})], new_state="error")
    # Only an open session changes state; the events are still written.
    await store.append_events(sid, [("key_a", "session.close", {})], new_state="closed")
    session = await store.get_session(sid)
    assert session.state == "error" and session.closed_at is not None
    assert len(await store.list_events(sid, 0, 10)) == 4
    assert await store.list_open_session_ids() == []


async def test_client_tools_replace_only_the_caller(store):
    sid = await new_session(store)
    await store.set_client_tools(sid, "key_b", [{"name": "t", "description": None, "input_schema": {}}])
    await store.set_client_tools(sid, "key_a", [])
    session = await store.get_session(sid)
    assert session.client_tools == {"key_a": [], "key_b": [{"name": "t", "description": None, "input_schema": {}}]}
    assert session.compaction == {"mode": "client", "prompt": None}


async def test_event_json_equals_serialized_view(store):
    sid = await new_session(store)
    await store.append_events(sid, [("key_a", "x", {"a": [1, {"b": "ü\n"}], "c": None})])
    [row] = await store.write(events.page, sid, 0, 10)
    assert events.event_json(row) == dump(events.event_view(row))
    # As every API writes it: from the row, and from the view of the same event.
    assert to_json(event_of_row(row)) == to_json(event_of_view(events.event_view(row))) == events.event_json(row)


async def test_migrations_are_idempotent_and_data_survives(store_url):  # noqa: F811 - the fixture
    store = await Store.open(store_url)
    assert store.migrations_applied == REVISIONS
    sid = await new_session(store)
    await store.close()
    store = await Store.open(store_url)
    try:
        assert store.migrations_applied == [] and await store.revision() == HEAD
        assert (await store.get_session(sid)).id == sid
        if store.dialect == "sqlite":
            mode = await store.write(lambda conn: conn.exec_driver_sql("PRAGMA journal_mode").scalar())
            assert mode == "wal"
    finally:
        await store.close()


async def test_each_session_numbers_its_events(store):
    first, second = await new_session(store), await new_session(store)
    for sid in (first, second, first):
        await store.append_events(sid, [(None, "a", {}), (None, "b", {})])
    numbers = await store.read(lambda conn: [tuple(row) for row in conn.execute(
        session_events.select().with_only_columns(session_events.c.session_id, session_events.c.session_seq)
        .order_by(session_events.c.seq))])
    assert numbers == [(first, 1), (first, 2), (second, 1), (second, 2), (first, 3), (first, 4)]


async def test_appends_to_one_session_from_one_process_never_conflict(store):
    """On PostgreSQL the pool runs these on several connections at once; the session lock orders them."""
    sid = await new_session(store)
    await asyncio.gather(*(store.append_events(sid, [(None, f"e{n}", {}), (None, f"f{n}", {})]) for n in range(20)))
    listed = await store.list_events(sid, 0, 100)
    assert len(listed) == 40
    numbers = await store.read(lambda conn: list(conn.execute(
        session_events.select().with_only_columns(session_events.c.session_seq)
        .where(session_events.c.session_id == sid).order_by(session_events.c.seq)).scalars()))
    assert numbers == list(range(1, 41))


async def test_a_stale_append_of_a_taken_number_fails(store_url):  # noqa: F811 - the fixture
    """Two writers (two stores, as two processes would be): the second one's stale number is refused."""
    writer, other = await Store.open(store_url), await Store.open(store_url)
    try:
        sid = await new_session(writer)
        await writer.append_events(sid, [(None, "a", {})])
        stale = await other.read(lambda conn: conn.execute(events._NEWEST_EVENT, {"session_id": sid}).first().session_seq)
        await writer.append_events(sid, [(None, "b", {})])  # takes number 2 meanwhile
        row = {"id": "evt_stale", "session_id": sid, "session_seq": stale + 1, "client_key_id": None,
               "event_type": "c", "payload": "{}", "created_at": "2026-01-01T00:00:00.000Z"}
        with pytest.raises(IntegrityError):
            await other.write(lambda conn: conn.execute(insert(session_events), row))
        assert [view["event_type"] for _, view in await writer.list_events(sid, 0, 10)] == ["a", "b"]
    finally:
        await writer.close()
        await other.close()


async def test_a_concurrent_append_from_another_writer_raises(store_url):  # noqa: F811 - the fixture
    """Another writer appends between our read of the next number and our insert: ours fails, not interleaves."""
    writer, other = await Store.open(store_url), await Store.open(store_url)
    try:
        sid = await new_session(writer)
        await writer.append_events(sid, [(None, "a", {})])

        theirs = {"id": "evt_theirs", "session_id": sid, "session_seq": 2, "client_key_id": None,
                  "event_type": "theirs", "payload": "{}", "created_at": "2026-01-01T00:00:00.000Z"}

        def commit_theirs() -> None:
            if writer.dialect == "postgresql":  # this runs inside the loop's greenlet bridge
                await_only(other.write(lambda conn: conn.execute(insert(session_events), theirs)))
            else:  # this runs on the writer thread: the other writer is a connection of its own
                engine = create_engine(store_url)
                with engine.begin() as conn:
                    conn.execute(insert(session_events), theirs)
                engine.dispose()

        def append_racing(conn) -> None:
            def before_insert(_conn, _cursor, statement, *_args) -> None:
                if statement.startswith("INSERT INTO session_events"):
                    commit_theirs()  # after our read of the next number, before our insert

            event.listen(conn, "before_cursor_execute", before_insert)
            try:
                events.append(conn, sid, [(None, "ours", {})])
            finally:
                event.remove(conn, "before_cursor_execute", before_insert)

        with pytest.raises(Unavailable) as caught:  # OrderConflict, or on SQLite a stale snapshot: both a 503
            await writer.write(append_racing)
        assert caught.value.retry_after == 1
        assert [view["event_type"] for _, view in await other.list_events(sid, 0, 10)] == ["a", "theirs"]
    finally:
        await writer.close()
        await other.close()


async def test_key_lookup_by_digest_and_revocation(store):
    client = await store.write(lambda c: keys.insert_key(c, name="k", key_hash="a" * 64, prefix="bae_aaaa",
                                                        role="client", profile_id="pro_a"))
    await store.write(lambda c: keys.insert_key(c, name="ses_1", key_hash="b" * 64, prefix="bae_ses_",
                                               role="session", profile_id="pro_a", client_id=client.id))
    assert (await store.write(keys.by_digest, "a" * 64)).id == client.id
    assert await store.write(keys.revoke_client, client.id) == ["ses_1"]
    assert await store.write(keys.revoke_client, client.id) is None
    assert (await store.write(keys.by_digest, "b" * 64)).deleted_at is not None
    assert await store.write(keys.sessions_with_active_keys, ["ses_1"]) == set()


async def test_a_session_key_and_its_records_are_read_as_the_separate_reads_give_them(store):
    """The one joined read every JSON-RPC call starts with agrees with the three reads it replaces,
    and refuses what they refuse: another session's key, a client key, a revoked key."""
    profile = await store.write(profiles.create, {
        "name": "p", "primary_provider": "claude", **{name: [] for name in profiles.LIST_FIELDS}})
    sid = await store.write(lambda conn: sessions.create(
        conn, client_key_id="key_a", profile_id=profile.id, state="open", client_version="1.2",
        client_tools=[{"name": "t"}], sandbox_tools=[], subagent_tools=[], compaction={"mode": "client", "prompt": None},
    ))
    client = await store.write(lambda c: keys.insert_key(c, name="k", key_hash="a" * 64, prefix="bae_aaaa",
                                                        role="client", profile_id=profile.id))
    session_key = await store.write(lambda c: keys.insert_key(c, name=sid, key_hash="b" * 64, prefix="bae_ses_",
                                                             role="session", profile_id=profile.id, client_id=client.id))

    principal, session, live_profile = await store.read(access.session_key_and_records, "b" * 64, sid)
    assert principal == await store.read(keys.session_principal, "b" * 64, sid)
    assert principal.key_id == session_key.id and principal.client_key_id == client.id
    assert (session, live_profile) == await store.session_and_profile(sid)
    assert session.compaction == {"mode": "client", "prompt": None} and live_profile.id == profile.id  # JSON read back

    await store.write(profiles.soft_delete, profile.id)
    assert await store.read(access.session_key_and_records, "b" * 64, sid) == (principal, session, None)
    for digest, session_id in (("b" * 64, "ses_other"), ("a" * 64, sid), ("c" * 64, sid)):
        assert await store.read(access.session_key_and_records, digest, session_id) == (None, None, None)
    await store.write(keys.revoke_client, client.id)
    assert await store.read(access.session_key_and_records, "b" * 64, sid) == (None, None, None)


async def test_the_session_list_filters_combine_and_page(store):
    """Each filter of the admin's list, together (AND), and across pages: a cursor continues the
    filtered list. Times compare inclusive after, exclusive before; an id prefix matches exactly."""
    rows = [  # id, profile, key, state, created_at
        ("ses_a1", "pro_1", "key_1", "open", "2026-01-01T00:00:00.000Z"),
        ("ses_a2", "pro_2", "key_1", "closed", "2026-01-02T00:00:00.000Z"),
        ("sesXa3", "pro_1", "key_2", "open", "2026-01-03T00:00:00.000Z"),
        ("ses_b4", "pro_1", "key_1", "error", "2026-01-04T00:00:00.000Z"),
        ("SES_a5", "pro_1", "key_1", "open", "2026-01-05T00:00:00.000Z"),
        ("ses_a6", "pro_1", "key_1", "open", "2026-01-06T00:00:00.000Z"),
    ]
    await store.write(lambda conn: conn.execute(insert(sessions_table), [
        {"id": sid, "profile_id": profile, "client_key_id": key, "state": state, "created_at": created,
         "closed_at": None if state == "open" else created, "client_tools": {}, "sandbox_tools": {},
         "subagent_tools": {}} for sid, profile, key, state, created in rows]))

    async def listed(kept: sessions.SessionFilter, after_seq: int = 0, limit: int = 50) -> list[str]:
        return [row.id for row in await store.read(sessions.page, kept, after_seq, limit)]

    assert await listed(sessions.SessionFilter()) == [row[0] for row in rows]
    assert await listed(sessions.SessionFilter(profile_id="pro_2")) == ["ses_a2"]
    assert await listed(sessions.SessionFilter(client_key_id="key_2")) == ["sesXa3"]
    assert await listed(sessions.SessionFilter(profile_id="pro_9")) == []
    assert await listed(sessions.SessionFilter(created_after="2026-01-05T00:00:00.000Z")) == ["SES_a5", "ses_a6"]
    assert await listed(sessions.SessionFilter(created_before="2026-01-02T00:00:00.000Z")) == ["ses_a1"]
    # `_` is no wildcard and case counts (LIKE would match both on SQLite).
    assert await listed(sessions.SessionFilter(id_prefix="ses_a")) == ["ses_a1", "ses_a2", "ses_a6"]
    assert await listed(sessions.SessionFilter(id_prefix="SES_")) == ["SES_a5"]
    assert await listed(sessions.SessionFilter(id_prefix="ses_a1")) == ["ses_a1"]
    everything = sessions.SessionFilter(
        state="open", profile_id="pro_1", client_key_id="key_1", created_after="2026-01-01T00:00:00.000Z",
        created_before="2026-01-06T00:00:00.001Z", id_prefix="ses_",
    )
    assert await listed(everything) == ["ses_a1", "ses_a6"]

    # Pages of two through pro_1's key_1 sessions: each starts after the last row of the one before.
    kept = sessions.SessionFilter(profile_id="pro_1", client_key_id="key_1")
    first = await store.read(sessions.page, kept, 0, 2)
    assert [row.id for row in first] == ["ses_a1", "ses_b4"]
    assert await listed(kept, first[-1].seq, 2) == ["SES_a5", "ses_a6"]
    assert await listed(kept, (await store.read(sessions.page, kept, 0, 4))[-1].seq, 2) == []
    # The summary names the key that opened the session.
    assert sessions.summary_view(first[0])["client_key_id"] == "key_1"
