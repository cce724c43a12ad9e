"""The tables, as SQLAlchemy Core metadata.

The store runs on SQLite and PostgreSQL, so types are portable: JSON documents
are TEXT (the JsonText type below), timestamps are the RFC 3339 strings of
`bae.common.timefmt` (they sort and compare as text). Every table has an integer
`seq` primary key: it is the insertion order every list is sorted by and the
pagination cursor, while `id` is the public identifier. A change here is also a
new revision in migrations/versions/.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger, Boolean, Column, ColumnElement, Connection, Dialect, Float, Index, Integer, LargeBinary, MetaData,
    String, Table, Text, UniqueConstraint, cast, func,
)
from sqlalchemy.types import TypeDecorator

from bae.common.jsontext import dump, load

metadata = MetaData()


class JsonText(TypeDecorator[Any]):
    """A JSON document stored as TEXT: written with `bae.common.jsontext.dump`, read back parsed.

    The DDL is plain TEXT (what revision 0001 creates), so this changes no schema.
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else dump(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> Any:
        return load(value)


def utf8_bytes(conn: Connection, column: ColumnElement[str]) -> ColumnElement[int]:
    """The bytes a TEXT column's value takes in UTF-8, in the connection's dialect."""
    if conn.dialect.name == "postgresql":
        return func.octet_length(column)
    return func.length(cast(column, LargeBinary))


ID = String(64)

keys = Table(
    "keys",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", ID, nullable=False, unique=True),
    Column("name", Text, nullable=False),  # session keys: their session id
    # SHA-256 hex of the plaintext (or, for a pre-provisioned admin row, a PHC string).
    Column("key_hash", Text, nullable=False, unique=True),
    Column("key_prefix", String(32), nullable=False),
    Column("role", String(16), nullable=False),
    Column("profile_id", ID),
    Column("client_id", ID),  # session keys: the client key they were minted for
    Column("created_at", String(32), nullable=False),
    Column("last_used_at", String(32)),
    Column("deleted_at", String(32)),
)
Index("keys_role_name", keys.c.role, keys.c.name)
Index("keys_client_id", keys.c.client_id)
Index("keys_profile_id", keys.c.profile_id)

profiles = Table(
    "profiles",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", ID, nullable=False, unique=True),
    Column("name", Text, nullable=False, unique=True),  # unique across deleted rows too
    Column("primary_provider", Text, nullable=False),
    Column("fallback_providers", JsonText, nullable=False),
    Column("mcp_servers", JsonText, nullable=False),
    Column("allowed_tools", JsonText, nullable=False),
    Column("available_sandboxes", JsonText, nullable=False),
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
    Column("deleted_at", String(32)),
    # The keys of bae.common.limits this profile overrides; NULL: the [limits] defaults.
    Column("limits", JsonText),
    # {"closed_session_days": N} overriding [retention] for this profile's sessions; NULL: the default.
    Column("retention", JsonText),
)

sessions = Table(
    "sessions",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", ID, nullable=False, unique=True),
    Column("client_key_id", ID, nullable=False),
    Column("profile_id", ID, nullable=False),
    Column("state", String(16), nullable=False),
    Column("client_version", Text),
    Column("client_tools", JsonText, nullable=False),
    Column("sandbox_tools", JsonText, nullable=False),
    Column("subagent_tools", JsonText, nullable=False),
    Column("compaction", JsonText),
    Column("created_at", String(32), nullable=False),
    Column("closed_at", String(32)),
)
Index("sessions_state_seq", sessions.c.state, sessions.c.seq)
Index("sessions_key_state", sessions.c.client_key_id, sessions.c.state)
# The retention sweep's search: closed and error sessions by when they ended (revision 0007).
Index("sessions_state_closed_at", sessions.c.state, sessions.c.closed_at)
# The admin list's filters (revision 0013): a profile's or a key's sessions in seq order, the page's
# order, and a range of creation times.
Index("sessions_profile_seq", sessions.c.profile_id, sessions.c.seq)
Index("sessions_key_seq", sessions.c.client_key_id, sessions.c.seq)
Index("sessions_created_at", sessions.c.created_at)

session_events = Table(
    "session_events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", ID, nullable=False, unique=True),
    Column("session_id", ID, nullable=False),
    # 1, 2, … within the session: the database refuses a second event at a number (revision 0002).
    Column("session_seq", Integer, nullable=False),
    Column("client_key_id", ID),
    Column("event_type", String(64), nullable=False),
    # Raw TEXT, not JsonText: an event's stored text is spliced into frames and pages as it is
    # (events.EventView), and a payload is parsed only where this service reads it.
    Column("payload", Text, nullable=False),
    Column("created_at", String(32), nullable=False),
    # A provider.request stored by reference (store/requests.py): where its `messages` array was cut
    # out of `payload`, and the ordinals of request_messages it held, as JSON [[first, last], ...].
    # NULL for every other event, and for a request stored whole.
    Column("messages_at", Integer),
    Column("messages_runs", Text),
)
Index("session_events_session_seq", session_events.c.session_id, session_events.c.seq)
Index("session_events_session_order", session_events.c.session_id, session_events.c.session_seq, unique=True)

