"""The client REST API (`/api/v1/sessions*`, SERVER-SPEC §5).

Each handler checks in the spec's order: credentials first, then the body,
then the state it needs. Work that must be atomic (the profile checks and the
session insert, O-19) runs as one store call; events are published to the
live feed only after their transaction committed.
"""

from __future__ import annotations

import logging

from bae.common.config import Config
from bae.common.errors import Problem, not_found
from services.session.api import bodies
from services.session.api.auth import Authenticator
from services.session.api.calls import RestCall
from services.session.api.bodies import RESERVED_TOOL
from services.session.engine.spans import SessionSpans
from services.session.api.pagination import page_json, page_request
from services.session.store import events, opening, sessions
from bae.common.jsontext import dump
from services.session.engine.closing import SessionCloser
from services.session.engine.mcp_sessions import SessionMcp
from services.session.engine.registry import SessionRegistry
from services.session.store.opening import Declarations, Opened, Refusal, Refused
from services.session.store.records import KeyRecord, ProfileRecord, SessionRecord
from services.session.store.store import Store

log = logging.getLogger("bae.session.rest")


def session_closed(state: str) -> Problem:
    return Problem(409, "session_closed", f"session is already {state}")


class ClientRestApi:
    def __init__(
        self,
        *,
        store: Store,
        auth: Authenticator,
        sessions: SessionRegistry,
        mcp: SessionMcp,
        closer: SessionCloser,
        spans: SessionSpans,
        config: Config,
    ) -> None:
        self.store = store
        self.auth = auth
        self.sessions = sessions
        self.mcp = mcp
        self.closer = closer
        self.spans = spans
        self.config = config

    # POST /api/v1/sessions (§5.1)

    async def open_session(self, call: RestCall) -> str:
        key = await self.auth.client_key(call.credential)
        body = bodies.parse_session_body(call.body, call.content_type, joining=False)
        outcome = await self.store.write(opening.open_session, key, body, self)
        if isinstance(outcome, Refused):
            raise outcome.error
        self.sessions.publish(outcome.session_id, outcome.views)
        self.spans.open(outcome.session_id, outcome.profile.id, key.id)
        await self.mcp.opened(outcome.session_id, outcome.profile)
        return self._created(outcome)

    # POST /api/v1/sessions/{id}/join (§5.2)

    async def join_session(self, call: RestCall) -> str:
        key = await self.auth.client_key(call.credential)
        body = bodies.parse_session_body(call.body, call.content_type, joining=True)
        outcome = await self.store.write(opening.join_session, key, call.path_id, body, self)
        if isinstance(outcome, Refused):
            raise outcome.error
        self.sessions.publish(outcome.session_id, outcome.views)
        return self._created(outcome)

    # opening.Vetting: the decisions of open and join, made inside their transactions.

    def vet_join(self, key: KeyRecord, session_id: str, session: SessionRecord | None) -> None:
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

    # Shared by open and join: checks 4-8 of §5.1 (5-8 of §5.2). A join has
    # already checked that the key's profile is the session's.

    def vet_profile(self, key: KeyRecord, profile: ProfileRecord | None, body: Declarations) -> Refusal | None:
        if profile is None:
            profile_id = key.profile_id or ""
            log.error("client key %s: profile %s is no longer available", key.id, profile_id)
            return Refusal(
                Problem(
                    422,
                    "profile_unavailable",
                    "the profile bound to this client key is no longer available",
                ),
                profile_id,
                {"reason": "profile_unavailable", "profile_id": profile_id},
            )
        if self.config.provider(profile.primary_provider) is None:
            # Logged on every attempt, never deduplicated (§5.1 step 5).
            log.error(
                'profile %s: primary provider "%s" is not configured in bae-config.toml',
                profile.id,
                profile.primary_provider,
            )
            return Refusal(
                Problem(
                    422,
                    "primary_provider_unavailable",
                    f'the profile\'s primary provider "{profile.primary_provider}" '
                    "is not configured in bae-config.toml",
                ),
                profile.id,
                {
                    "reason": "primary_provider_unavailable",
                    "profile_id": profile.id,
                    "primary_provider": profile.primary_provider,
                },
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
        return None

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
        session = await self.auth.with_session_key(call.credential, session_id, sessions.get, session_id, writes=False)
        if session is None:
            raise not_found(f"no session {session_id}")
        return dump({"drivers": self.sessions.drivers(session_id)})

    # GET /api/v1/sessions/{id}/events (§5.4)

    async def events(self, call: RestCall) -> str:
        session_id = call.path_id
        try:
            page = page_request(call.query)
        except Problem:
            # Credentials are checked before the query: a bad key beats a bad cursor.
            await self.auth.session_principal(call.credential, session_id)
            raise
        items = await self.auth.with_session_key(
            call.credential, session_id, events.page_items, session_id, page.after_seq, page.fetch, writes=False
        )
        return page_json(items, page)

    # DELETE /api/v1/sessions/{id} (§5.5)

    async def close_session(self, call: RestCall) -> str:
        session_id = call.path_id

        session, views = await self.auth.with_session_key(
            call.credential, session_id, opening.close_by_client, session_id
        )
        if session is None:
            raise not_found(f"no session {session_id}")
        if views:
            self.sessions.publish(session_id, views)
        # Teardown runs whatever the previous state was (idempotent).
        await self.closer.close(session_id, attribute_to=session.client_key_id)
        self.spans.end(session_id)
        if session.state != "open":
            raise session_closed(session.state)
        return dump({"session_id": session_id, "state": "closed"})
