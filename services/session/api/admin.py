"""The admin API (`/admin/v1/*`, SERVER-SPEC §4). Every handler authenticates first.

Handlers take the gateway's RestRequest and return the response body text
("" for 204); failures raise Problem.
"""

from __future__ import annotations

from bae.common import config as config_views
from bae.common.config import Config
from bae.common.errors import Problem, bad_request, not_found
from bae.common.protos import session_pb2
from services.session.api import bodies
from services.session.api.auth import Authenticator
from services.session.api.calls import RestCall
from services.session.api.pagination import page_json, page_request
from services.session.engine.revocation import Revocations
from services.session.engine.sandboxes import SessionSandboxes
from services.session.remote.peers import revocation_of
from services.session.store.records import KeyRecord
from services.session.store import events, keys, profiles, revocation, sessions
from bae.common.jsontext import dump
from services.session.store.store import Store


def key_view(key: KeyRecord) -> dict:
    return {
        "id": key.id,
        "name": key.name,
        "prefix": key.key_prefix,
        "profile_id": key.profile_id,
        "created_at": key.created_at,
        "last_used_at": key.last_used_at,
    }


def duplicate_name() -> Problem:
    return Problem(409, "duplicate_name", "a profile with that name already exists")


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

    async def _admin(self, call: RestCall) -> None:
        await self.auth.require_admin(call.credential)

    # Profiles (§4.2).

    async def create_profile(self, call: RestCall) -> str:
        await self._admin(call)
        fields = bodies.parse_profile_body(call.body, call.content_type)
        try:
            profile = await self.store.write(profiles.create, fields)
        except profiles.DuplicateName:
            raise duplicate_name() from None
        self.sandboxes.provision(profile)
        return dump({"id": profile.id, "name": profile.name, "created_at": profile.created_at})

    async def list_profiles(self, call: RestCall) -> str:
        await self._admin(call)
        page = page_request(call.query)
        rows = await self.store.read(profiles.page, page.after_seq, page.fetch)
        return page_json([(seq, dump(profiles.view(p))) for seq, p in rows], page)

    async def get_profile(self, call: RestCall) -> str:
        await self._admin(call)
        profile = await self.store.read(profiles.active, call.path_id)
        if profile is None:
            raise not_found(f"no profile {call.path_id}")
        return dump(profiles.view(profile))

    async def replace_profile(self, call: RestCall) -> str:
        await self._admin(call)
        fields = bodies.parse_profile_body(call.body, call.content_type)
        try:
            profile = await self.store.write(profiles.replace, call.path_id, fields)
        except profiles.DuplicateName:
            raise duplicate_name() from None
        if profile is None:
            raise not_found(f"no profile {call.path_id}")
        self.sandboxes.provision(profile)
        return dump(profiles.view(profile))

    async def delete_profile(self, call: RestCall) -> str:
        await self._admin(call)
        profile_id = call.path_id

        in_use = await self.store.write(profiles.delete_unused, profile_id)
        if in_use is None:
            raise not_found(f"no profile {profile_id}")
        if in_use:
            raise Problem(
                409,
                "profile_in_use",
                f"profile has {in_use} active client key(s); revoke them before deleting",
            )
        return ""

    # Client keys (§4.3).

    async def create_key(self, call: RestCall) -> str:
        await self._admin(call)
        name, profile_id = bodies.parse_key_body(call.body, call.content_type)

        minted = await self.store.write(keys.mint_client, name, profile_id)
        if minted is None:
            raise Problem(422, "profile_unavailable", f"no active profile {profile_id}")
        token, key = minted
        return dump(
            {
                "id": key.id,
                "name": key.name,
                "key": token,
                "prefix": key.key_prefix,
                "profile_id": key.profile_id,
                "created_at": key.created_at,
            }
        )

    async def list_keys(self, call: RestCall) -> str:
        await self._admin(call)
        page = page_request(call.query)

        # Written first, so the page shows the latest coalesced last_used_at.
        stamps = self.auth.stamps.take()
        rows = await self.store.write(keys.stamped_client_page, stamps, page.after_seq, page.fetch)
        return page_json([(seq, dump(key_view(key))) for seq, key in rows], page)

    async def revoke_key(self, call: RestCall) -> str:
        await self._admin(call)
        key_id = call.path_id

        revoked = await self.store.write(revocation.revoke_client, key_id)
        if revoked is None:
            raise not_found(f"no active client key {key_id}")
        held, closed = revoked
        # Sessions other keys still hold stay open; the revoked key loses its live access there.
        await self.revocations.revoke_key(key_id, closed, [session_id for session_id in held if session_id not in closed])
        return ""

    # Sessions (§4.4).

    async def list_sessions(self, call: RestCall) -> str:
        await self._admin(call)
        page = page_request(call.query)
        state = call.query.get("state", "") or None
        if state is not None and state not in sessions.STATES:
            raise bad_request(f'invalid state filter "{state}"; expected one of open, closed, error')
        rows = await self.store.read(sessions.page, state, page.after_seq, page.fetch)
        return page_json([(row.seq, dump(sessions.summary_view(row))) for row in rows], page)

    async def list_session_events(self, call: RestCall) -> str:
        await self._admin(call)
        page = page_request(call.query)
        session_id = call.path_id

        items = await self.store.read(events.page_items_of_existing, session_id, page.after_seq, page.fetch)
        if items is None:
            raise not_found(f"no session {session_id}")
        return page_json(items, page)

    # Registries and config (§4.5): startup snapshots.

    async def list_mcp_servers(self, call: RestCall) -> str:
        await self._admin(call)
        return dump(config_views.mcp_servers_view(self.config))

    async def list_providers(self, call: RestCall) -> str:
        await self._admin(call)
        return dump(config_views.providers_view(self.config))

    async def get_config(self, call: RestCall) -> str:
        await self._admin(call)
        return dump(config_views.config_view(self.config))

    async def sandbox_status(self, call: RestCall) -> str:
        await self._admin(call)
        return dump(self.sandboxes.status_view())
