"""The SessionService gRPC servicer: each method hands its typed request to its handler.

REST calls go to the client and admin handlers, JSON-RPC calls to the live API. A handler's
refusal is one of bae.common.errors' kinds, which the server's ErrorInterceptor ends the call
with; anything unexpected becomes `Internal`, logged here. A JSON-RPC method answers its errors
as values once authenticated (bae-error-bin only for the 401).
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol, TypeAlias, TypeVar

import grpc
from google.protobuf.message import Message as ProtoMessage

from bae.common import telemetry
from bae.common.errors import BaeError, Internal
from bae.common.protos import admin_api_pb2, client_api_pb2, edge_pb2, session_pb2, session_pb2_grpc
from bae.common.session_routing import OWNER_KEY, was_redirected
from services.session.api.admin import AdminApi
from services.session.api.auth import Authenticator
from services.session.api.calls import Credential
from services.session.api.faults import rpc_error
from services.session.api.jsonrpc import RpcCall
from services.session.api.live import LiveApi
from services.session.api.rest import ClientRestApi
from services.session.api.sandbox_methods import SandboxMethods
from services.session.engine.errors import SessionNotOpen
from services.session.engine.ownership import NotOwner, Ownership
from services.session.engine.spans import SessionSpans

# The servicer methods' context argument.
Context: TypeAlias = grpc.aio.ServicerContext

log = logging.getLogger("bae.session.server")

SERVICE_NAME = "baeproto.v1.SessionService"

T = TypeVar("T")
R = TypeVar("R", bound=ProtoMessage)
F = TypeVar("F", bound=ProtoMessage)


class RpcRequest(Protocol):
    """What every JSON-RPC method's request carries (client_api.proto)."""

    @property
    def credential(self) -> edge_pb2.Credential: ...
    @property
    def session_id(self) -> str: ...
    @property
    def params(self) -> Any: ...
    @property
    def invalid_params(self) -> str: ...


async def _answer(reply: Awaitable[T]) -> T:
    try:
        return await reply
    except BaeError:
        raise
    except Exception:
        log.exception("request failed")
        raise Internal("internal server error") from None


