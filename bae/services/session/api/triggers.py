"""HTTP triggers (docs/guides/triggers.md): the admin API (`/admin/v1/triggers*`) and the call on
the client port (`POST /api/v1/triggers/{name}`). Every handler authenticates first; the engine
(engine/triggers.py) opens and drives what a call starts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from typing import Any, AsyncIterator

import jsonschema
import referencing.exceptions
from jsonschema.exceptions import best_match

from bae.common.errors import Forbidden, InvalidInput, NotFound, Unprocessable, echo
from bae.common.jsontext import load
from bae.common.protos import admin_api_pb2, client_api_pb2, edge_pb2
from bae.services.session.api.auth import Authenticator
from bae.services.session.api.calls import Credential
from bae.services.session.api.faults import rpc_error
from bae.services.session.api.live import result_frames, stream_until_done
from bae.services.session.api.pagination import page_request
from bae.services.session.engine import trigger_template
from bae.services.session.engine.feed import Watcher
from bae.services.session.engine.triggers import TriggerRuns
from bae.services.session.store import profiles, triggers
from bae.services.session.store.records import TriggerRecord, TriggerRunRecord
from bae.services.session.store.store import Store
from bae.services.session.store.triggers import Call, Repeated

# A trigger's name is its URL's last segment: nothing there needs escaping.
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,100}")
ID_CHARS = 64
# A schema describes a call's body; one this large is a mistake, and each call validates against it.
MAX_SCHEMA_CHARS = 64 * 1024
# The rendered message is a prompt, not a document; the input's values add to it.
MAX_TEMPLATE_CHARS = 32 * 1024
# Idempotency-Key: visible ASCII, as an HTTP header value without surprises, and bounded.
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,200}")
# A repeated key within this window answers the first call's answer.
IDEMPOTENCY_WINDOW = 24 * 3600.0
# The validator's message in a 400 is cut: it quotes the input, which may be large.
MAX_INPUT_ERROR_CHARS = 200
WAIT_METHOD = "session.sendMessage"  # a waiting call's stream is that method's, errors included

INVALID_INPUT = "invalid_trigger_input"
Validator = jsonschema.Draft202012Validator


def trigger_message(trigger: TriggerRecord) -> admin_api_pb2.Trigger:
    return admin_api_pb2.Trigger(
        id=trigger.id,
        name=trigger.name,
        profile_id=trigger.profile_id,
        input_schema=edge_pb2.JsonValue(json=trigger.input_schema),
        message_template=trigger.message_template,
        close_after=trigger.close_after,
        created_at=trigger.created_at,
        updated_at=trigger.updated_at,
    )


def run_message(run: TriggerRunRecord) -> admin_api_pb2.TriggerRun:
    return admin_api_pb2.TriggerRun(
        run_id=run.id,
        fired_at=run.fired_at,
        session_id=run.session_id,
        outcome=run.outcome,
        detail=run.detail,
        idempotency_key=run.shown_idempotency_key,
    )


def trigger_fields(body: admin_api_pb2.TriggerBody) -> dict[str, Any]:
    """The body's fields with their defaults, each bounded and checked; InvalidInput (400) says
    which is not: the name, the schema (draft 2020-12), the template and its placeholders, every
    one a property the schema declares."""
    if not NAME_PATTERN.fullmatch(body.name):
        raise InvalidInput("name must be 1 to 100 letters, digits, '.', '_' or '-'")
    if len(body.profile_id) > ID_CHARS:
        raise InvalidInput(f"profile_id must be at most {ID_CHARS} characters")
    if len(body.input_schema.json) > MAX_SCHEMA_CHARS:
        raise InvalidInput(f"input_schema must be at most {MAX_SCHEMA_CHARS} characters of JSON")
    if len(body.message_template) > MAX_TEMPLATE_CHARS:
        raise InvalidInput(f"message_template must be at most {MAX_TEMPLATE_CHARS} characters")
    schema = load(body.input_schema.json)
    if not isinstance(schema, dict):  # the gateway's reading refuses it; a direct call may not
        raise InvalidInput("input_schema must be a JSON object (a JSON Schema)")
    try:
        Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidInput(f"input_schema is not a valid JSON Schema (draft 2020-12): {_cut(exc.message)}") from None
    declared = schema.get("properties")
    declared = declared if isinstance(declared, dict) else {}
    for name in trigger_template.fields(trigger_template.parse(body.message_template)):
        if name not in declared:
            raise InvalidInput(
                f"message_template's placeholder {{{name}}} is not a property of input_schema "
                "(declare it under \"properties\")"
            )
    return {
        "name": body.name,
        "profile_id": body.profile_id,
        "input_schema": body.input_schema.json,
        "message_template": body.message_template,
        "close_after": body.close_after if body.HasField("close_after") else True,
    }


def _cut(text: str) -> str:
    return text if len(text) <= MAX_INPUT_ERROR_CHARS else text[: MAX_INPUT_ERROR_CHARS - 1] + "…"


def input_digest(value: Any) -> str:
    """What tells a repeated call's body from another: its JSON in one canonical form (keys sorted,
    no spaces), so a retry that re-serializes the same value is the same body."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def rendered_message(trigger: TriggerRecord, value: Any) -> str:
    """The call's message; 400 invalid_trigger_input when the input fails the schema or lacks a
    placeholder's value, 422 when the trigger's own schema cannot be used."""
    validator = Validator(load(trigger.input_schema))
    try:
        error = best_match(validator.iter_errors(value))
    except referencing.exceptions.Unresolvable as exc:
        # No retrieval of remote $refs (jsonschema fetches none by default): a trigger problem.
        raise Unprocessable(
            f"the trigger's input_schema has a $ref that does not resolve: {_cut(str(exc))}",
            reason="trigger_schema_unresolvable",
        ) from None
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path)
        raise InvalidInput(_cut(f"input{'/' + where if where else ''}: {error.message}"), reason=INVALID_INPUT)
    try:
        return trigger_template.render(trigger_template.parse(trigger.message_template), value)
    except trigger_template.MissingValue as missing:
        raise InvalidInput(
            f"input has no value for the message's placeholder {{{missing.name}}}", reason=INVALID_INPUT
        ) from None


