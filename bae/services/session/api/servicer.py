"""SessionService's operations: each method hands its typed request to its handler.

Each method is named after its gRPC method in snake case and serves it however the call
arrived (operations.py). REST calls go to the client and admin handlers, JSON-RPC calls to
the live API. A handler's refusal is one of bae.common.errors' kinds, which ends the call
with its status (operations.ending_of); anything unexpected becomes `Internal`, logged here.
A JSON-RPC method answers its errors as values once authenticated (bae-error-bin only for
the 401). A call about a session another replica owns raises NotOwner before it has any effect.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol, TypeVar

from google.protobuf.message import Message as ProtoMessage

from bae.common import telemetry
from bae.common.errors import BaeError, Internal
from bae.common.protos import admin_api_pb2, client_api_pb2, edge_pb2, session_pb2
from bae.services.session.api.admin import AdminApi
from bae.services.session.api.auth import Authenticator
from bae.services.session.api.calls import Credential
from bae.services.session.api.console import ConsoleApi
from bae.services.session.api.faults import rpc_error
from bae.services.session.api.jsonrpc import RpcCall
from bae.services.session.api.live import LiveApi
from bae.services.session.api.operations import Incoming
from bae.services.session.api.rest import ClientRestApi
from bae.services.session.api.sandbox_methods import SandboxMethods
from bae.services.session.api.schedules import SchedulesApi
from bae.services.session.api.triggers import TriggersApi
from bae.services.session.api.webhooks import WebhooksApi
from bae.services.session.engine.ownership import NotOwner, Ownership
from bae.services.session.engine.spans import SessionSpans

log = logging.getLogger("bae.session.server")

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


class SessionServicer:
    def __init__(
        self,
        *,
        rest: ClientRestApi,
        admin: AdminApi,
        schedules: SchedulesApi,
        triggers: TriggersApi,
        webhooks: WebhooksApi,
        console: ConsoleApi,
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
        self.schedules = schedules
        self.triggers = triggers
        self.webhooks = webhooks
        self.console = console
        self.auth = auth
        self.live = live
        self.sandboxes = sandboxes

    # Client REST.

    async def open_session(
        self, request: client_api_pb2.OpenSessionRequest, incoming: Incoming
    ) -> client_api_pb2.SessionCreated:
        if not incoming.redirected:  # a new session goes to the least-loaded replica
            target = await self.ownership.least_loaded()
            if target is not None and target.id != self.ownership.replica_id:
                raise NotOwner("", target.address)
        return await _answer(self.rest.open_session(request))

    async def join_session(
        self, request: client_api_pb2.JoinSessionRequest, incoming: Incoming
    ) -> client_api_pb2.SessionCreated:
        await self._owned(request.session_id)
        return await _answer(self.rest.join_session(request))

    async def list_participants(
        self, request: client_api_pb2.ListParticipantsRequest, incoming: Incoming
    ) -> client_api_pb2.Participants:
        await self._owned(request.session_id)
        return await _answer(self.rest.participants(request))

    async def list_events(
        self, request: client_api_pb2.ListEventsRequest, incoming: Incoming
    ) -> AsyncIterator[client_api_pb2.EventPage]:
        for page in await _answer(self.rest.events(request)):
            yield page

    async def get_session_usage(
        self, request: client_api_pb2.GetSessionUsageRequest, incoming: Incoming
    ) -> client_api_pb2.SessionUsage:
        return await _answer(self.rest.usage(request))

    async def close_session(
        self, request: client_api_pb2.CloseSessionRequest, incoming: Incoming
    ) -> client_api_pb2.SessionClosed:
        await self._owned(request.session_id)
        return await _answer(self.rest.close_session(request))

    # Admin REST.

    async def create_profile(
        self, request: admin_api_pb2.CreateProfileRequest, incoming: Incoming
    ) -> admin_api_pb2.ProfileCreated:
        return await _answer(self.admin.create_profile(request))

    async def list_profiles(
        self, request: admin_api_pb2.ListProfilesRequest, incoming: Incoming
    ) -> admin_api_pb2.ProfilePage:
        return await _answer(self.admin.list_profiles(request))

    async def get_profile(self, request: admin_api_pb2.GetProfileRequest, incoming: Incoming) -> admin_api_pb2.Profile:
        return await _answer(self.admin.get_profile(request))

    async def replace_profile(
        self, request: admin_api_pb2.ReplaceProfileRequest, incoming: Incoming
    ) -> admin_api_pb2.Profile:
        return await _answer(self.admin.replace_profile(request))

    async def delete_profile(
        self, request: admin_api_pb2.DeleteProfileRequest, incoming: Incoming
    ) -> admin_api_pb2.NoContent:
        return await _answer(self.admin.delete_profile(request))

    async def create_key(self, request: admin_api_pb2.CreateKeyRequest, incoming: Incoming) -> admin_api_pb2.KeyCreated:
        return await _answer(self.admin.create_key(request))

    async def list_keys(self, request: admin_api_pb2.ListKeysRequest, incoming: Incoming) -> admin_api_pb2.KeyPage:
        return await _answer(self.admin.list_keys(request))

    async def revoke_key(self, request: admin_api_pb2.RevokeKeyRequest, incoming: Incoming) -> admin_api_pb2.NoContent:
        return await _answer(self.admin.revoke_key(request))

    async def list_sessions(
        self, request: admin_api_pb2.ListSessionsRequest, incoming: Incoming
    ) -> admin_api_pb2.SessionPage:
        return await _answer(self.admin.list_sessions(request))

    async def get_session(
        self, request: admin_api_pb2.GetSessionRequest, incoming: Incoming
    ) -> admin_api_pb2.SessionSummary:
        return await _answer(self.admin.get_session(request))

    async def list_session_events(
        self, request: admin_api_pb2.ListSessionEventsRequest, incoming: Incoming
    ) -> AsyncIterator[client_api_pb2.EventPage]:
        for page in await _answer(self.admin.list_session_events(request)):
            yield page

    async def watch_session(
        self, request: admin_api_pb2.WatchSessionRequest, incoming: Incoming
    ) -> AsyncIterator[client_api_pb2.SubscriptionFrame]:
        await _answer(self.auth.require_admin(Credential.of(request.credential)))
        await self._owned(request.session_id)
        async for frame in self.live.watch(request):
            yield frame

    async def delete_session(
        self, request: admin_api_pb2.DeleteSessionRequest, incoming: Incoming
    ) -> admin_api_pb2.NoContent:
        return await _answer(self.admin.delete_session(request))

    async def export_session(
        self, request: admin_api_pb2.ExportSessionRequest, incoming: Incoming
    ) -> AsyncIterator[admin_api_pb2.ExportChunk]:
        async for text in await _answer(self.admin.export_session(request)):
            yield admin_api_pb2.ExportChunk(text=text)

    async def import_session(
        self, requests: AsyncIterator[admin_api_pb2.ImportSessionRequest], incoming: Incoming
    ) -> admin_api_pb2.SessionImported:
        return await _answer(self.admin.import_session(requests))

    async def purge_sessions(
        self, request: admin_api_pb2.PurgeSessionsRequest, incoming: Incoming
    ) -> admin_api_pb2.PurgeResult:
        return await _answer(self.admin.purge_sessions(request))

    async def list_usage(self, request: admin_api_pb2.ListUsageRequest, incoming: Incoming) -> admin_api_pb2.UsagePage:
        return await _answer(self.admin.list_usage(request))

    async def list_mcp_servers(
        self, request: admin_api_pb2.AdminRequest, incoming: Incoming
    ) -> admin_api_pb2.McpServers:
        return await _answer(self.admin.list_mcp_servers(request))

    async def list_providers(self, request: admin_api_pb2.AdminRequest, incoming: Incoming) -> admin_api_pb2.Providers:
        return await _answer(self.admin.list_providers(request))

    async def get_config(self, request: admin_api_pb2.AdminRequest, incoming: Incoming) -> admin_api_pb2.ConfigSnapshot:
        return await _answer(self.admin.get_config(request))

    async def get_sandbox_status(
        self, request: admin_api_pb2.AdminRequest, incoming: Incoming
    ) -> admin_api_pb2.SandboxStatus:
        return await _answer(self.admin.sandbox_status(request))

    # Webhooks.

    async def create_webhook(
        self, request: admin_api_pb2.CreateWebhookRequest, incoming: Incoming
    ) -> admin_api_pb2.WebhookCreated:
        return await _answer(self.webhooks.create_webhook(request))

    async def list_webhooks(
        self, request: admin_api_pb2.ListWebhooksRequest, incoming: Incoming
    ) -> admin_api_pb2.WebhookPage:
        return await _answer(self.webhooks.list_webhooks(request))

    async def get_webhook(
        self, request: admin_api_pb2.GetWebhookRequest, incoming: Incoming
    ) -> admin_api_pb2.Webhook:
        return await _answer(self.webhooks.get_webhook(request))

    async def replace_webhook(
        self, request: admin_api_pb2.ReplaceWebhookRequest, incoming: Incoming
    ) -> admin_api_pb2.Webhook:
        return await _answer(self.webhooks.replace_webhook(request))

    async def delete_webhook(
        self, request: admin_api_pb2.DeleteWebhookRequest, incoming: Incoming
    ) -> admin_api_pb2.NoContent:
        return await _answer(self.webhooks.delete_webhook(request))

    async def rotate_webhook_secret(
        self, request: admin_api_pb2.RotateWebhookSecretRequest, incoming: Incoming
    ) -> admin_api_pb2.WebhookSecret:
        return await _answer(self.webhooks.rotate_webhook_secret(request))

    async def list_webhook_deliveries(
        self, request: admin_api_pb2.ListWebhookDeliveriesRequest, incoming: Incoming
    ) -> admin_api_pb2.WebhookDeliveryPage:
        return await _answer(self.webhooks.list_webhook_deliveries(request))

    async def retry_webhook_delivery(
        self, request: admin_api_pb2.RetryWebhookDeliveryRequest, incoming: Incoming
    ) -> admin_api_pb2.WebhookDelivery:
        return await _answer(self.webhooks.retry_webhook_delivery(request))

    # The web console's sign-in.

    async def create_console_link(
        self, request: admin_api_pb2.CreateConsoleLinkRequest, incoming: Incoming
    ) -> admin_api_pb2.ConsoleLink:
        return await _answer(self.console.create_link(request))

    async def sign_in_console(
        self, request: admin_api_pb2.ConsoleSignInRequest, incoming: Incoming
    ) -> admin_api_pb2.ConsoleSessionStarted:
        return await _answer(self.console.sign_in(request))

    async def exchange_console_link(
        self, request: admin_api_pb2.ExchangeConsoleLinkRequest, incoming: Incoming
    ) -> admin_api_pb2.ConsoleSessionStarted:
        return await _answer(self.console.exchange_link(request))

    async def get_console_session(
        self, request: admin_api_pb2.ConsoleSessionRequest, incoming: Incoming
    ) -> admin_api_pb2.ConsoleSession:
        return await _answer(self.console.get_session(request))

    async def sign_out_console(
        self, request: admin_api_pb2.ConsoleSessionRequest, incoming: Incoming
    ) -> admin_api_pb2.NoContent:
        return await _answer(self.console.sign_out(request))

    # The internal plane.

    async def get_rate_policy(
        self, request: session_pb2.RatePolicyRequest, incoming: Incoming
    ) -> session_pb2.RatePolicy:
        return await _answer(self.rest.rate_policy(request))

    async def check_credential(
        self, request: session_pb2.CredentialCheck, incoming: Incoming
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

    async def relay(
        self, request: session_pb2.RelayRequest, incoming: Incoming
    ) -> AsyncIterator[session_pb2.RelayFrame]:
        # The internal plane's token admitted the caller (a gateway): no session key here.
        await self._owned(request.session_id)
        # SessionNotOpen, raised before the first frame, ends the call FAILED_PRECONDITION (calls.py).
        async for frame in self.live.feed_relay(request.session_id):
            yield frame

    async def create_schedule(
        self, request: admin_api_pb2.CreateScheduleRequest, incoming: Incoming
    ) -> admin_api_pb2.Schedule:
        return await _answer(self.schedules.create_schedule(request))

    async def list_schedules(
        self, request: admin_api_pb2.ListSchedulesRequest, incoming: Incoming
    ) -> admin_api_pb2.SchedulePage:
        return await _answer(self.schedules.list_schedules(request))

    async def get_schedule(self, request: admin_api_pb2.GetScheduleRequest, incoming: Incoming) -> admin_api_pb2.Schedule:
        return await _answer(self.schedules.get_schedule(request))

    async def replace_schedule(
        self, request: admin_api_pb2.ReplaceScheduleRequest, incoming: Incoming
    ) -> admin_api_pb2.Schedule:
        return await _answer(self.schedules.replace_schedule(request))

    async def delete_schedule(
        self, request: admin_api_pb2.DeleteScheduleRequest, incoming: Incoming
    ) -> admin_api_pb2.NoContent:
        return await _answer(self.schedules.delete_schedule(request))

    async def list_schedule_runs(
        self, request: admin_api_pb2.ListScheduleRunsRequest, incoming: Incoming
    ) -> admin_api_pb2.ScheduleRunPage:
        return await _answer(self.schedules.list_schedule_runs(request))

    async def create_trigger(
        self, request: admin_api_pb2.CreateTriggerRequest, incoming: Incoming
    ) -> admin_api_pb2.Trigger:
        return await _answer(self.triggers.create_trigger(request))

    async def list_triggers(
        self, request: admin_api_pb2.ListTriggersRequest, incoming: Incoming
    ) -> admin_api_pb2.TriggerPage:
        return await _answer(self.triggers.list_triggers(request))

    async def get_trigger(self, request: admin_api_pb2.GetTriggerRequest, incoming: Incoming) -> admin_api_pb2.Trigger:
        return await _answer(self.triggers.get_trigger(request))

    async def replace_trigger(
        self, request: admin_api_pb2.ReplaceTriggerRequest, incoming: Incoming
    ) -> admin_api_pb2.Trigger:
        return await _answer(self.triggers.replace_trigger(request))

    async def delete_trigger(
        self, request: admin_api_pb2.DeleteTriggerRequest, incoming: Incoming
    ) -> admin_api_pb2.NoContent:
        return await _answer(self.triggers.delete_trigger(request))

    async def list_trigger_runs(
        self, request: admin_api_pb2.ListTriggerRunsRequest, incoming: Incoming
    ) -> admin_api_pb2.TriggerRunPage:
        return await _answer(self.triggers.list_trigger_runs(request))

    async def call_trigger(
        self, request: admin_api_pb2.CallTriggerRequest, incoming: Incoming
    ) -> AsyncIterator[admin_api_pb2.TriggerCallFrame]:
        frames = self.triggers.call_trigger(request)
        try:
            # Refusals come before the first frame, as a failed call; a bug there is a 500, not its text.
            first = await frames.__anext__()
        except (BaeError, StopAsyncIteration):
            raise
        except Exception:
            log.exception("request failed")
            raise Internal("internal server error") from None
        yield first
        async for frame in frames:
            yield frame

    async def apply_revocation(
        self, request: session_pb2.Revocation, incoming: Incoming
    ) -> session_pb2.RevocationApplied:
        await self.admin.apply_revocation(request)
        return session_pb2.RevocationApplied()

    # JSON-RPC.

    async def register_driver(
        self, request: client_api_pb2.RegisterDriverRequest, incoming: Incoming
    ) -> client_api_pb2.RegisterDriverReply:
        reply = await self._unary(request, self.live.register_driver, client_api_pb2.RegisterDriverReply)
        if (traceparent := self.spans.traceparent(request.session_id)) is not None:
            incoming.trailers.append((telemetry.SESSION_TRACEPARENT_KEY, traceparent))
        return reply

    async def send_message(
        self, request: client_api_pb2.SendMessageRequest, incoming: Incoming
    ) -> AsyncIterator[client_api_pb2.TurnFrame]:
        async for frame in self._stream(request, self.live.send_message, client_api_pb2.TurnFrame):
            yield frame

    async def compact(
        self, request: client_api_pb2.CompactRequest, incoming: Incoming
    ) -> AsyncIterator[client_api_pb2.CompactionFrame]:
        async for frame in self._stream(request, self.live.compact, client_api_pb2.CompactionFrame):
            yield frame

    async def subscribe(
        self, request: client_api_pb2.SubscribeRequest, incoming: Incoming
    ) -> AsyncIterator[client_api_pb2.SubscriptionFrame]:
        async for frame in self._stream(request, self.live.subscribe, client_api_pb2.SubscriptionFrame):
            yield frame

    async def unsubscribe(
        self, request: client_api_pb2.UnsubscribeRequest, incoming: Incoming
    ) -> client_api_pb2.UnsubscribeReply:
        return await self._unary(request, self.live.unsubscribe, client_api_pb2.UnsubscribeReply)

    async def update_client_tools(
        self, request: client_api_pb2.UpdateClientToolsRequest, incoming: Incoming
    ) -> client_api_pb2.UpdateClientToolsReply:
        return await self._unary(request, self.live.update_client_tools, client_api_pb2.UpdateClientToolsReply)

    async def start_remote_sandbox(
        self, request: client_api_pb2.StartRemoteSandboxRequest, incoming: Incoming
    ) -> client_api_pb2.StartRemoteSandboxReply:
        return await self._unary(
            request, self.sandboxes.start_remote_sandbox, client_api_pb2.StartRemoteSandboxReply
        )

    async def stop_remote_sandbox(
        self, request: client_api_pb2.StopRemoteSandboxRequest, incoming: Incoming
    ) -> client_api_pb2.StopRemoteSandboxReply:
        return await self._unary(request, self.sandboxes.stop_remote_sandbox, client_api_pb2.StopRemoteSandboxReply)

    async def exec_remote_sandbox(
        self, request: client_api_pb2.ExecRemoteSandboxRequest, incoming: Incoming
    ) -> client_api_pb2.ExecRemoteSandboxReply:
        return await self._unary(request, self.sandboxes.exec_remote_sandbox, client_api_pb2.ExecRemoteSandboxReply)

    async def report_local_sandbox(
        self, request: client_api_pb2.ReportLocalSandboxRequest, incoming: Incoming
    ) -> client_api_pb2.ReportLocalSandboxReply:
        return await self._unary(
            request, self.sandboxes.report_local_sandbox, client_api_pb2.ReportLocalSandboxReply
        )

    async def report_local_subagent(
        self, request: client_api_pb2.ReportLocalSubagentRequest, incoming: Incoming
    ) -> client_api_pb2.ReportLocalSubagentReply:
        return await self._unary(request, self.live.report_local_subagent, client_api_pb2.ReportLocalSubagentReply)

    async def cancel_subagent(
        self, request: client_api_pb2.CancelSubagentRequest, incoming: Incoming
    ) -> client_api_pb2.CancelSubagentReply:
        return await self._unary(request, self.live.cancel_subagent, client_api_pb2.CancelSubagentReply)

    async def cancel_turn(
        self, request: client_api_pb2.CancelTurnRequest, incoming: Incoming
    ) -> client_api_pb2.CancelTurnReply:
        return await self._unary(request, self.live.cancel_turn, client_api_pb2.CancelTurnReply)

    # JSON-RPC plumbing: authenticate once (a failure is Unauthenticated: HTTP 401 before
    # any streaming), then map every fault to its error in one place.

    async def _call(self, request: RpcRequest) -> RpcCall[Any]:
        principal, session, profile = await self.auth.session_principal_and_records(
            Credential.of(request.credential), request.session_id
        )
        await self._owned(request.session_id)
        return RpcCall(principal, session, profile, request.params, request.invalid_params)

    async def _owned(self, session_id: str) -> None:
        """Serve the call here only if this replica owns the session (or takes it over); else
        refuse it, before it has any effect, with the owner's address (NotOwner)."""
        await self.ownership.claim(session_id)

    async def _unary(
        self, request: RpcRequest, method: Callable[[RpcCall[Any]], Awaitable[Any]], reply: Callable[..., R]
    ) -> R:
        call = await self._call(request)
        try:
            return reply(result=await method(call))
        except Exception as exc:
            return reply(error=rpc_error(exc, _method_name(method)))

    async def _stream(
        self, request: RpcRequest, method: Callable[[RpcCall[Any]], AsyncIterator[F]], frame: Callable[..., F]
    ) -> AsyncIterator[F]:
        call = await self._call(request)
        yield frame(accepted=True)
        try:
            async for item in method(call):
                yield item
        except Exception as exc:
            yield frame(error=rpc_error(exc, _method_name(method)))


def _method_name(method: Callable[..., Any]) -> str:
    return str(getattr(method, "__name__", None) or getattr(getattr(method, "func", None), "__name__", "rpc"))
