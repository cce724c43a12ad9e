"""Opening, joining and closing a session by its clients (SERVER-SPEC §5.1, §5.2, §5.5), one transaction each.

The API decides what is allowed (a `Vetting`, which never touches the database);
these functions do the reads and writes around its decisions, atomically (O-19):
the profile checks and the session insert, or the audit row of a refusal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from sqlalchemy import Connection

from bae.common.errors import BaeError
from bae.common.limits import Limits
from bae.services.session.store import events, keys, profiles, quotas, sessions
from bae.services.session.store.events import EventView
from bae.services.session.store.records import KeyRecord, ProfileRecord, SessionRecord


class Declarations(Protocol):
    """What an open or join request declares (api.bodies.SessionBody)."""

    @property
    def client_version(self) -> str | None: ...
    @property
    def tools(self) -> list[dict[str, Any]]: ...
    @property
    def sandbox_tools(self) -> list[dict[str, Any]]: ...
    @property
    def subagent_tools(self) -> list[dict[str, Any]]: ...
    @property
    def compaction(self) -> dict[str, Any] | None: ...

    def names(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Refusal:
    """A refused open or join that leaves an audit row: an `error` session with a `session.error` event."""

    error: BaeError
    profile_id: str
    payload: dict[str, Any]


class Vetting(Protocol):
    def vet_join(self, key: KeyRecord, session_id: str, session: SessionRecord | None) -> None:
        """Raise the error that refuses this join before any profile check (nothing is written)."""

    def vet_profile(self, key: KeyRecord, profile: ProfileRecord | None, body: Declarations) -> Refusal | None:
        """A refusal to audit, or None; or raise the error that refuses it (nothing is written)."""

    def limits_of(self, profile: ProfileRecord) -> Limits:
        """The limits of the keys bound to `profile`."""


@dataclass(frozen=True)
class Opened:
    session_id: str
    token: str
    profile: ProfileRecord
    views: list[EventView]


@dataclass(frozen=True)
class Refused:
    """A refusal whose audit row was committed; raised after the transaction."""

    error: BaeError


def _vetted_profile(
    conn: Connection, key: KeyRecord, body: Declarations, vetting: Vetting
) -> ProfileRecord | Refused:
    profile = profiles.active(conn, key.profile_id or "")
    refusal = vetting.vet_profile(key, profile, body)
    if refusal is not None:
        _audit(conn, key, refusal.profile_id, body, refusal.payload)
        return Refused(refusal.error)
    assert profile is not None  # vet_profile refuses a missing profile
    return profile


def open_session(conn: Connection, key: KeyRecord, body: Declarations, vetting: Vetting) -> Opened | Refused:
    profile = _vetted_profile(conn, key, body, vetting)
    if isinstance(profile, Refused):
        return profile
    # Over the quota nothing is written: the refusal is the caller's to retry, not an audit row.
    quotas.check_open_sessions(conn, key.id, vetting.limits_of(profile).max_open_sessions_per_key)
    session_id = sessions.create(
        conn,
        client_key_id=key.id,
        profile_id=profile.id,
        state="open",
        client_version=body.client_version,
        client_tools=body.tools,
        sandbox_tools=body.sandbox_tools,
        subagent_tools=body.subagent_tools,
        compaction=body.compaction,
    )
    token = _mint_session_key(conn, session_id, key)
    views = events.append(conn, session_id, [(key.id, "session.open", body.names())])
    return Opened(session_id, token, profile, views)


def join_session(
    conn: Connection, key: KeyRecord, session_id: str, body: Declarations, vetting: Vetting
) -> Opened | Refused:
    session = sessions.get(conn, session_id)
    vetting.vet_join(key, session_id, session)
    assert session is not None  # vet_join refuses a missing session
    profile = _vetted_profile(conn, key, body, vetting)
    if isinstance(profile, Refused):
        return profile
    sessions.set_declarations(
        conn,
        session,
        key.id,
        client_tools=body.tools,
        sandbox_tools=body.sandbox_tools,
        subagent_tools=body.subagent_tools,
    )
    token = _mint_session_key(conn, session_id, key)
    views = events.append(conn, session_id, [(key.id, "session.join", body.names())])
    return Opened(session_id, token, profile, views)


def close_by_client(conn: Connection, session_id: str) -> tuple[SessionRecord | None, list[EventView]]:
    """Close an open session (its `session.close` event); the record as it was before, and the events."""
    session = sessions.get(conn, session_id)
    if session is None or session.state != "open":
        return session, []
    views = events.append(
        conn,
        session_id,
        [(session.client_key_id, "session.close", {"reason": "client_close"})],
        new_state="closed",
    )
    return session, views


def _audit(conn: Connection, key: KeyRecord, profile_id: str, body: Declarations, payload: dict[str, Any]) -> None:
    """A separate `error` session recording a refused open/join (tool names only)."""

    def names(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"name": tool["name"]} for tool in tools]

    session_id = sessions.create(
        conn,
        client_key_id=key.id,
        profile_id=profile_id,
        state="error",
        client_version=body.client_version,
        client_tools=names(body.tools),
        sandbox_tools=names(body.sandbox_tools),
        subagent_tools=names(body.subagent_tools),
        compaction=body.compaction,
    )
    events.append(conn, session_id, [(key.id, "session.error", payload)])


def _mint_session_key(conn: Connection, session_id: str, key: KeyRecord) -> str:
    """A session key bound to `session_id` (its row name) for the acting client key."""
    token, _ = keys.mint(conn, role="session", name=session_id, profile_id=key.profile_id, client_id=key.id)
    return token


# Run in an open's transaction with the new session's id (open_session_then).
Then = Callable[[Connection, str], None]


def open_session_then(conn: Connection, key: KeyRecord, body: Declarations, vetting: Vetting, then: Then) -> Opened | Refused:
    """`open_session`, and `then(conn, session_id)` in the same transaction: a server-side opener
    (a schedule's run) records which session it opened atomically with the session itself."""
    opened = open_session(conn, key, body, vetting)
    if isinstance(opened, Opened):
        then(conn, opened.session_id)
    return opened
