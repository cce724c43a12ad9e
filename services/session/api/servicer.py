"""The SessionService gRPC servicer: REST calls go to the REST/admin handlers,
JSON-RPC calls to the live API. Unexpected failures become a 500 `internal`."""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Awaitable, Callable, TypeAlias

import grpc

from bae.common import telemetry
from bae.common.errors import BaeError, internal
from bae.common.jsontext import dump
from bae.common.protos import session_pb2, session_pb2_grpc
from bae.common.session_routing import OWNER_KEY, was_redirected
from services.session.api.admin import AdminApi
from services.session.api.auth import Authenticator
from services.session.api.calls import Credential, RestCall
from services.session.api.exchange import Exchange, call_handlers
from services.session.api.faults import rpc_error
from services.session.api.jsonrpc import ACCEPTED, RpcCall
from services.session.api.problems import as_problem, problems
from services.session.api.live import LiveApi
from services.session.engine.errors import SessionNotOpen
from services.session.engine.ownership import NotOwner, Ownership
from services.session.engine.spans import SessionSpans
from services.session.api.rest import ClientRestApi
from services.session.api.sandbox_methods import SandboxMethods

# The servicer methods' context argument (unused: errors travel as values or Problems).
Context: TypeAlias = grpc.aio.ServicerContext

log = logging.getLogger("bae.session.server")

SERVICE_NAME = "baeproto.v1.SessionService"