def idempotency_key_of(request: admin_api_pb2.CallTriggerRequest) -> str | None:
    if not request.HasField("idempotency_key"):
        return None
    if not IDEMPOTENCY_KEY.fullmatch(request.idempotency_key):
        raise InvalidInput("the Idempotency-Key header must be 1 to 200 visible ASCII characters")
    return request.idempotency_key


class TriggersApi:
    def __init__(self, *, store: Store, auth: Authenticator, runs: TriggerRuns) -> None:
        self.store = store
        self.auth = auth
        self.runs = runs

    async def _admin(self, credential: edge_pb2.Credential) -> None:
        await self.auth.require_admin(Credential.of(credential))

    async def _fields(self, body: admin_api_pb2.TriggerBody) -> dict[str, Any]:
        """Validated fields whose profile can run unattended (422 otherwise)."""
        fields = trigger_fields(body)
        profile = await self.store.read(profiles.active, fields["profile_id"])
        if profile is None:
            raise Unprocessable(f"no active profile {echo(fields['profile_id'])}", reason="profile_unavailable")
        if profile.allowed_tools:
            # A call's turn has no client to answer a client tool: it would pause for ever.
            raise Unprocessable(
                "the profile allows client tools, which no client answers in a trigger's session; "
                "use a profile whose allowed_tools is empty",
                reason="trigger_profile_has_client_tools",
            )
        return fields

    async def _trigger(self, trigger_id: str) -> TriggerRecord:
        trigger = await self.store.read(triggers.get, trigger_id)
        if trigger is None:
            raise NotFound(f"no trigger {echo(trigger_id)}")
        return trigger

    async def create_trigger(self, request: admin_api_pb2.CreateTriggerRequest) -> admin_api_pb2.Trigger:
        await self._admin(request.credential)
        fields = await self._fields(request.body)
        return trigger_message(await self.store.write(triggers.create, fields))

    async def list_triggers(self, request: admin_api_pb2.ListTriggersRequest) -> admin_api_pb2.TriggerPage:
        await self._admin(request.credential)
        page = page_request(request.cursor, request.limit)
        rows = await self.store.read(triggers.page, page.after_seq, page.fetch)
        items, next_cursor = page.page(rows)
        return admin_api_pb2.TriggerPage(items=[trigger_message(t) for t in items], next_cursor=next_cursor)

    async def get_trigger(self, request: admin_api_pb2.GetTriggerRequest) -> admin_api_pb2.Trigger:
        await self._admin(request.credential)
        return trigger_message(await self._trigger(request.trigger_id))

    async def replace_trigger(self, request: admin_api_pb2.ReplaceTriggerRequest) -> admin_api_pb2.Trigger:
        await self._admin(request.credential)
        await self._trigger(request.trigger_id)
        fields = await self._fields(request.body)
        trigger = await self.store.write(triggers.replace, request.trigger_id, fields)
        if trigger is None:  # deleted meanwhile
            raise NotFound(f"no trigger {echo(request.trigger_id)}")
        return trigger_message(trigger)

    async def delete_trigger(self, request: admin_api_pb2.DeleteTriggerRequest) -> admin_api_pb2.NoContent:
        await self._admin(request.credential)
        if not await self.store.write(triggers.delete_trigger, request.trigger_id):
            raise NotFound(f"no trigger {echo(request.trigger_id)}")
        return admin_api_pb2.NoContent()

    async def list_trigger_runs(self, request: admin_api_pb2.ListTriggerRunsRequest) -> admin_api_pb2.TriggerRunPage:
        await self._admin(request.credential)
        page = page_request(request.cursor, request.limit)
        await self._trigger(request.trigger_id)
        rows = await self.store.read(triggers.runs_page, request.trigger_id, page.after_seq, page.fetch)
        items, next_cursor = page.page(rows)
        return admin_api_pb2.TriggerRunPage(items=[run_message(run) for run in items], next_cursor=next_cursor)

    async def call_trigger(self, request: admin_api_pb2.CallTriggerRequest) -> AsyncIterator[admin_api_pb2.TriggerCallFrame]:
        """The answer once the session exists and its turn is queued; then, for a call that waits,
        the turn's frames as session.sendMessage streams them. Every refusal comes before the answer.
        A repeated Idempotency-Key answers the first call's answer alone, waiting or not: its turn
        is not this call's to stream."""
        key = await self.auth.client_key(Credential.of(request.credential))
        # A name no trigger can have is not looked up (a path segment may be long).
        trigger = await self.store.read(triggers.by_name, request.trigger_name) if NAME_PATTERN.fullmatch(
            request.trigger_name) else None
        if trigger is None:
            raise NotFound(f"no trigger {echo(request.trigger_name)}")
        if key.profile_id != trigger.profile_id:
            raise Forbidden(
                f"the client key is bound to profile {echo(key.profile_id or '')}, and trigger "
                f"{echo(trigger.name)} runs profile {echo(trigger.profile_id)}: call it with a key of that profile",
                reason="trigger_profile_mismatch",
            )
        if request.wait not in ("", "true", "false"):
            raise InvalidInput('wait must be "true" or "false"')
        idempotency_key = idempotency_key_of(request)
        if not request.input.json:  # the gateway sends the body's JSON; a call without one has none
            raise InvalidInput("the request body must be a JSON value", reason=INVALID_INPUT)
        value = load(request.input.json)
        message = rendered_message(trigger, value)
        call = Call(trigger.id, idempotency_key, input_digest(value), message, time.time(), IDEMPOTENCY_WINDOW)
        started = await self.runs.open(trigger, key, call)
        run = started.run
        answer = admin_api_pb2.TriggerCalled(trigger_run_id=run.id, session_id=run.session_id or "")
        if isinstance(started, Repeated):
            yield admin_api_pb2.TriggerCallFrame(answer=answer)
            return
        watcher = Watcher(key=key.id, deltas=False) if request.wait == "true" else None
        turn = self.runs.run(trigger, run, key.id, watcher)
        yield admin_api_pb2.TriggerCallFrame(answer=answer)
        if watcher is None:
            return
        async for frame in self._turn_frames(watcher, turn):
            yield admin_api_pb2.TriggerCallFrame(turn=frame)

    async def _turn_frames(
        self, watcher: Watcher, turn: asyncio.Task[Any]
    ) -> AsyncIterator[client_api_pb2.TurnFrame]:
        """The turn's stream as session.sendMessage's: accepted, its events, the terminal result (or
        the error frame). A caller that goes away stops only this: the turn runs on (shielded)."""
        yield client_api_pb2.TurnFrame(accepted=True)
        try:
            async for frame in stream_until_done(watcher, asyncio.shield(turn), client_api_pb2.TurnFrame):
                yield frame
            if watcher.cut_off:
                return  # lagged: the stream ends here, as sendMessage's does
            for frame in result_frames(await turn):
                yield frame
        except Exception as exc:
            yield client_api_pb2.TurnFrame(error=rpc_error(exc, WAIT_METHOD))
