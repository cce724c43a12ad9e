"""Immutable views of stored rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KeyRecord:
    id: str
    name: str
    key_hash: str
    key_prefix: str
    role: str  # client | session | admin
    profile_id: str | None
    client_id: str | None
    created_at: str
    last_used_at: str | None
    deleted_at: str | None


@dataclass(frozen=True)
class ProfileRecord:
    id: str
    name: str
    primary_provider: str
    fallback_providers: list[str]
    mcp_servers: list[str]
    allowed_tools: list[str]
    available_sandboxes: list[str]
    created_at: str
    updated_at: str
    deleted_at: str | None
    # The bae.common.limits keys it overrides; None: the [limits] defaults.
    limits: dict[str, int | float] | None = None
    # {"closed_session_days": N}: overrides [retention] for its sessions; None: the default.
    retention: dict[str, float] | None = None


@dataclass(frozen=True)
class SessionRecord:
    id: str
    client_key_id: str
    profile_id: str
    state: str  # open | closed | error
    client_version: str | None
    # Each keyed by client key id -> that client's declaration list.
    client_tools: dict[str, list[dict[str, Any]]]
    sandbox_tools: dict[str, list[dict[str, Any]]]
    subagent_tools: dict[str, list[dict[str, Any]]]
    # Normalized: {"mode": "auto", "size": N} or {"mode": "client", "prompt": str | None}.
    compaction: dict[str, Any] | None
    created_at: str
    closed_at: str | None


@dataclass(frozen=True)
class Principal:
    """Who a session-key request acts as."""

    key_id: str  # the session key row
    client_key_id: str  # the acting client key
    session_id: str
    profile_id: str | None


@dataclass(frozen=True)
class ScheduleRecord:
    id: str
    name: str
    profile_id: str
    client_key_id: str
    cron: str
    timezone: str
    message: str
    overlap: str  # skip | queue | allow
    catch_up: str  # latest | none
    close_after: bool
    enabled: bool
    checked_through: float  # epoch seconds: the ticks after it are still to fire
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class ScheduleRunRecord:
    id: str
    schedule_id: str
    scheduled_for: str
    fired_at: str
    session_id: str | None
    outcome: str  # running | completed | failed | skipped
    detail: str | None
    replica_id: str


@dataclass(frozen=True)
class TriggerRecord:
    id: str
    name: str
    profile_id: str
    input_schema: str  # JSON text
    message_template: str
    close_after: bool
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class TriggerRunRecord:
    id: str
    trigger_id: str
    fired_at: str
    created_at: float  # epoch seconds: the idempotency window starts here
    session_id: str | None
    outcome: str  # running | completed | failed
    detail: str | None
    idempotency_key: str | None  # NULL once released (the window passed and the key came again)
    released_idempotency_key: str | None
    input_sha256: str
    replica_id: str  # the replica driving the run
    message: str | None  # the call's rendered message, kept while the run runs

    @property
    def shown_idempotency_key(self) -> str | None:
        return self.idempotency_key or self.released_idempotency_key
