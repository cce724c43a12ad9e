"""The admin API's webhooks (docs/guides/webhooks.md): CRUD, secret rotation and the delivery log.

A URL is checked twice: here, when it is created or replaced (its host resolved, every address
checked against [webhooks] allow_hosts), and by the deliverer before every attempt.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Any

from bae.common.errors import InvalidInput, NotFound, Unprocessable, echo
from bae.common.protos import admin_api_pb2, edge_pb2
from bae.common.timefmt import format_time
from bae.common.webhooks import MAX_EVENT_TYPE_CHARS, MAX_EVENT_TYPES, PREVIOUS_SECRET_SECONDS, RefusedAddress, WebhookSettings, \
    check_addresses, parse_url
from bae.services.session.api.auth import Authenticator
from bae.services.session.api.calls import Credential
from bae.services.session.api.pagination import page_request
from bae.services.session.engine.ports import WebhookTransport
from bae.services.session.engine.webhook_delivery import WebhookDeliverer
from bae.services.session.store import profiles, webhooks
from bae.services.session.store.store import Store
from bae.services.session.store.webhooks import DeliveryRecord, WebhookRecord

# An event type as docs/reference/events.md names them (`server.message.send`), or "*".
_EVENT_TYPE = re.compile(r"\*|[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")


def webhook_message(hook: WebhookRecord) -> admin_api_pb2.Webhook:
    return admin_api_pb2.Webhook(
        id=hook.id, url=hook.url, event_types=hook.event_types, profile_id=hook.profile_id, enabled=hook.enabled,
        created_at=hook.created_at, updated_at=hook.updated_at,
    )


def delivery_message(delivery: DeliveryRecord) -> admin_api_pb2.WebhookDelivery:
    return admin_api_pb2.WebhookDelivery(
        id=delivery.id, webhook_id=delivery.webhook_id, event_id=delivery.event_id, event_type=delivery.event_type,
        state=delivery.state, attempts=delivery.attempts, last_status=delivery.last_status,
        last_error=delivery.last_error, created_at=delivery.created_at, delivered_at=delivery.delivered_at,
        next_attempt_at=None if delivery.next_attempt_at is None or delivery.state != webhooks.PENDING
        else _stamp(delivery.next_attempt_at),
    )


def _stamp(epoch: float) -> str:
    return format_time(datetime.fromtimestamp(epoch, timezone.utc))


class WebhooksApi:
    def __init__(
        self, *, store: Store, auth: Authenticator, transport: WebhookTransport, settings: WebhookSettings,
        deliverer: WebhookDeliverer,
    ) -> None:
        self.store = store
        self.auth = auth
        self.transport = transport
        self.settings = settings
        self.deliverer = deliverer

    async def _admin(self, credential: edge_pb2.Credential) -> None:
        await self.auth.require_admin(Credential.of(credential))

    async def _fields(self, body: admin_api_pb2.WebhookBody) -> dict[str, Any]:
        """The body checked: a URL that may be called, 1 to MAX_EVENT_TYPES event types, an active profile."""
        url = body.url.strip()
        try:
            target = parse_url(url)
        except RefusedAddress as refused:
            raise InvalidInput(str(refused)) from None
        event_types = list(dict.fromkeys(body.event_types))
        if not 1 <= len(event_types) <= MAX_EVENT_TYPES:
            raise InvalidInput(f'event_types must list 1 to {MAX_EVENT_TYPES} event types, or ["*"]')
        for index, event_type in enumerate(event_types):
            if len(event_type) > MAX_EVENT_TYPE_CHARS or not _EVENT_TYPE.fullmatch(event_type):
                raise InvalidInput(f'event_types[{index}] "{echo(event_type)}" is not an event type (e.g. '
                                   'server.message.send) or "*"')
        profile_id = body.profile_id if body.HasField("profile_id") else None
        if profile_id is not None and await self.store.read(profiles.active, profile_id) is None:
            raise Unprocessable(f"no active profile {echo(profile_id)}", reason="profile_unavailable")
        try:
            check_addresses(target, await self.transport.resolve(target.host, target.port), self.settings)
        except RefusedAddress as refused:
            raise InvalidInput(f"url refused: {refused}", reason="webhook_url_refused") from None
        return {
            "url": url, "event_types": event_types, "profile_id": profile_id,
            "enabled": body.enabled if body.HasField("enabled") else True,
        }

    async def create_webhook(self, request: admin_api_pb2.CreateWebhookRequest) -> admin_api_pb2.WebhookCreated:
        await self._admin(request.credential)
        hook, secret = await self.store.write(webhooks.create, await self._fields(request.body))
        return admin_api_pb2.WebhookCreated(
            id=hook.id, url=hook.url, event_types=hook.event_types, profile_id=hook.profile_id, enabled=hook.enabled,
            secret=secret, created_at=hook.created_at, updated_at=hook.updated_at,
        )

    async def list_webhooks(self, request: admin_api_pb2.ListWebhooksRequest) -> admin_api_pb2.WebhookPage:
        await self._admin(request.credential)
        page = page_request(request.cursor, request.limit)
        items, next_cursor = page.page(await self.store.read(webhooks.page, page.after_seq, page.fetch))
        return admin_api_pb2.WebhookPage(items=[webhook_message(hook) for hook in items], next_cursor=next_cursor)

    async def get_webhook(self, request: admin_api_pb2.GetWebhookRequest) -> admin_api_pb2.Webhook:
        await self._admin(request.credential)
        hook = await self.store.read(webhooks.get, request.webhook_id)
        if hook is None:
            raise _no_webhook(request.webhook_id)
        return webhook_message(hook)

    async def replace_webhook(self, request: admin_api_pb2.ReplaceWebhookRequest) -> admin_api_pb2.Webhook:
        await self._admin(request.credential)
        if await self.store.read(webhooks.get, request.webhook_id) is None:
            raise _no_webhook(request.webhook_id)  # before the body's checks: they may resolve a host
        hook = await self.store.write(webhooks.replace, request.webhook_id, await self._fields(request.body))
        if hook is None:
            raise _no_webhook(request.webhook_id)
        return webhook_message(hook)

    async def delete_webhook(self, request: admin_api_pb2.DeleteWebhookRequest) -> admin_api_pb2.NoContent:
        await self._admin(request.credential)
        if not await self.store.write(webhooks.delete_one, request.webhook_id):
            raise _no_webhook(request.webhook_id)
        return admin_api_pb2.NoContent()

    async def rotate_webhook_secret(
        self, request: admin_api_pb2.RotateWebhookSecretRequest
    ) -> admin_api_pb2.WebhookSecret:
        await self._admin(request.credential)
        at = time.time()
        secret = await self.store.write(webhooks.rotate_secret, request.webhook_id, at)
        if secret is None:
            raise _no_webhook(request.webhook_id)
        return admin_api_pb2.WebhookSecret(
            id=request.webhook_id, secret=secret, previous_expires_at=_stamp(at + PREVIOUS_SECRET_SECONDS)
        )

    async def list_webhook_deliveries(
        self, request: admin_api_pb2.ListWebhookDeliveriesRequest
    ) -> admin_api_pb2.WebhookDeliveryPage:
        await self._admin(request.credential)
        page = page_request(request.cursor, request.limit)
        rows = await self.store.read(webhooks.deliveries_page, request.webhook_id, page.after_seq, page.fetch)
        if rows is None:
            raise _no_webhook(request.webhook_id)
        items, next_cursor = page.page(rows)
        return admin_api_pb2.WebhookDeliveryPage(
            items=[delivery_message(delivery) for delivery in items], next_cursor=next_cursor
        )

    async def retry_webhook_delivery(
        self, request: admin_api_pb2.RetryWebhookDeliveryRequest
    ) -> admin_api_pb2.WebhookDelivery:
        await self._admin(request.credential)
        delivery = await self.store.write(webhooks.retry, request.webhook_id, request.delivery_id, time.time())
        if delivery is None:
            raise NotFound(f"no delivery {echo(request.delivery_id)} of webhook {echo(request.webhook_id)}")
        self.deliverer.wake()
        return delivery_message(delivery)


def _no_webhook(webhook_id: str) -> NotFound:
    return NotFound(f"no webhook {echo(webhook_id)}")
