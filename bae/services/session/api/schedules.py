"""The schedules admin API (`/admin/v1/schedules*`, docs/guides/schedules.md). Every handler
authenticates first; the engine's ticker (engine/schedules.py) fires what these write."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from bae.common.errors import InvalidInput, NotFound, Unprocessable, echo
from bae.common.protos import admin_api_pb2, edge_pb2
from bae.common.timefmt import format_time
from bae.services.session.api.auth import Authenticator
from bae.services.session.api.calls import Credential
from bae.services.session.api.pagination import page_request
from bae.services.session.engine.schedule_times import timing
from bae.services.session.store import profiles, schedules
from bae.services.session.store.records import ScheduleRecord, ScheduleRunRecord
from bae.services.session.store.store import Store

MAX_NAME_CHARS = 200
# The user message each run sends: a prompt, not a document.
MAX_MESSAGE_CHARS = 32 * 1024
ID_CHARS = 64


def schedule_message(schedule: ScheduleRecord, *, test_seconds: bool) -> admin_api_pb2.Schedule:
    next_fire_at = None
    if schedule.enabled:
        try:
            when = timing(schedule.cron, schedule.timezone, test_seconds=test_seconds)
        except InvalidInput:
            when = None  # a six-field test expression with the test setting off: it never fires
        if when is not None:
            after = max(time.time(), schedule.checked_through)
            next_fire_at = format_time(when.after(datetime.fromtimestamp(after, timezone.utc)))
    return admin_api_pb2.Schedule(
        id=schedule.id,
        name=schedule.name,
        profile_id=schedule.profile_id,
        client_key_id=schedule.client_key_id,
        cron=schedule.cron,
        timezone=schedule.timezone,
        message=schedule.message,
        overlap=schedule.overlap,
        catch_up=schedule.catch_up,
        close_after=schedule.close_after,
        enabled=schedule.enabled,
        next_fire_at=next_fire_at,
        created_at=schedule.created_at,
        updated_at=schedule.updated_at,
    )


def run_message(run: ScheduleRunRecord) -> admin_api_pb2.ScheduleRun:
    return admin_api_pb2.ScheduleRun(
        run_id=run.id,
        scheduled_for=run.scheduled_for,
        fired_at=run.fired_at,
        session_id=run.session_id,
        outcome=run.outcome,
        detail=run.detail,
    )


def schedule_fields(body: admin_api_pb2.ScheduleBody, *, test_seconds: bool) -> dict[str, Any]:
    """The body's fields with their defaults, every one bounded; InvalidInput (400) says which is not."""
    if len(body.name) > MAX_NAME_CHARS:
        raise InvalidInput(f"name must be at most {MAX_NAME_CHARS} characters")
    if len(body.message) > MAX_MESSAGE_CHARS:
        raise InvalidInput(f"message must be at most {MAX_MESSAGE_CHARS} characters")
    for name in ("profile_id", "client_key_id"):
        if len(getattr(body, name)) > ID_CHARS:
            raise InvalidInput(f"{name} must be at most {ID_CHARS} characters")
    zone = body.timezone if body.HasField("timezone") else "UTC"
    when = timing(body.cron, zone, test_seconds=test_seconds)
    return {
        "name": body.name,
        "profile_id": body.profile_id,
        "client_key_id": body.client_key_id,
        "cron": when.cron,
        "timezone": zone,
        "message": body.message,
        "overlap": body.overlap if body.HasField("overlap") else "skip",
        "catch_up": body.catch_up if body.HasField("catch_up") else "latest",
        "close_after": body.close_after if body.HasField("close_after") else True,
        "enabled": body.enabled if body.HasField("enabled") else True,
    }


