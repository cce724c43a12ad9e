"""A PostgreSQL server stopped under an open store: calls are 503s, and the password is never logged."""

from __future__ import annotations

import pytest

from bae.services.session.store import Store, sessions
from bae.services.session.store.sqlite import StoreUnavailable
from testkit import postgres_support

pytestmark = pytest.mark.postgres


async def new_session(store: Store) -> str:
    return await store.write(
        lambda conn: sessions.create(
            conn, client_key_id="key_a", profile_id="pro_a", state="open", client_version=None,
            client_tools=[], sandbox_tools=[], subagent_tools=[], compaction={"mode": "client", "prompt": None},
        )
    )


async def test_a_postgresql_outage_is_a_503_and_the_password_never_logged(caplog):
    """A server of its own, stopped under an open store: calls are 503s, then work again once it is back."""
    server = postgres_support.PostgresServer(postgres_support.bin_dir_or_skip())
    try:
        server.start()
        url = server.database_url("outage").replace("postgres@", "postgres:s3cret-pw@")
        caplog.set_level("DEBUG")
        store = await Store.open(url)
        try:
            sid = await new_session(store)
            server.halt()
            for call in (lambda: store.append_events(sid, [(None, "x", {})]), lambda: store.get_session(sid)):
                with pytest.raises(StoreUnavailable) as caught:
                    await call()
                problem = caught.value
                assert (problem.reason, problem.retry_after, problem.busy) == ("service_unavailable", 5, False)
                assert problem.detail == "the database is unavailable; retry later"
            server.start()
            await store.append_events(sid, [(None, "y", {})])
            assert [view["event_type"] for _, view in await store.list_events(sid, 0, 10)] == ["y"]
        finally:
            await store.close()
    finally:
        server.stop()
    assert "s3cret-pw" not in caplog.text


@pytest.mark.unit
def test_a_failure_that_invalidates_the_connection_is_raised_as_it_is() -> None:
    """After a failure that invalidated the connection, SQLAlchemy refuses `conn.info`
    (PendingRollbackError): releasing the transaction's record of its locks must not raise that
    instead of the failure, which unavailable() turns into a 503."""
    from sqlalchemy.exc import OperationalError, PendingRollbackError

    from bae.services.session.store.postgres import INFO_KEY, _holding

    class InvalidatedOnFailure:
        def __init__(self) -> None:
            self._info: dict = {}
            self.invalidated = False

        @property
        def info(self) -> dict:
            if self.invalidated:
                raise PendingRollbackError("Can't reconnect until invalid transaction is rolled back")
            return self._info

    def fails(conn: InvalidatedOnFailure) -> None:
        assert INFO_KEY in conn.info
        conn.invalidated = True
        raise OperationalError("SELECT 1", {}, Exception("connection lost"))

    conn = InvalidatedOnFailure()
    with pytest.raises(OperationalError):
        _holding(conn, object(), fails, ())  # type: ignore[arg-type]
    assert conn._info == {}
