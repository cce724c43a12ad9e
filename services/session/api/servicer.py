"""The SessionService gRPC servicer: REST calls go to the REST/admin handlers,
JSON-RPC calls to the live API. Unexpected failures become a 500 `internal`."""

from __future__ import annotations

import logging
from typing import Awaitable

from bae.errors import Problem, internal
from bae.protos import session_pb2, session_pb2_grpc
from services.session.api.admin import AdminApi
from services.session.api.auth import Authenticator
from services.session.api.rest import ClientRestApi
from bae.jsontext import dump

log = logging.getLogger("bae.session.server")

SERVICE_NAME = "baeproto.v1.SessionService"


async def _json(reply: Awaitable[str]) -> session_pb2.JsonReply:
    try:
        return session_pb2.JsonReply(json=await reply)
    except Problem:
        raise
    except Exception:
        log.exception("request failed")
        raise internal() from None


class SessionServicer(session_pb2_grpc.SessionServiceServicer):
    def __init__(self, *, rest: ClientRestApi, admin: AdminApi, auth: Authenticator, live, sandboxes) -> None:
        self.rest = rest
        self.admin = admin
        self.auth = auth
        self.live = live
        self.sandboxes = sandboxes

    # Client REST.

    async def OpenSession(self, request, context):
        return await _json(self.rest.open_session(request))

    async def JoinSession(self, request, context):
        return await _json(self.rest.join_session(request))

    async def ListParticipants(self, request, context):
        return await _json(self.rest.participants(request))

    async def ListEvents(self, request, context):
        return await _json(self.rest.events(request))

    async def CloseSession(self, request, context):
        return await _json(self.rest.close_session(request))

    # Admin REST.

    async def CreateProfile(self, request, context):
        return await _json(self.admin.create_profile(request))

    async def ListProfiles(self, request, context):
        return await _json(self.admin.list_profiles(request))

    async def GetProfile(self, request, context):
        return await _json(self.admin.get_profile(request))

    async def ReplaceProfile(self, request, context):
        return await _json(self.admin.replace_profile(request))

    async def DeleteProfile(self, request, context):
        return await _json(self.admin.delete_profile(request))

    async def CreateKey(self, request, context):
        return await _json(self.admin.create_key(request))

    async def ListKeys(self, request, context):
        return await _json(self.admin.list_keys(request))

    async def RevokeKey(self, request, context):
        return await _json(self.admin.revoke_key(request))

    async def ListSessions(self, request, context):
        return await _json(self.admin.list_sessions(request))

    async def ListSessionEvents(self, request, context):
        return await _json(self.admin.list_session_events(request))

    async def ListMcpServers(self, request, context):
        return await _json(self.admin.list_mcp_servers(request))

    async def ListProviders(self, request, context):
        return await _json(self.admin.list_providers(request))

    async def GetConfig(self, request, context):
        return await _json(self.admin.get_config(request))

    async def GetSandboxStatus(self, request, context):
        return await _json(self.admin.sandbox_status(request))

    # JSON-RPC.

    async def CheckSessionKey(self, request, context):
        async def check() -> str:
            principal = await self.auth.session_principal(
                request.authorization, request.has_authorization, request.session_id
            )
            return dump({"session_id": principal.session_id, "client_key_id": principal.client_key_id})

        return await _json(check())

    async def RegisterDriver(self, request, context):
        return await self.live.register_driver(request, context)

    async def SendMessage(self, request, context):
        async for frame in self.live.send_message(request, context):
            yield frame

    async def Compact(self, request, context):
        async for frame in self.live.compact(request, context):
            yield frame

    async def Subscribe(self, request, context):
        async for frame in self.live.subscribe(request, context):
            yield frame

    async def Unsubscribe(self, request, context):
        return await self.live.unsubscribe(request, context)

    async def UpdateClientTools(self, request, context):
        return await self.live.update_client_tools(request, context)

    async def StartRemoteSandbox(self, request, context):
        return await self.sandboxes.start_remote_sandbox(request, context)

    async def StopRemoteSandbox(self, request, context):
        return await self.sandboxes.stop_remote_sandbox(request, context)

    async def ExecRemoteSandbox(self, request, context):
        return await self.sandboxes.exec_remote_sandbox(request, context)

    async def ReportLocalSandbox(self, request, context):
        return await self.sandboxes.report_local_sandbox(request, context)

    async def ReportLocalSubagent(self, request, context):
        return await self.live.report_local_subagent(request, context)

    async def CancelSubagent(self, request, context):
        return await self.live.cancel_subagent(request, context)


def register(servicer: SessionServicer):
    def _register(server) -> list[str]:
        session_pb2_grpc.add_SessionServiceServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return _register
