"""The tables, as SQLAlchemy Core metadata.

Portable types only (a later issue runs this on PostgreSQL): JSON documents
are TEXT written by `json.dumps`, timestamps are the RFC 3339 strings of
`bae.timefmt` (they sort and compare as text). Every table has an integer
`seq` primary key: it is the insertion order every list is sorted by and the
pagination cursor, while `id` is the public identifier.
"""

from __future__ import annotations

from sqlalchemy import Column, Index, Integer, MetaData, String, Table, Text

metadata = MetaData()

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
    Column("fallback_providers", Text, nullable=False),
    Column("mcp_servers", Text, nullable=False),
    Column("allowed_tools", Text, nullable=False),
    Column("available_sandboxes", Text, nullable=False),
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
    Column("deleted_at", String(32)),
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
    Column("client_tools", Text, nullable=False),
    Column("sandbox_tools", Text, nullable=False),
    Column("subagent_tools", Text, nullable=False),
    Column("compaction", Text),
    Column("created_at", String(32), nullable=False),
    Column("closed_at", String(32)),
)
Index("sessions_state_seq", sessions.c.state, sessions.c.seq)

session_events = Table(
    "session_events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", ID, nullable=False, unique=True),
    Column("session_id", ID, nullable=False),
    Column("client_key_id", ID),
    Column("event_type", String(64), nullable=False),
    Column("payload", Text, nullable=False),
    Column("created_at", String(32), nullable=False),
)
Index("session_events_session_seq", session_events.c.session_id, session_events.c.seq)