# The message texts of a session's provider requests, each stored once (store/requests.py).
request_messages = Table(
    "request_messages",
    metadata,
    Column("session_id", ID, primary_key=True),
    Column("ordinal", Integer, primary_key=True, autoincrement=False),  # 1, 2, ... within the session, in the order first stored
    Column("text", Text, nullable=False),
)

# Session ownership across replicas (see bae/services/session/ownership.py). A replica's row is its
# heartbeat: every lease it holds is valid while `expires_at` (epoch seconds) lies ahead.
replicas = Table(
    "replicas",
    metadata,
    Column("id", ID, primary_key=True),
    Column("address", Text, nullable=False),  # host:port other replicas and gateways reach it at
    Column("started_at", String(32), nullable=False),
    Column("expires_at", Float, nullable=False),
)

session_leases = Table(
    "session_leases",
    metadata,
    Column("session_id", ID, primary_key=True),
    Column("replica_id", ID, nullable=False),
    # Bumped at every change of owner: a takeover is a compare-and-swap on it.
    Column("epoch", Integer, nullable=False),
)
Index("session_leases_replica", session_leases.c.replica_id)

# Periodic work one replica at a time does for all of them ("reconcile", "retention-sweep"): the holder of a duty's
# row runs it until `expires_at` (epoch seconds); taking or renewing it is a compare-and-swap.
duty_leases = Table(
    "duty_leases",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("replica_id", ID, nullable=False),
    Column("expires_at", Float, nullable=False),
)

# The sessions that hold a sandbox (started or starting), by the client key that created the
# session: a key's count here is what max_sandboxes_per_key bounds, the same for every replica.
sandbox_slots = Table(
    "sandbox_slots",
    metadata,
    Column("session_id", ID, primary_key=True),
    Column("client_key_id", ID, nullable=False),
    Column("created_at", String(32), nullable=False),
)
Index("sandbox_slots_key", sandbox_slots.c.client_key_id)