class SchedulesApi:
    def __init__(self, *, store: Store, auth: Authenticator, test_seconds: bool) -> None:
        self.store = store
        self.auth = auth
        self.test_seconds = test_seconds  # BAE_SCHEDULE_TEST_SECONDS: six-field expressions too

    async def _admin(self, credential: edge_pb2.Credential) -> None:
        await self.auth.require_admin(Credential.of(credential))

    async def _fields(self, body: admin_api_pb2.ScheduleBody) -> dict[str, Any]:
        """Validated fields whose profile and key can run unattended (422 otherwise)."""
        fields = schedule_fields(body, test_seconds=self.test_seconds)
        profile = await self.store.read(profiles.active, fields["profile_id"])
        if profile is None:
            raise Unprocessable(f"no active profile {echo(fields['profile_id'])}", reason="profile_unavailable")
        if profile.allowed_tools:
            # A run has no client to answer a client tool: its turn would pause for ever.
            raise Unprocessable(
                "the profile allows client tools, which no client answers in a scheduled run; "
                "use a profile whose allowed_tools is empty",
                reason="schedule_profile_has_client_tools",
            )
        key = await self.store.read(schedules.active_client_key, fields["client_key_id"])
        if key is None or key.profile_id != profile.id:
            raise Unprocessable(
                f"client key {echo(fields['client_key_id'])} is not an active client key of profile {echo(profile.id)}",
                reason="schedule_key_not_bound",
            )
        return fields

    def _message(self, schedule: ScheduleRecord) -> admin_api_pb2.Schedule:
        return schedule_message(schedule, test_seconds=self.test_seconds)

    async def create_schedule(self, request: admin_api_pb2.CreateScheduleRequest) -> admin_api_pb2.Schedule:
        await self._admin(request.credential)
        fields = await self._fields(request.body)
        return self._message(await self.store.write(schedules.create, fields, time.time()))

    async def list_schedules(self, request: admin_api_pb2.ListSchedulesRequest) -> admin_api_pb2.SchedulePage:
        await self._admin(request.credential)
        page = page_request(request.cursor, request.limit)
        rows = await self.store.read(schedules.page, page.after_seq, page.fetch)
        items, next_cursor = page.page(rows)
        return admin_api_pb2.SchedulePage(items=[self._message(s) for s in items], next_cursor=next_cursor)

    async def get_schedule(self, request: admin_api_pb2.GetScheduleRequest) -> admin_api_pb2.Schedule:
        await self._admin(request.credential)
        schedule = await self.store.read(schedules.get, request.schedule_id)
        if schedule is None:
            raise NotFound(f"no schedule {echo(request.schedule_id)}")
        return self._message(schedule)

    async def replace_schedule(self, request: admin_api_pb2.ReplaceScheduleRequest) -> admin_api_pb2.Schedule:
        await self._admin(request.credential)
        if await self.store.read(schedules.get, request.schedule_id) is None:
            raise NotFound(f"no schedule {echo(request.schedule_id)}")
        fields = await self._fields(request.body)
        schedule = await self.store.write(schedules.replace, request.schedule_id, fields, time.time())
        if schedule is None:  # deleted meanwhile
            raise NotFound(f"no schedule {echo(request.schedule_id)}")
        return self._message(schedule)

    async def delete_schedule(self, request: admin_api_pb2.DeleteScheduleRequest) -> admin_api_pb2.NoContent:
        await self._admin(request.credential)
        if not await self.store.write(schedules.delete_schedule, request.schedule_id):
            raise NotFound(f"no schedule {echo(request.schedule_id)}")
        return admin_api_pb2.NoContent()

    async def list_schedule_runs(
        self, request: admin_api_pb2.ListScheduleRunsRequest
    ) -> admin_api_pb2.ScheduleRunPage:
        await self._admin(request.credential)
        page = page_request(request.cursor, request.limit)
        if await self.store.read(schedules.get, request.schedule_id) is None:
            raise NotFound(f"no schedule {echo(request.schedule_id)}")
        rows = await self.store.read(schedules.runs_page, request.schedule_id, page.after_seq, page.fetch)
        items, next_cursor = page.page(rows)
        return admin_api_pb2.ScheduleRunPage(items=[run_message(run) for run in items], next_cursor=next_cursor)
