"""The admin API (`/admin/v1/*`, SERVER-SPEC §4). Every handler authenticates first.

Handlers take the typed request the gateway read and answer the typed reply; a refusal raises
one of bae.common.errors' kinds.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Iterator

from sqlalchemy import Connection, Row

from bae.common import config as config_views
from bae.common.config import Config
from bae.common.errors import Conflict, InvalidInput, NotFound, Unprocessable, echo
from bae.common.timefmt import format_time
from bae.common.protos import admin_api_pb2, client_api_pb2, edge_pb2, session_pb2
from bae.services.session.api import bodies
from bae.services.session.api.auth import Authenticator
from bae.services.session.api.calls import Credential
from bae.services.session.api.event_messages import page_messages, payload_chars
from bae.services.session.api.pagination import PAGE_PAYLOAD_CHARS, page_request
from bae.services.session.api.usage import usage_page, usage_query
from bae.services.session.engine.revocation import Revocations
from bae.services.session.engine.sandboxes import SessionSandboxes
from bae.services.session.remote.peers import revocation_of
from bae.services.session.engine.session_files import ImportReader, delete_session, export_text
from bae.services.session.store import events, keys, profiles, retention, revocation, sessions, usage
from bae.services.session.store.records import KeyRecord, ProfileRecord, SessionRecord
from bae.services.session.store.store import Store


def key_message(key: KeyRecord) -> admin_api_pb2.ClientKey:
    return admin_api_pb2.ClientKey(
        id=key.id,
        name=key.name,
        prefix=key.key_prefix,
        profile_id=key.profile_id,
        created_at=key.created_at,
        last_used_at=key.last_used_at,
    )


def profile_message(profile: ProfileRecord) -> admin_api_pb2.Profile:
    view = profiles.view(profile)
    limits = view.pop("limits")
    retention = view.pop("retention")
    return admin_api_pb2.Profile(
        **view,
        limits=None if limits is None else admin_api_pb2.Limits(**limits),
        retention=None if retention is None else admin_api_pb2.Retention(**retention),
    )


def session_summary(row: Row[Any] | SessionRecord) -> admin_api_pb2.SessionSummary:
    return admin_api_pb2.SessionSummary(**sessions.summary_view(row))


# A purge call lists at most this many sessions, and deletes for about PURGE_SECONDS, well within
# the gateway's deadline (BAE_RPC_TIMEOUT): `more` asks for another call.
PURGE_LIMIT = 1000
PURGE_SECONDS = 5.0


def rfc3339(text: str, name: str) -> str:
    """An RFC 3339 time with its offset, in the store's form (UTC, milliseconds, Z)."""
    try:
        moment = datetime.fromisoformat(text.strip())
        # A time near year 1 or 9999 may leave the calendar in UTC (OverflowError).
        stamp = format_time(moment.astimezone(timezone.utc)) if moment.tzinfo is not None else None
    except (ValueError, OverflowError):
        stamp = None
    if stamp is None:
        raise InvalidInput(f'invalid {name} "{echo(text)}"; expected an RFC 3339 time such as 2026-01-01T00:00:00Z')
    return stamp


# An id_prefix: letters, digits, _ and - (the ids the service makes are `ses_` and hex), at most an id's length.
_ID_PREFIX = re.compile(rf"[A-Za-z0-9_-]{{1,{events.ID_CHARS}}}")


def session_filter(request: admin_api_pb2.ListSessionsRequest) -> sessions.SessionFilter:
    """The list's query filters, checked; a bad one raises InvalidInput (400)."""
    state = request.state or None
    if state is not None and state not in sessions.STATES:
        raise InvalidInput(f'invalid state filter "{echo(state)}"; expected one of open, closed, error')
    for name in ("profile_id", "client_key_id"):
        value = getattr(request, name)
        if len(value) > events.ID_CHARS:
            raise InvalidInput(
                f'invalid {name} filter "{echo(value)}"; expected an id of at most {events.ID_CHARS} characters'
            )
    if request.id_prefix and not _ID_PREFIX.fullmatch(request.id_prefix):
        raise InvalidInput(
            f'invalid id_prefix filter "{echo(request.id_prefix)}"; expected 1 to {events.ID_CHARS} letters, digits, _ or -'
        )
    after = rfc3339(request.created_after, "created_after") if request.created_after else None
    before = rfc3339(request.created_before, "created_before") if request.created_before else None
    if after is not None and before is not None and after > before:
        raise InvalidInput(f"created_after ({after}) is after created_before ({before})")
    return sessions.SessionFilter(
        state=state,
        profile_id=request.profile_id or None,
        client_key_id=request.client_key_id or None,
        created_after=after,
        created_before=before,
        id_prefix=request.id_prefix or None,
    )


def duplicate_name() -> Conflict:
    return Conflict("a profile with that name already exists", reason="duplicate_name")


def _existing_session_events(
    conn: Connection, session_id: str, after_seq: int, limit: int
) -> list[events.EventRow] | None:
    """A page of a session's events, or None when there is no such session (one store call)."""
    if sessions.get(conn, session_id) is None:
        return None
    return events.page(conn, session_id, after_seq, limit, PAGE_PAYLOAD_CHARS)