# Usage accounting (store/usage.py): what a session's provider responses used, per UTC day and
# acting client key, with the session's profile. Each response adds to its row in the transaction
# that records it; reads sum rows (a session's, a key's day, the admin's groups).
usage_totals = Table(
    "usage_totals",
    metadata,
    Column("session_id", ID, primary_key=True),
    Column("day", String(10), primary_key=True),  # UTC, YYYY-MM-DD
    Column("client_key_id", ID, primary_key=True),
    Column("profile_id", ID, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("cache_read_input_tokens", BigInteger, nullable=False),
    Column("cache_creation_input_tokens", BigInteger, nullable=False),
    Column("provider_calls", BigInteger, nullable=False),
    Column("turns", BigInteger, nullable=False),
    # In billionths of a US dollar, so sums are exact; NULL while no response counted here had a price.
    Column("cost_nanousd", BigInteger),
)
Index("usage_totals_key_day", usage_totals.c.client_key_id, usage_totals.c.day)
Index("usage_totals_profile_day", usage_totals.c.profile_id, usage_totals.c.day)
Index("usage_totals_day", usage_totals.c.day)

# Schedules (store/schedules.py): a cron expression that opens a session and sends one message per tick.
# `checked_through` (epoch seconds) is how far the ticker has looked: ticks after it are still to fire.
schedules = Table(
    "schedules",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", ID, nullable=False, unique=True),
    Column("name", Text, nullable=False),
    Column("profile_id", ID, nullable=False),
    Column("client_key_id", ID, nullable=False),
    Column("cron", Text, nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("message", Text, nullable=False),
    Column("overlap", String(16), nullable=False),  # skip | queue | allow
    Column("catch_up", String(16), nullable=False),  # latest | none
    Column("close_after", Boolean, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("checked_through", Float, nullable=False),
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
)

# One row per tick that fired or was skipped. The unique tick is what makes a tick fire once across
# replicas: the replica whose insert succeeds fires it. `replica_id` is the replica driving the run
# while it is `running`; another takes it over when that one stops beating (engine/schedules.py).
schedule_runs = Table(
    "schedule_runs",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", ID, nullable=False, unique=True),
    Column("schedule_id", ID, nullable=False),
    Column("scheduled_for", String(32), nullable=False),
    Column("fired_at", String(32), nullable=False),
    Column("session_id", ID),
    Column("outcome", String(16), nullable=False),  # running | completed | failed | skipped
    Column("detail", Text),
    Column("replica_id", ID, nullable=False),
    UniqueConstraint("schedule_id", "scheduled_for", name="schedule_runs_tick"),
)
Index("schedule_runs_outcome", schedule_runs.c.outcome)

# HTTP triggers (store/triggers.py): a named call on the client port that validates its JSON body
# against `input_schema` (JSON text), renders `message_template` and opens a session with it.
triggers = Table(
    "triggers",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", ID, nullable=False, unique=True),
    Column("name", String(100), nullable=False, unique=True),
    Column("profile_id", ID, nullable=False),
    Column("input_schema", Text, nullable=False),
    Column("message_template", Text, nullable=False),
    Column("close_after", Boolean, nullable=False),
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
)

# One row per accepted call, inserted in the transaction that opens its session. The unique
# (trigger_id, idempotency_key) is what makes concurrent calls with one key start one run; a key
# older than the idempotency window is released (moved to `released_idempotency_key`) when it
# comes again. `created_at` (epoch seconds) dates that window; `input_sha256` tells a repeat
# from a reuse with another body.
trigger_runs = Table(
    "trigger_runs",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", ID, nullable=False, unique=True),
    Column("trigger_id", ID, nullable=False),
    Column("fired_at", String(32), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("session_id", ID),
    Column("outcome", String(16), nullable=False),  # running | completed | failed
    Column("detail", Text),
    Column("idempotency_key", String(200)),
    Column("released_idempotency_key", String(200)),
    Column("input_sha256", String(64), nullable=False),
    Column("replica_id", ID, nullable=False),  # the replica driving the run (engine/triggers.py)
    Column("message", Text),  # the rendered message, kept while the run runs: a resumed run sends it
    UniqueConstraint("trigger_id", "idempotency_key", name="trigger_runs_idempotency"),
)
Index("trigger_runs_trigger", trigger_runs.c.trigger_id, trigger_runs.c.seq)
Index("trigger_runs_outcome", trigger_runs.c.outcome, trigger_runs.c.seq)

# Webhooks (store/webhooks.py). `secret` signs deliveries, so it is stored as it is (a digest would not
# sign); it is returned once, by create and rotate-secret, and never logged. A rotated secret stays in
# `previous_secret` until `previous_expires_at` (epoch seconds): deliveries are signed with both meanwhile.
webhooks = Table(
    "webhooks",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", ID, nullable=False, unique=True),
    Column("url", Text, nullable=False),
    Column("event_types", JsonText, nullable=False),  # a list of event types, or ["*"]
    Column("profile_id", ID),  # NULL: events of every profile's sessions
    Column("enabled", Boolean, nullable=False),
    Column("secret", Text, nullable=False),
    Column("previous_secret", Text),
    Column("previous_expires_at", Float),
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
)

# The outbox: one row per (webhook, event) to deliver, written in the transaction that appends the event
# (events.append), so a crash neither loses nor invents one. `id` is the `webhook-id` of every attempt.
# A row is due while `state` is pending and `next_attempt_at` (epoch seconds) has passed; a deliverer
# claims it by moving `next_attempt_at` past its attempt, so a deliverer killed mid-attempt leaves it
# due again once that claim runs out.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", ID, nullable=False, unique=True),
    Column("webhook_id", ID, nullable=False),
    Column("event_id", ID, nullable=False),
    Column("event_type", String(64), nullable=False),
    Column("state", String(16), nullable=False),  # pending | delivered | failed
    Column("attempts", Integer, nullable=False),
    Column("last_status", Integer),  # the receiver's HTTP status; NULL: no answer (last_error says why)
    Column("last_error", Text),
    Column("next_attempt_at", Float),
    # The replica (its id) whose claim `next_attempt_at` is while it attempts; NULL otherwise. A replica
    # that starts again releases its previous process's claims at once instead of waiting them out.
    Column("claimed_by", ID),
    Column("created_at", String(32), nullable=False),
    Column("delivered_at", String(32)),
)
Index("webhook_deliveries_due", webhook_deliveries.c.state, webhook_deliveries.c.next_attempt_at)
Index("webhook_deliveries_webhook", webhook_deliveries.c.webhook_id, webhook_deliveries.c.seq)
# Events owed to webhooks, as their transaction queued them: one row per event, naming the webhooks it
# matched (comma-separated ids); the deliverer turns each into its webhook_deliveries rows. A row here
# costs a turn one insert into one b-tree, where a delivery row costs one per (event, webhook) into four.
webhook_outbox = Table(
    "webhook_outbox",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("event_id", ID, nullable=False),
    Column("event_type", String(64), nullable=False),
    Column("webhook_ids", Text, nullable=False),
    Column("queued_at", Float, nullable=False),  # epoch seconds: when its deliveries are first due
)

# The web console's sign-in (store/console.py, docs/console.md). A row is known by the SHA-256 digest of
# its token (the `bae_console` cookie's value, or a sign-in link's), never the token. `admin_key_id`: the
# admin key it was signed in with, which must still be active (NULL while admin auth is disabled).
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("admin_key_id", ID),
    Column("created_at", String(32), nullable=False),
    Column("expires_at", String(32), nullable=False),
)
Index("console_sessions_expires", console_sessions.c.expires_at)
console_links = Table(
    "console_links",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("admin_key_id", ID),
    Column("created_at", String(32), nullable=False),
    Column("expires_at", String(32), nullable=False),
    Column("used_at", String(32)),  # set by the one exchange it allows
)
Index("console_links_expires", console_links.c.expires_at)
