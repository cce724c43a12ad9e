"""The client REST API (`/api/v1/sessions*`, SERVER-SPEC §5).

Each handler checks in the spec's order: credentials first, then the body,
then the state it needs. Work that must be atomic (the profile checks and the
session insert, O-19) runs as one store call; events are published to the
live feed only after their transaction committed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import Connection

from bae.config import Config
from bae.errors import Problem, not_found
from services.session.api import bodies
from services.session.api.auth import Authenticator
from services.session.api.calls import RestCall
from services.session.api.bodies import RESERVED_TOOL, SessionBody
from services.session.engine.spans import session_spans
from services.session.api.pagination import events_page, page_request
from services.session.store import events, keys, profiles, sessions
from bae.jsontext import dump
from services.session.engine.runtime import SessionRuntime
from services.session.store.events import EventView
from services.session.store.records import KeyRecord, Principal, ProfileRecord, SessionRecord
from services.session.store.store import Store

log = logging.getLogger("bae.session.rest")


@dataclass(frozen=True)
class Opened:
    session_id: str
    token: str
    profile: ProfileRecord
    views: list[EventView]


@dataclass(frozen=True)
class Refused:
    """A refusal whose audit row was committed; raised after the transaction."""

    problem: Problem


def session_closed(state: str) -> Problem:
    return Problem(409, "session_closed", f"session is already {state}")


class ClientRestApi:
    def __init__(self, *, store: Store, auth: Authenticator, runtime: SessionRuntime, config: Config) -> None:
        self.store = store
        self.auth = auth
        self.runtime = runtime
        self.config = config

    # POST /api/v1/sessions (§5.1)

    async def open_session(self, call: RestCall) -> str:
        key = await self.auth.client_key(call.credential)
        body = bodies.parse_session_body(call.body, call.content_type, joining=False)
        outcome = await self.store.call(self._open, key, body)
        if isinstance(outcome, Refused):
            raise outcome.problem
        await self.runtime.publish(outcome.session_id, outcome.views)
        session_spans.open(outcome.session_id, outcome.profile.id, key.id)
        await self.runtime.on_open(outcome.session_id, outcome.profile)
        return self._created(outcome)

    def _open(self, conn: Connection, key: KeyRecord, body: SessionBody) -> Opened | Refused:
        profile = self._usable_profile(conn, key, body)
        if isinstance(profile, Refused):
            return profile
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
        token = self._mint_session_key(conn, session_id, key)
        views = events.append(conn, session_id, [(key.id, "session.open", body.names())])
        return Opened(session_id, token, profile, views)

    # POST /api/v1/sessions/{id}/join (§5.2)

    async def join_session(self, call: RestCall) -> str:
        key = await self.auth.client_key(call.credential)
        body = bodies.parse_session_body(call.body, call.content_type, joining=True)
        outcome = await self.store.call(self._join, key, call.path_id, body)
        if isinstance(outcome, Refused):
            raise outcome.problem
        await self.runtime.publish(outcome.session_id, outcome.views)
        return self._created(outcome)

    def _join(self, conn: Connection, key: KeyRecord, session_id: str, body: SessionBody) -> Opened | Refused:
        session = sessions.get(conn, session_id)
        if session is None:
            raise not_found(f"no session {session_id}")
        if session.state != "open":
            raise session_closed(session.state)
        if key.profile_id != session.profile_id:
            raise Problem(
                403,
                "profile_mismatch",
                "the client key's profile does not match this session's profile",
            )
        profile = self._usable_profile(conn, key, body)
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
        token = self._mint_session_key(conn, session_id, key)
        views = events.append(conn, session_id, [(key.id, "session.join", body.names())])
        return Opened(session_id, token, profile, views)

    # Shared by open and join: checks 4-8 of §5.1 (5-8 of §5.2). A join has
    # already checked that the key's profile is the session's.

    def _usable_profile(self, conn: Connection, key: KeyRecord, body: SessionBody) -> ProfileRecord | Refused:
        profile_id = key.profile_id or ""
        profile = profiles.active(conn, profile_id)
        if profile is None:
            log.error("client key %s: profile %s is no longer available", key.id, profile_id)
            self._audit(conn, key, profile_id, body, {"reason": "profile_unavailable", "profile_id": profile_id})
            return Refused(
                Problem(
                    422,
                    "profile_unavailable",
                    "the profile bound to this client key is no longer available",
                )
            )
        if self.config.provider(profile.primary_provider) is None:
            # Logged on every attempt, never deduplicated (§5.1 step 5).
            log.error(
                'profile %s: primary provider "%s" is not configured in bae-config.toml',
                profile.id,
                profile.primary_provider,
            )
            self._audit(
                conn,
                key,
                profile.id,
                body,
                {
                    "reason": "primary_provider_unavailable",
                    "profile_id": profile.id,
                    "primary_provider": profile.primary_provider,
                },
            )
            return Refused(
                Problem(
                    422,
                    "primary_provider_unavailable",
                    f'the profile\'s primary provider "{profile.primary_provider}" '
                    "is not configured in bae-config.toml",
                )
            )
        for tool in (*body.tools, *body.sandbox_tools):
            if tool["name"] == RESERVED_TOOL:
                raise bodies.reserved_tool_name()
        allowed = set(profile.allowed_tools)
        for tool in body.tools:
            if tool["name"] not in allowed:
                raise Problem(
                    403,
                    "tool_not_allowed",
                    f'tool "{tool["name"]}" is not in the profile\'s allowlist',
                )
        bodies.validate_subagent_tools(body.subagent_tools)
        return profile

    def _audit(self, conn: Connection, key: KeyRecord, profile_id: str, body: SessionBody, payload: dict) -> None:
        """A separate `error` session recording a refused open/join (tool names only)."""

        def names(tools: list[dict]) -> list[dict]:
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

    def _mint_session_key(self, conn: Connection, session_id: str, key: KeyRecord) -> str:
        """A session key bound to `session_id` (its row name) for the acting client key."""
        token, _ = keys.mint(conn, role="session", name=session_id, profile_id=key.profile_id, client_id=key.id)
        return token

    def _created(self, opened: Opened) -> str:
        profile = opened.profile
        entry = self.config.provider(profile.primary_provider)
        assert entry is not None  # _usable_profile refuses a profile whose primary is not configured
        return dump(
            {
                "session_id": opened.session_id,
                "session_key": opened.token,
                "profile": {
                    "id": profile.id,
                    "name": profile.name,
                    "allowed_tools": profile.allowed_tools,
                    "mcp_servers": profile.mcp_servers,
                    "provider": {"provider": entry.provider, "model": entry.model},
                },
            }
        )

    # GET /api/v1/sessions/{id}/participants (§5.3)

    # Each handler below authenticates and reads in one store call.

    async def participants(self, call: RestCall) -> str:
        session_id = call.path_id
        session = await self.auth.with_session_key(
            call.credential,
            session_id,
            lambda conn, _principal: sessions.get(conn, session_id),
            writes=False,
        )
        if session is None:
            raise not_found(f"no session {session_id}")
        return dump({"drivers": self.runtime.drivers(session_id)})

    # GET /api/v1/sessions/{id}/events (§5.4)

    async def events(self, call: RestCall) -> str:
        session_id = call.path_id
        try:
            page = page_request(call.query)
        except Problem:
            # Credentials are checked before the query: a bad key beats a bad cursor.
            await self.auth.session_principal(call.credential, session_id)
            raise
        return await self.auth.with_session_key(
            call.credential,
            session_id,
            lambda conn, _principal: events_page(conn, session_id, page),
            writes=False,
        )

    # DELETE /api/v1/sessions/{id} (§5.5)

    async def close_session(self, call: RestCall) -> str:
        session_id = call.path_id

        def _close(conn: Connection, _principal: Principal) -> tuple[SessionRecord, list[EventView]]:
            session = sessions.get(conn, session_id)
            if session is None:
                raise not_found(f"no session {session_id}")
            if session.state != "open":
                return session, []
            views = events.append(
                conn,
                session_id,
                [(session.client_key_id, "session.close", {"reason": "client_close"})],
                new_state="closed",
            )
            return session, views

        session, views = await self.auth.with_session_key(
            call.credential, session_id, _close
        )
        if views:
            await self.runtime.publish(session_id, views)
        # Teardown runs whatever the previous state was (idempotent).
        await self.runtime.close(session_id, attribute_to=session.client_key_id)
        session_spans.end(session_id)
        if session.state != "open":
            raise session_closed(session.state)
        return dump({"session_id": session_id, "state": "closed"})
