"""The web console's sessions and sign-in links in the store (store/console.py), with a fixed clock, on a
SQLite file and on PostgreSQL: the 12-hour life, links that work once within 60 s, the admin key's rotation
ending both, and expired rows deleted."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from bae.common.console import LINK_SECONDS, SESSION_SECONDS
from bae.services.session.store import Store, console, keys
from bae.services.session.store.schema import console_links, console_sessions
from testkit.postgres_support import STORES, store_url  # noqa: F401 - the fixture

pytestmark = pytest.mark.parametrize("store_url", STORES, indirect=True)

T0 = datetime(2026, 7, 7, 12, 0, 0, tzinfo=timezone.utc)
SECOND = timedelta(seconds=1)


@pytest.fixture
async def store(store_url):  # noqa: F811 - the fixture
    store = await Store.open(store_url)
    yield store
    await store.close()


async def admin_key_id(store: Store) -> str:
    _, row = await store.write(lambda conn: keys.mint(conn, role="admin", name="bootstrap-admin"))
    return row.id


async def rows(store: Store, table) -> int:
    return await store.read(lambda conn: conn.execute(select(func.count()).select_from(table)).scalar_one())


async def test_a_session_lasts_twelve_hours(store):
    key_id = await admin_key_id(store)
    expires_at = await store.write(console.start_session, "digest-a", key_id, T0)
    assert expires_at == "2026-07-08T00:00:00.000Z" and SESSION_SECONDS == 12 * 3600
    end = T0 + timedelta(seconds=SESSION_SECONDS)
    found = await store.read(console.active_session, "digest-a", end - SECOND)
    assert found == console.ConsoleSessionRecord(admin_key_id=key_id, expires_at=expires_at)
    assert await store.read(console.active_session, "digest-a", end) is None
    assert await store.read(console.active_session, "digest-other", T0) is None


async def test_sign_out_and_rotation_end_sessions(store):
    key_id = await admin_key_id(store)
    await store.write(console.start_session, "digest-a", key_id, T0)
    await store.write(console.start_session, "digest-b", key_id, T0)
    await store.write(console.end_session, "digest-a")
    assert await store.read(console.active_session, "digest-a", T0) is None
    assert await store.read(console.active_session, "digest-b", T0) is not None
    await store.write(keys.soft_delete_admins)
    assert await store.read(console.active_session, "digest-b", T0) is None
    # A session signed in while admin auth was disabled names no key: the caller decides (auth.py).
    await store.write(console.start_session, "digest-c", None, T0)
    assert await store.read(console.active_session, "digest-c", T0) == console.ConsoleSessionRecord(
        admin_key_id=None, expires_at="2026-07-08T00:00:00.000Z")


async def test_a_link_works_once_within_sixty_seconds(store):
    key_id = await admin_key_id(store)
    expires_at = await store.write(console.create_link, "link-a", key_id, T0)
    assert expires_at == "2026-07-07T12:01:00.000Z" and LINK_SECONDS == 60
    at = T0 + timedelta(seconds=LINK_SECONDS) - SECOND
    record = await store.write(console.exchange_link, "link-a", "session-a", at)
    assert record is not None and record.admin_key_id == key_id
    assert record.expires_at == "2026-07-08T00:00:59.000Z"  # 12 h from the exchange
    assert await store.read(console.active_session, "session-a", at) is not None
    assert await store.write(console.exchange_link, "link-a", "session-b", at) is None  # used
    assert await store.read(console.active_session, "session-b", at) is None

    await store.write(console.create_link, "link-b", key_id, T0)
    assert await store.write(console.exchange_link, "link-b", "session-c", T0 + timedelta(seconds=LINK_SECONDS)) is None
    assert await store.write(console.exchange_link, "link-unknown", "session-d", T0) is None


async def test_a_link_of_a_rotated_key_signs_nobody_in(store):
    key_id = await admin_key_id(store)
    await store.write(console.create_link, "link-a", key_id, T0)
    await store.write(keys.soft_delete_admins)
    assert await store.write(console.exchange_link, "link-a", "session-a", T0) is None
    assert await store.read(console.active_session, "session-a", T0) is None


async def test_expired_rows_are_deleted_when_a_session_or_link_is_made(store):
    key_id = await admin_key_id(store)
    await store.write(console.start_session, "old-session", key_id, T0)
    await store.write(console.create_link, "old-link", key_id, T0)
    await store.write(console.start_session, "live-session", key_id, T0 + timedelta(hours=1))
    assert (await rows(store, console_sessions), await rows(store, console_links)) == (2, 0)  # the link ran out
    await store.write(console.create_link, "new-link", key_id, T0 + timedelta(seconds=SESSION_SECONDS))
    assert (await rows(store, console_sessions), await rows(store, console_links)) == (1, 1)
    assert await store.read(console.active_session, "live-session", T0 + timedelta(seconds=SESSION_SECONDS)) is not None
