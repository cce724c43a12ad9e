"""The web console's sign-in (docs/console.md): console sessions for an admin key or a one-time
link, their lookup and sign-out, and the links themselves (POST /admin/v1/console-links).

A session's token (the `bae_console` cookie's value) is made here and handed to the gateway once,
to set as the cookie; the store keeps its digest. Its CSRF token is derived from it
(bae.common.console), so nothing else is kept for it.
"""

from __future__ import annotations

from datetime import datetime, timezone

from bae.common.console import LINK_PREFIX, SESSION_PREFIX, csrf_token
from bae.common.errors import Unauthenticated
from bae.common.ids import new_token, token_digest
from bae.common.protos import admin_api_pb2
from bae.services.session.api.auth import Authenticator
from bae.services.session.api.calls import Credential
from bae.services.session.store import console
from bae.services.session.store.store import Store

INVALID_LINK = "the sign-in link is not valid: it was used, it expired, or its admin key was rotated; make a new one"


def _console_session(token: str, expires_at: str) -> admin_api_pb2.ConsoleSession:
    return admin_api_pb2.ConsoleSession(csrf_token=csrf_token(token), expires_at=expires_at)


def _session_token(credential: Credential) -> str:
    if credential.console_session is None:
        raise Unauthenticated("no console session; sign in")
    return credential.console_session


class ConsoleApi:
    def __init__(self, *, store: Store, auth: Authenticator) -> None:
        self.store = store
        self.auth = auth

    async def sign_in(self, request: admin_api_pb2.ConsoleSignInRequest) -> admin_api_pb2.ConsoleSessionStarted:
        admin_key_id = await self.auth.admin_key_of(request.body.token)
        token = new_token(SESSION_PREFIX)
        expires_at = await self.store.write(
            console.start_session, token_digest(token), admin_key_id, datetime.now(timezone.utc)
        )
        return admin_api_pb2.ConsoleSessionStarted(session_token=token, session=_console_session(token, expires_at))

    async def exchange_link(
        self, request: admin_api_pb2.ExchangeConsoleLinkRequest
    ) -> admin_api_pb2.ConsoleSessionStarted:
        token = new_token(SESSION_PREFIX)
        record = await self.store.write(
            console.exchange_link, token_digest(request.body.link), token_digest(token), datetime.now(timezone.utc)
        )
        # A link made while admin auth was disabled signs nobody in once it is enabled again.
        if record is None or (record.admin_key_id is None and not self.auth.admin_auth_disabled):
            raise Unauthenticated(INVALID_LINK)
        return admin_api_pb2.ConsoleSessionStarted(
            session_token=token, session=_console_session(token, record.expires_at)
        )

    async def get_session(self, request: admin_api_pb2.ConsoleSessionRequest) -> admin_api_pb2.ConsoleSession:
        token = _session_token(Credential.of(request.credential))
        record = await self.auth.console_session(token)
        return _console_session(token, record.expires_at)

    async def sign_out(self, request: admin_api_pb2.ConsoleSessionRequest) -> admin_api_pb2.NoContent:
        credential = Credential.of(request.credential)
        if credential.console_session is not None:
            await self.store.write(console.end_session, token_digest(credential.console_session))
        return admin_api_pb2.NoContent()

    async def create_link(self, request: admin_api_pb2.CreateConsoleLinkRequest) -> admin_api_pb2.ConsoleLink:
        admin_key_id = await self.auth.admin_key_id(Credential.of(request.credential))
        link = new_token(LINK_PREFIX)
        expires_at = await self.store.write(console.create_link, token_digest(link), admin_key_id, datetime.now(timezone.utc))
        return admin_api_pb2.ConsoleLink(link=link, expires_at=expires_at)
