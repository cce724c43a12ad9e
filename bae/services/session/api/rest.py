"""The client REST API (`/api/v1/sessions*`, SERVER-SPEC §5).

Each handler checks in the spec's order: credentials first, then the state it needs (the gateway
read the body). Work that must be atomic (the profile checks and the session insert, O-19) runs
as one store call; events are published to the live feed only after their transaction committed.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from bae.common.config import Config
from bae.common.limits import Limits
from bae.common.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthenticated, Unprocessable, echo
from bae.common.ids import token_digest
from bae.common.protos import client_api_pb2, session_pb2
from bae.services.session.api import bodies
from bae.services.session.api.auth import Authenticator
from bae.services.session.api.bodies import RESERVED_TOOL
from bae.services.session.api.calls import Credential
from bae.services.session.api.event_messages import page_messages, payload_chars
from bae.services.session.api.pagination import PAGE_PAYLOAD_CHARS, page_request
from bae.services.session.api.usage import session_usage
from bae.services.session.engine.closing import SessionCloser
from bae.services.session.engine.domain import SessionState
from bae.services.session.engine.errors import SessionNotOpen
from bae.services.session.engine.mcp_sessions import SessionMcp
from bae.services.session.engine.registry import SessionRegistry
from bae.services.session.engine.spans import SessionSpans
from bae.services.session.store import events, opening, quotas, sessions, usage
from bae.services.session.store.opening import Declarations, Opened, Refusal, Refused
from bae.services.session.store.records import KeyRecord, ProfileRecord, SessionRecord
from bae.services.session.store.store import Store

log = logging.getLogger("bae.session.rest")


def session_closed(state: str) -> Conflict:
    return Conflict(f"session is already {state}", reason="session_closed")


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

    async def open_session(self, request: client_api_pb2.OpenSessionRequest) -> client_api_pb2.SessionCreated:
        key = await self.auth.client_key(Credential.of(request.credential))
        body = bodies.session_body(request.body)
        outcome = await self.store.write(opening.open_session, key, body, self)
        if isinstance(outcome, Refused):
            raise outcome.error
        self.sessions.publish(outcome.session_id, outcome.views)
        self.spans.open(outcome.session_id, outcome.profile.id, key.id)
        await self.mcp.opened(outcome.session_id, outcome.profile)
        return self._created(outcome)

    # POST /api/v1/sessions/{id}/join (§5.2)

    async def join_session(self, request: client_api_pb2.JoinSessionRequest) -> client_api_pb2.SessionCreated:
        key = await self.auth.client_key(Credential.of(request.credential))
        body = bodies.session_body(request.body)
        outcome = await self.store.write(opening.join_session, key, request.session_id, body, self)
        if isinstance(outcome, Refused):
            raise outcome.error
        self.sessions.publish(outcome.session_id, outcome.views)
        return self._created(outcome)

    # opening.Vetting: the decisions of open and join, made inside their transactions.

    def vet_join(self, key: KeyRecord, session_id: str, session: SessionRecord | None) -> None:
        if session is None:
            raise NotFound(f"no session {echo(session_id)}")
        if session.state != "open":
            raise session_closed(session.state)
        if key.profile_id != session.profile_id:
            raise Forbidden("the client key's profile does not match this session's profile", reason="profile_mismatch")

    def limits_of(self, profile: ProfileRecord) -> Limits:
        return self.config.limits.overridden(profile.limits)

    # The gateway's rate limit for a credential (internal plane).

    async def rate_policy(self, request: session_pb2.RatePolicyRequest) -> session_pb2.RatePolicy:
        try:
            digest = token_digest(Credential.of(request.credential).token())
        except Unauthenticated:
            digest = None  # not a bearer token: the defaults
        overrides = await self.store.read(quotas.limits_of_key, digest) if digest is not None else None
        limits = self.config.limits.overridden(overrides)
        return session_pb2.RatePolicy(requests_per_second=limits.requests_per_second_per_key, burst=limits.burst)

    # Shared by open and join: checks 4-8 of §5.1 (5-8 of §5.2). A join has
    # already checked that the key's profile is the session's.

    def vet_profile(self, key: KeyRecord, profile: ProfileRecord | None, body: Declarations) -> Refusal | None:
        if profile is None:
            profile_id = key.profile_id or ""
            log.error("client key %s: profile %s is no longer available", key.id, profile_id)
            return Refusal(
                Unprocessable("the profile bound to this client key is no longer available", reason="profile_unavailable"),
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
                Unprocessable(
                    f'the profile\'s primary provider "{echo(profile.primary_provider)}" is not configured in bae-config.toml',
                    reason="primary_provider_unavailable",
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
                raise Forbidden(f'tool "{echo(tool["name"])}" is not in the profile\'s allowlist', reason="tool_not_allowed")
        bodies.validate_subagent_tools(body.subagent_tools)
        return None

    def _created(self, opened: Opened) -> client_api_pb2.SessionCreated:
        profile = opened.profile
        entry = self.config.provider(profile.primary_provider)
        assert entry is not None  # vet_profile refuses a profile whose primary is not configured
        return client_api_pb2.SessionCreated(
            session_id=opened.session_id,
            session_key=opened.token,
            profile=client_api_pb2.SessionProfile(
                id=profile.id,
                name=profile.name,
                allowed_tools=profile.allowed_tools,
                mcp_servers=profile.mcp_servers,
                provider=client_api_pb2.ProviderModel(provider=entry.provider, model=entry.model),
            ),
        )

    # Each handler below authenticates and reads in one store call.

    # GET /api/v1/sessions/{id}/participants (§5.3)

    async def participants(self, request: client_api_pb2.ListParticipantsRequest) -> client_api_pb2.Participants:
        session_id = request.session_id
        credential = Credential.of(request.credential)
        session = await self.auth.with_session_key(credential, session_id, sessions.get, session_id, writes=False)
        if session is None:
            raise NotFound(f"no session {echo(session_id)}")
        if session.state == SessionState.OPEN and self.sessions.get(session_id) is None:
            # Not served here yet (a restart, a takeover): served from now on, drivers rebuilt from the log.
            with contextlib.suppress(SessionNotOpen):
                await self.sessions.attach(session_id)
        return client_api_pb2.Participants(drivers=self.sessions.drivers(session_id))

    # GET /api/v1/sessions/{id}/events (§5.4)

    async def events(self, request: client_api_pb2.ListEventsRequest) -> Iterator[client_api_pb2.EventPage]:
        """The page's messages (event_messages.page_messages)."""
        session_id = request.session_id
        credential = Credential.of(request.credential)
        try:
            page = page_request(request.cursor, request.limit)
        except InvalidInput:
            # Credentials are checked before the query: a bad key beats a bad cursor.
            await self.auth.session_principal(credential, session_id)
            raise
        rows = await self.auth.with_session_key(
            credential, session_id, events.page, session_id, page.after_seq, page.fetch, PAGE_PAYLOAD_CHARS,
            writes=False,
        )
        return page_messages(*page.page([(row.seq, row) for row in rows], payload_chars))

    # GET /api/v1/sessions/{id}/usage (store/usage.py)

    async def usage(self, request: client_api_pb2.GetSessionUsageRequest) -> client_api_pb2.SessionUsage:
        session_id = request.session_id
        totals = await self.auth.with_session_key(
            Credential.of(request.credential), session_id, usage.session_totals, session_id, writes=False
        )
        return session_usage(session_id, totals)

    # DELETE /api/v1/sessions/{id} (§5.5)

    async def close_session(self, request: client_api_pb2.CloseSessionRequest) -> client_api_pb2.SessionClosed:
        session_id = request.session_id
        session, views = await self.auth.with_session_key(
            Credential.of(request.credential), session_id, opening.close_by_client, session_id
        )
        if session is None:
            raise NotFound(f"no session {echo(session_id)}")
        if views:
            self.sessions.publish(session_id, views)
        # Teardown runs whatever the previous state was (idempotent).
        await self.closer.close(session_id, attribute_to=session.client_key_id)
        self.spans.end(session_id)
        if session.state != "open":
            raise session_closed(session.state)
        return client_api_pb2.SessionClosed(session_id=session_id, state="closed")