class SessionServicer(session_pb2_grpc.SessionServiceServicer):
    def __init__(
        self,
        *,
        rest: ClientRestApi,
        admin: AdminApi,
        auth: Authenticator,
        live: LiveApi,
        sandboxes: SandboxMethods,
        ownership: Ownership,
        spans: SessionSpans,
    ) -> None:
        self.ownership = ownership
        self.spans = spans
        self.rest = rest
        self.admin = admin
        self.auth = auth
        self.live = live
        self.sandboxes = sandboxes

    # Client REST.

    async def OpenSession(
        self, request: client_api_pb2.OpenSessionRequest, context: Context
    ) -> client_api_pb2.SessionCreated:
        if not was_redirected(context):  # a new session goes to the least-loaded replica
            target = await self.ownership.least_loaded()
            if target is not None and target.id != self.ownership.replica_id:
                await _redirect(context, target.address)
        return await _answer(self.rest.open_session(request))

    async def JoinSession(
        self, request: client_api_pb2.JoinSessionRequest, context: Context
    ) -> client_api_pb2.SessionCreated:
        await self._owned(request.session_id, context)
        return await _answer(self.rest.join_session(request))

    async def ListParticipants(
        self, request: client_api_pb2.ListParticipantsRequest, context: Context
    ) -> client_api_pb2.Participants:
        await self._owned(request.session_id, context)
        return await _answer(self.rest.participants(request))

    async def ListEvents(self, request: client_api_pb2.ListEventsRequest, context: Context) -> client_api_pb2.EventPage:
        return await _answer(self.rest.events(request))

    async def CloseSession(
        self, request: client_api_pb2.CloseSessionRequest, context: Context
    ) -> client_api_pb2.SessionClosed:
        await self._owned(request.session_id, context)
        return await _answer(self.rest.close_session(request))

    # Admin REST.

    async def CreateProfile(
        self, request: admin_api_pb2.CreateProfileRequest, context: Context
    ) -> admin_api_pb2.ProfileCreated:
        return await _answer(self.admin.create_profile(request))

    async def ListProfiles(self, request: admin_api_pb2.ListProfilesRequest, context: Context) -> admin_api_pb2.ProfilePage:
        return await _answer(self.admin.list_profiles(request))

    async def GetProfile(self, request: admin_api_pb2.GetProfileRequest, context: Context) -> admin_api_pb2.Profile:
        return await _answer(self.admin.get_profile(request))

    async def ReplaceProfile(self, request: admin_api_pb2.ReplaceProfileRequest, context: Context) -> admin_api_pb2.Profile:
        return await _answer(self.admin.replace_profile(request))

    async def DeleteProfile(self, request: admin_api_pb2.DeleteProfileRequest, context: Context) -> admin_api_pb2.NoContent:
        return await _answer(self.admin.delete_profile(request))

    async def CreateKey(self, request: admin_api_pb2.CreateKeyRequest, context: Context) -> admin_api_pb2.KeyCreated:
        return await _answer(self.admin.create_key(request))

    async def ListKeys(self, request: admin_api_pb2.ListKeysRequest, context: Context) -> admin_api_pb2.KeyPage:
        return await _answer(self.admin.list_keys(request))

    async def RevokeKey(self, request: admin_api_pb2.RevokeKeyRequest, context: Context) -> admin_api_pb2.NoContent:
        return await _answer(self.admin.revoke_key(request))

    async def ListSessions(self, request: admin_api_pb2.ListSessionsRequest, context: Context) -> admin_api_pb2.SessionPage:
        return await _answer(self.admin.list_sessions(request))

    async def GetSession(self, request: admin_api_pb2.GetSessionRequest, context: Context) -> admin_api_pb2.SessionSummary:
        return await _answer(self.admin.get_session(request))

    async def ListSessionEvents(
        self, request: admin_api_pb2.ListSessionEventsRequest, context: Context
    ) -> client_api_pb2.EventPage:
        return await _answer(self.admin.list_session_events(request))

    async def ListMcpServers(self, request: admin_api_pb2.AdminRequest, context: Context) -> admin_api_pb2.McpServers:
        return await _answer(self.admin.list_mcp_servers(request))

    async def ListProviders(self, request: admin_api_pb2.AdminRequest, context: Context) -> admin_api_pb2.Providers:
        return await _answer(self.admin.list_providers(request))

    async def GetConfig(self, request: admin_api_pb2.AdminRequest, context: Context) -> admin_api_pb2.ConfigSnapshot:
        return await _answer(self.admin.get_config(request))

    async def GetSandboxStatus(self, request: admin_api_pb2.AdminRequest, context: Context) -> admin_api_pb2.SandboxStatus:
        return await _answer(self.admin.sandbox_status(request))

    # The internal plane.

    async def CheckCredential(
        self, request: session_pb2.CredentialCheck, context: Context
    ) -> session_pb2.CredentialChecked:
        async def check() -> session_pb2.CredentialChecked:
            credential = Credential.of(request.credential)
            if request.kind == edge_pb2.SESSION_KEY:
                await self.auth.session_principal(credential, request.session_id)
            elif request.kind == edge_pb2.ADMIN_KEY:
                await self.auth.require_admin(credential)
            else:
                await self.auth.client_key(credential)
            return session_pb2.CredentialChecked()

        return await _answer(check())

    async def Relay(self, request: session_pb2.RelayRequest, context: Context) -> AsyncIterator[session_pb2.RelayFrame]:
        # The internal plane's token admitted the caller (a gateway): no session key here.
        await self._owned(request.session_id, context)
        frames = self.live.feed_relay(request.session_id)
        try:
            first = await anext(frames)
        except SessionNotOpen:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the session is not open")
        yield first
        async for frame in frames:
            yield frame

    async def ApplyRevocation(self, request: session_pb2.Revocation, context: Context) -> session_pb2.RevocationApplied:
        await self.admin.apply_revocation(request)
        return session_pb2.RevocationApplied()

    # JSON-RPC.

    async def RegisterDriver(
        self, request: client_api_pb2.RegisterDriverRequest, context: Context
    ) -> client_api_pb2.RegisterDriverReply:
        reply = await self._unary(request, self.live.register_driver, client_api_pb2.RegisterDriverReply, context)
        if (traceparent := self.spans.traceparent(request.session_id)) is not None:
            context.set_trailing_metadata(((telemetry.SESSION_TRACEPARENT_KEY, traceparent),))
        return reply

    async def SendMessage(self, request: client_api_pb2.SendMessageRequest, context: Context) -> AsyncIterator[client_api_pb2.TurnFrame]:
        async for frame in self._stream(request, self.live.send_message, client_api_pb2.TurnFrame, context):
            yield frame

    async def Compact(self, request: client_api_pb2.CompactRequest, context: Context) -> AsyncIterator[client_api_pb2.CompactionFrame]:
        async for frame in self._stream(request, self.live.compact, client_api_pb2.CompactionFrame, context):
            yield frame

    async def Subscribe(self, request: client_api_pb2.SubscribeRequest, context: Context) -> AsyncIterator[client_api_pb2.SubscriptionFrame]:
        async for frame in self._stream(request, self.live.subscribe, client_api_pb2.SubscriptionFrame, context):
            yield frame

    async def Unsubscribe(
        self, request: client_api_pb2.UnsubscribeRequest, context: Context
    ) -> client_api_pb2.UnsubscribeReply:
        return await self._unary(request, self.live.unsubscribe, client_api_pb2.UnsubscribeReply, context)

    async def UpdateClientTools(
        self, request: client_api_pb2.UpdateClientToolsRequest, context: Context
    ) -> client_api_pb2.UpdateClientToolsReply:
        return await self._unary(request, self.live.update_client_tools, client_api_pb2.UpdateClientToolsReply, context)

    async def StartRemoteSandbox(
        self, request: client_api_pb2.StartRemoteSandboxRequest, context: Context
    ) -> client_api_pb2.StartRemoteSandboxReply:
        return await self._unary(
            request, self.sandboxes.start_remote_sandbox, client_api_pb2.StartRemoteSandboxReply, context
        )

    async def StopRemoteSandbox(
        self, request: client_api_pb2.StopRemoteSandboxRequest, context: Context
    ) -> client_api_pb2.StopRemoteSandboxReply:
        return await self._unary(request, self.sandboxes.stop_remote_sandbox, client_api_pb2.StopRemoteSandboxReply, context)

    async def ExecRemoteSandbox(
        self, request: client_api_pb2.ExecRemoteSandboxRequest, context: Context
    ) -> client_api_pb2.ExecRemoteSandboxReply:
        return await self._unary(request, self.sandboxes.exec_remote_sandbox, client_api_pb2.ExecRemoteSandboxReply, context)

    async def ReportLocalSandbox(
        self, request: client_api_pb2.ReportLocalSandboxRequest, context: Context
    ) -> client_api_pb2.ReportLocalSandboxReply:
        return await self._unary(
            request, self.sandboxes.report_local_sandbox, client_api_pb2.ReportLocalSandboxReply, context
        )

    async def ReportLocalSubagent(
        self, request: client_api_pb2.ReportLocalSubagentRequest, context: Context
    ) -> client_api_pb2.ReportLocalSubagentReply:
        return await self._unary(request, self.live.report_local_subagent, client_api_pb2.ReportLocalSubagentReply, context)

    async def CancelSubagent(
        self, request: client_api_pb2.CancelSubagentRequest, context: Context
    ) -> client_api_pb2.CancelSubagentReply:
        return await self._unary(request, self.live.cancel_subagent, client_api_pb2.CancelSubagentReply, context)

    # JSON-RPC plumbing: authenticate once (a failure is Unauthenticated: HTTP 401 before
    # any streaming), then map every fault to its error in one place.

    async def _call(self, request: RpcRequest, context: Context) -> RpcCall[Any]:
        principal, session, profile = await self.auth.session_principal_and_records(
            Credential.of(request.credential), request.session_id
        )
        await self._owned(request.session_id, context)
        return RpcCall(principal, session, profile, request.params, request.invalid_params)

    async def _owned(self, session_id: str, context: Context) -> None:
        """Serve the call here only if this replica owns the session (or takes it over); else
        refuse it, before it has any effect, with the owner's address."""
        try:
            await self.ownership.claim(session_id)
        except NotOwner as moved:
            await _redirect(context, moved.address)

    async def _unary(
        self, request: RpcRequest, method: Callable[[RpcCall[Any]], Awaitable[Any]], reply: Callable[..., R], context: Context
    ) -> R:
        call = await self._call(request, context)
        try:
            return reply(result=await method(call))
        except Exception as exc:
            return reply(error=rpc_error(exc, _method_name(method)))

    async def _stream(
        self, request: RpcRequest, method: Callable[[RpcCall[Any]], AsyncIterator[F]], frame: Callable[..., F], context: Context
    ) -> AsyncIterator[F]:
        call = await self._call(request, context)
        yield frame(accepted=True)
        try:
            async for item in method(call):
                yield item
        except Exception as exc:
            yield frame(error=rpc_error(exc, _method_name(method)))


async def _redirect(context: Context, address: str) -> None:
    context.set_trailing_metadata(((OWNER_KEY, address),))
    await context.abort(grpc.StatusCode.UNAVAILABLE, f"served by the session replica at {address}")


def _method_name(method: Callable[..., Any]) -> str:
    return str(getattr(method, "__name__", None) or getattr(getattr(method, "func", None), "__name__", "rpc"))


def register(servicer: SessionServicer) -> Callable[[grpc.aio.Server], list[str]]:
    def _register(server: grpc.aio.Server) -> list[str]:
        session_pb2_grpc.add_SessionServiceServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return _register