class AdminApi:
    def __init__(
        self,
        *,
        store: Store,
        auth: Authenticator,
        sandboxes: SessionSandboxes,
        revocations: Revocations,
        config: Config,
    ) -> None:
        self.store = store
        self.auth = auth
        self.sandboxes = sandboxes
        self.revocations = revocations
        self.config = config

    async def apply_revocation(self, revocation: session_pb2.Revocation) -> None:
        """From another replica (internal plane): a revoked key's sessions that this one owns."""
        await self.revocations.apply(revocation_of(revocation))

    async def _admin(self, credential: edge_pb2.Credential) -> None:
        await self.auth.require_admin(Credential.of(credential))

    # Profiles (§4.2).

    async def create_profile(self, request: admin_api_pb2.CreateProfileRequest) -> admin_api_pb2.ProfileCreated:
        await self._admin(request.credential)
        try:
            profile = await self.store.write(profiles.create, bodies.profile_fields(request.body))
        except profiles.DuplicateName:
            raise duplicate_name() from None
        self.sandboxes.provision(profile)
        return admin_api_pb2.ProfileCreated(id=profile.id, name=profile.name, created_at=profile.created_at)

    async def list_profiles(self, request: admin_api_pb2.ListProfilesRequest) -> admin_api_pb2.ProfilePage:
        await self._admin(request.credential)
        page = page_request(request.cursor, request.limit)
        rows = await self.store.read(profiles.page, page.after_seq, page.fetch)
        items, next_cursor = page.page(rows)
        return admin_api_pb2.ProfilePage(items=[profile_message(p) for p in items], next_cursor=next_cursor)

    async def get_profile(self, request: admin_api_pb2.GetProfileRequest) -> admin_api_pb2.Profile:
        await self._admin(request.credential)
        profile = await self.store.read(profiles.active, request.profile_id)
        if profile is None:
            raise NotFound(f"no profile {echo(request.profile_id)}")
        return profile_message(profile)

    async def replace_profile(self, request: admin_api_pb2.ReplaceProfileRequest) -> admin_api_pb2.Profile:
        await self._admin(request.credential)
        try:
            profile = await self.store.write(profiles.replace, request.profile_id, bodies.profile_fields(request.body))
        except profiles.DuplicateName:
            raise duplicate_name() from None
        if profile is None:
            raise NotFound(f"no profile {echo(request.profile_id)}")
        self.sandboxes.provision(profile)
        return profile_message(profile)

    async def delete_profile(self, request: admin_api_pb2.DeleteProfileRequest) -> admin_api_pb2.NoContent:
        await self._admin(request.credential)
        in_use = await self.store.write(profiles.delete_unused, request.profile_id)
        if in_use is None:
            raise NotFound(f"no profile {echo(request.profile_id)}")
        if in_use:
            raise Conflict(
                f"profile has {in_use} active client key(s); revoke them before deleting", reason="profile_in_use"
            )
        return admin_api_pb2.NoContent()

    # Client keys (§4.3).

    async def create_key(self, request: admin_api_pb2.CreateKeyRequest) -> admin_api_pb2.KeyCreated:
        await self._admin(request.credential)
        profile_id = request.body.profile_id
        minted = await self.store.write(keys.mint_client, request.body.name, profile_id)
        if minted is None:
            raise Unprocessable(f"no active profile {echo(profile_id)}", reason="profile_unavailable")
        token, key = minted
        assert key.profile_id is not None  # minted on an active profile
        return admin_api_pb2.KeyCreated(
            id=key.id,
            name=key.name,
            key=token,
            prefix=key.key_prefix,
            profile_id=key.profile_id,
            created_at=key.created_at,
        )

    async def list_keys(self, request: admin_api_pb2.ListKeysRequest) -> admin_api_pb2.KeyPage:
        await self._admin(request.credential)
        page = page_request(request.cursor, request.limit)
        # Written first, so the page shows the latest coalesced last_used_at.
        stamps = self.auth.stamps.take()
        rows = await self.store.write(keys.stamped_client_page, stamps, page.after_seq, page.fetch)
        items, next_cursor = page.page(rows)
        return admin_api_pb2.KeyPage(items=[key_message(key) for key in items], next_cursor=next_cursor)

    async def revoke_key(self, request: admin_api_pb2.RevokeKeyRequest) -> admin_api_pb2.NoContent:
        await self._admin(request.credential)
        key_id = request.key_id
        revoked = await self.store.write(revocation.revoke_client, key_id)
        if revoked is None:
            raise NotFound(f"no active client key {echo(key_id)}")
        held, closed = revoked
        # Sessions other keys still hold stay open; the revoked key loses its live access there.
        await self.revocations.revoke_key(key_id, closed, [session_id for session_id in held if session_id not in closed])
        return admin_api_pb2.NoContent()

    # Sessions (§4.4).

    async def list_sessions(self, request: admin_api_pb2.ListSessionsRequest) -> admin_api_pb2.SessionPage:
        await self._admin(request.credential)
        page = page_request(request.cursor, request.limit)
        rows = await self.store.read(sessions.page, session_filter(request), page.after_seq, page.fetch)
        items, next_cursor = page.page([(row.seq, row) for row in rows])
        return admin_api_pb2.SessionPage(items=[session_summary(row) for row in items], next_cursor=next_cursor)

    async def get_session(self, request: admin_api_pb2.GetSessionRequest) -> admin_api_pb2.SessionSummary:
        await self._admin(request.credential)
        session = await self.store.read(sessions.get, request.session_id)
        if session is None:
            raise NotFound(f"no session {echo(request.session_id)}")
        return session_summary(session)

    async def list_session_events(
        self, request: admin_api_pb2.ListSessionEventsRequest
    ) -> Iterator[client_api_pb2.EventPage]:
        """The page's messages (event_messages.page_messages)."""
        await self._admin(request.credential)
        page = page_request(request.cursor, request.limit)
        session_id = request.session_id
        rows = await self.store.read(_existing_session_events, session_id, page.after_seq, page.fetch)
        if rows is None:
            raise NotFound(f"no session {echo(session_id)}")
        return page_messages(*page.page([(row.seq, row) for row in rows], payload_chars))

    # Deleting, exporting, importing and purging sessions (engine/session_files.py).

    async def delete_session(self, request: admin_api_pb2.DeleteSessionRequest) -> admin_api_pb2.NoContent:
        await self._admin(request.credential)
        if await delete_session(self.store, request.session_id, "admin") is None:
            raise NotFound(f"no session {echo(request.session_id)}")
        return admin_api_pb2.NoContent()

    async def export_session(self, request: admin_api_pb2.ExportSessionRequest) -> AsyncIterator[str]:
        """The export's text in pieces; raises before the first when the session is unknown."""
        await self._admin(request.credential)
        pieces = await export_text(self.store, request.session_id)
        if pieces is None:
            raise NotFound(f"no session {echo(request.session_id)}")
        return pieces

    async def import_session(
        self, requests: AsyncIterator[admin_api_pb2.ImportSessionRequest]
    ) -> admin_api_pb2.SessionImported:
        """The first message's credential is checked before any line is read."""
        first = await anext(aiter(requests), None)
        if first is None:
            raise InvalidInput("the import is empty: expected the session line, then its events")
        await self._admin(first.credential)
        reader = ImportReader()
        for line in first.lines:
            reader.add(line)
        async for message in requests:
            for line in message.lines:
                reader.add(line)
        imported = reader.finish()
        await self.store.write(retention.insert_imported, imported.session, imported.usage, imported.events)
        return admin_api_pb2.SessionImported(
            id=imported.session["id"], state=imported.session["state"], events=len(imported.events)
        )

    async def purge_sessions(self, request: admin_api_pb2.PurgeSessionsRequest) -> admin_api_pb2.PurgeResult:
        await self._admin(request.credential)
        body = request.body
        before = rfc3339(body.closed_before, "closed_before")
        limit = min(body.limit, PURGE_LIMIT) if body.HasField("limit") else PURGE_LIMIT
        ids = await self.store.read(retention.ended_before, before, limit + 1)
        more = len(ids) > limit
        ids = ids[:limit]
        if body.dry_run:
            return admin_api_pb2.PurgeResult(dry_run=True, sessions=len(ids), ids=ids, more=more)
        deleted: list[str] = []
        deadline = time.monotonic() + PURGE_SECONDS
        for session_id in ids:
            if time.monotonic() > deadline:
                more = True
                break
            if await delete_session(self.store, session_id, "admin") is not None:
                deleted.append(session_id)
        return admin_api_pb2.PurgeResult(dry_run=False, sessions=len(deleted), ids=deleted, more=more)

    # Usage (store/usage.py).

    async def list_usage(self, request: admin_api_pb2.ListUsageRequest) -> admin_api_pb2.UsagePage:
        await self._admin(request.credential)
        query = usage_query(request)
        groups = await self.store.read(usage.grouped, query.group_by, query.since, query.until, query.after, query.limit + 1)
        return usage_page(query, groups)

    # Registries and config (§4.5): startup snapshots.

    async def list_mcp_servers(self, request: admin_api_pb2.AdminRequest) -> admin_api_pb2.McpServers:
        await self._admin(request.credential)
        return admin_api_pb2.McpServers(**config_views.mcp_servers_view(self.config))

    async def list_providers(self, request: admin_api_pb2.AdminRequest) -> admin_api_pb2.Providers:
        await self._admin(request.credential)
        return admin_api_pb2.Providers(**config_views.providers_view(self.config))

    async def get_config(self, request: admin_api_pb2.AdminRequest) -> admin_api_pb2.ConfigSnapshot:
        await self._admin(request.credential)
        return admin_api_pb2.ConfigSnapshot(**config_views.config_view(self.config))

    async def sandbox_status(self, request: admin_api_pb2.AdminRequest) -> admin_api_pb2.SandboxStatus:
        await self._admin(request.credential)
        return admin_api_pb2.SandboxStatus(**self.sandboxes.status_view())