async def _json(reply: Awaitable[str]) -> session_pb2.JsonReply:
    try:
        return session_pb2.JsonReply(json=await reply)
    except BaeError as error:
        raise as_problem(error) from None
    except Exception:
        log.exception("request failed")
        raise internal() from None


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
        # Built last: it takes the handlers of this servicer's methods.
        self.exchange = Exchange(call_handlers(session_pb2_grpc.add_SessionServiceServicer_to_server, self))

    # Client REST.

    async def OpenSession(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        if not was_redirected(context):  # a new session goes to the least-loaded replica
            with problems():
                target = await self.ownership.least_loaded()
            if target is not None and target.id != self.ownership.replica_id:
                await _redirect(context, target.address)
        return await _json(self.rest.open_session(RestCall.of(request)))

    async def JoinSession(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        await self._owned(request.path_id, context)
        return await _json(self.rest.join_session(RestCall.of(request)))

    async def ListParticipants(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        await self._owned(request.path_id, context)
        return await _json(self.rest.participants(RestCall.of(request)))

    async def ListEvents(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.rest.events(RestCall.of(request)))

    async def CloseSession(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        await self._owned(request.path_id, context)
        return await _json(self.rest.close_session(RestCall.of(request)))

    # Admin REST.

    async def CreateProfile(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.create_profile(RestCall.of(request)))

    async def ListProfiles(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.list_profiles(RestCall.of(request)))

    async def GetProfile(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.get_profile(RestCall.of(request)))

    async def ReplaceProfile(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.replace_profile(RestCall.of(request)))

    async def DeleteProfile(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.delete_profile(RestCall.of(request)))

    async def CreateKey(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.create_key(RestCall.of(request)))

    async def ListKeys(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.list_keys(RestCall.of(request)))

    async def RevokeKey(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.revoke_key(RestCall.of(request)))

    async def ListSessions(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.list_sessions(RestCall.of(request)))

    async def ListSessionEvents(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.list_session_events(RestCall.of(request)))

    async def ListMcpServers(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.list_mcp_servers(RestCall.of(request)))

    async def ListProviders(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.list_providers(RestCall.of(request)))

    async def GetConfig(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.get_config(RestCall.of(request)))

    async def GetSandboxStatus(self, request: session_pb2.RestRequest, context: Context) -> session_pb2.JsonReply:
        return await _json(self.admin.sandbox_status(RestCall.of(request)))

    # JSON-RPC.

    async def CheckSessionKey(self, request: session_pb2.RpcRequest, context: Context) -> session_pb2.JsonReply:
        async def check() -> str:
            principal = await self.auth.session_principal(_credential(request), request.session_id)
            return dump({"session_id": principal.session_id, "client_key_id": principal.client_key_id})

        return await _json(check())

    async def CheckCredential(self, request: session_pb2.CredentialCheck, context: Context) -> session_pb2.JsonReply:
        async def check() -> str:
            kind = request.credential
            if kind == session_pb2.CredentialCheck.SESSION_KEY:
                await self.auth.session_principal(_credential(request), request.path_id)
            elif kind == session_pb2.CredentialCheck.ADMIN_KEY:
                await self.auth.require_admin(_credential(request))
            else:
                await self.auth.client_key(_credential(request))
            return "{}"

        return await _json(check())

    async def RegisterDriver(self, request: session_pb2.RpcRequest, context: Context) -> session_pb2.RpcReply:
        reply = await self._unary(request, self.live.register_driver, context)
        if (traceparent := self.spans.traceparent(request.session_id)) is not None:
            context.set_trailing_metadata(((telemetry.SESSION_TRACEPARENT_KEY, traceparent),))
        return reply

    async def SendMessage(self, request: session_pb2.RpcRequest, context: Context) -> AsyncIterator[session_pb2.RpcFrame]:
        async for frame in self._stream(request, self.live.send_message, context):
            yield frame

    async def Compact(self, request: session_pb2.RpcRequest, context: Context) -> AsyncIterator[session_pb2.RpcFrame]:
        async for frame in self._stream(request, self.live.compact, context):
            yield frame

    async def Subscribe(self, request: session_pb2.RpcRequest, context: Context) -> AsyncIterator[session_pb2.RpcFrame]:
        async for frame in self._stream(request, self.live.subscribe, context):
            yield frame

    async def Relay(self, request: session_pb2.RpcRequest, context: Context) -> AsyncIterator[session_pb2.RpcFrame]:
        # The internal plane's token admitted the caller (a gateway): no session key here.
        await self._owned(request.session_id, context)
        frames = self.live.feed_relay(request.session_id)
        try:
            with problems():
                first = await anext(frames)
        except SessionNotOpen:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the session is not open")
        yield first
        async for frame in frames:
            yield frame

    async def Unsubscribe(self, request: session_pb2.RpcRequest, context: Context) -> session_pb2.RpcReply:
        return await self._unary(request, self.live.unsubscribe, context)

    async def UpdateClientTools(self, request: session_pb2.RpcRequest, context: Context) -> session_pb2.RpcReply:
        return await self._unary(request, self.live.update_client_tools, context)

    async def StartRemoteSandbox(self, request: session_pb2.RpcRequest, context: Context) -> session_pb2.RpcReply:
        return await self._unary(request, self.sandboxes.start_remote_sandbox, context)

    async def StopRemoteSandbox(self, request: session_pb2.RpcRequest, context: Context) -> session_pb2.RpcReply:
        return await self._unary(request, self.sandboxes.stop_remote_sandbox, context)

    async def ExecRemoteSandbox(self, request: session_pb2.RpcRequest, context: Context) -> session_pb2.RpcReply:
        return await self._unary(request, self.sandboxes.exec_remote_sandbox, context)

    async def ReportLocalSandbox(self, request: session_pb2.RpcRequest, context: Context) -> session_pb2.RpcReply:
        return await self._unary(request, self.sandboxes.report_local_sandbox, context)

    async def ReportLocalSubagent(self, request: session_pb2.RpcRequest, context: Context) -> session_pb2.RpcReply:
        return await self._unary(request, self.live.report_local_subagent, context)

    async def CancelSubagent(self, request: session_pb2.RpcRequest, context: Context) -> session_pb2.RpcReply:
        return await self._unary(request, self.live.cancel_subagent, context)

    # Between replicas.

    async def ApplyRevocation(self, request: session_pb2.Revocation, context: Context) -> session_pb2.RevocationReply:
        with problems():
            await self.admin.apply_revocation(request)
        return session_pb2.RevocationReply()

    async def Exchange(self, packs: AsyncIterator[session_pb2.ExchangeCalls], context: Context) -> None:
        await self.exchange.serve(packs, context)

    # JSON-RPC plumbing: authenticate once (a failure is a Problem: HTTP 401 before
    # any streaming), then map every fault to its error in one place.

    async def _call(self, request: session_pb2.RpcRequest, context: Context) -> RpcCall:
        with problems():
            principal, session, profile = await self.auth.session_principal_and_records(
                _credential(request), request.session_id
            )
        await self._owned(request.session_id, context)
        return RpcCall(principal, session, profile, request.params_json)

    async def _owned(self, session_id: str, context: Context) -> None:
        """Serve the call here only if this replica owns the session (or takes it over); else
        refuse it, before it has any effect, with the owner's address."""
        try:
            with problems():
                await self.ownership.claim(session_id)
        except NotOwner as moved:
            await _redirect(context, moved.address)

    async def _unary(
        self, request: session_pb2.RpcRequest, method: Callable[[RpcCall], Awaitable[Any]], context: Context
    ) -> session_pb2.RpcReply:
        call = await self._call(request, context)
        try:
            return session_pb2.RpcReply(result_json=dump(await method(call)))
        except Exception as exc:
            return session_pb2.RpcReply(error=rpc_error(exc, _method_name(method)))

    async def _stream(
        self,
        request: session_pb2.RpcRequest,
        method: Callable[[RpcCall], AsyncIterator[session_pb2.RpcFrame]],
        context: Context,
    ) -> AsyncIterator[session_pb2.RpcFrame]:
        call = await self._call(request, context)
        yield ACCEPTED
        try:
            async for frame in method(call):
                yield frame
        except Exception as exc:
            yield session_pb2.RpcFrame(error=rpc_error(exc, _method_name(method)))


async def _redirect(context: Context, address: str) -> None:
    context.set_trailing_metadata(((OWNER_KEY, address),))
    await context.abort(grpc.StatusCode.UNAVAILABLE, f"served by the session replica at {address}")


def _credential(request: session_pb2.RpcRequest | session_pb2.CredentialCheck) -> Credential:
    return Credential.from_header(request.authorization, request.has_authorization)


def _method_name(method: Callable[..., Any]) -> str:
    return str(getattr(method, "__name__", None) or getattr(getattr(method, "func", None), "__name__", "rpc"))


def register(servicer: SessionServicer) -> Callable[[grpc.aio.Server], list[str]]:
    def _register(server: grpc.aio.Server) -> list[str]:
        session_pb2_grpc.add_SessionServiceServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return _register
