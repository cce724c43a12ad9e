"""Profile rows (SERVER-SPEC §4.2). Names stay reserved after a soft delete."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import Connection, Row, and_, bindparam, exists, insert, select, update

from bae.common.errors import Conflict
from bae.common.ids import new_id
from bae.common.timefmt import now
from bae.services.session.store.records import ProfileRecord
from bae.services.session.store import keys
from bae.services.session.store.schema import profiles

LIST_FIELDS = ("fallback_providers", "mcp_servers", "allowed_tools", "available_sandboxes")

_ACTIVE_BY_ID = select(profiles).where(
    and_(profiles.c.id == bindparam("id"), profiles.c.deleted_at.is_(None))
)
_ACTIVE_PAGE = (
    select(profiles)
    .where(and_(profiles.c.deleted_at.is_(None), profiles.c.seq > bindparam("after")))
    .order_by(profiles.c.seq)
    .limit(bindparam("limit"))
)


class DuplicateName(Conflict):
    """Another profile row (deleted or not) already has this name."""

    def __init__(self, name: str) -> None:
        super().__init__("a profile with that name already exists", reason="duplicate_name")
        self.name = name


def record(row: Row[Any]) -> ProfileRecord:
    return ProfileRecord(
        id=row.id,
        name=row.name,
        primary_provider=row.primary_provider,
        fallback_providers=row.fallback_providers,
        mcp_servers=row.mcp_servers,
        allowed_tools=row.allowed_tools,
        available_sandboxes=row.available_sandboxes,
        created_at=row.created_at,
        updated_at=row.updated_at,
        deleted_at=row.deleted_at,
        limits=row.limits,
        retention=row.retention,
    )


def view(profile: ProfileRecord) -> dict[str, Any]:
    """The admin API's profile object."""
    return {
        "id": profile.id,
        "name": profile.name,
        "primary_provider": profile.primary_provider,
        "fallback_providers": profile.fallback_providers,
        "mcp_servers": profile.mcp_servers,
        "allowed_tools": profile.allowed_tools,
        "available_sandboxes": profile.available_sandboxes,
        "limits": profile.limits,
        "retention": profile.retention,
        "created_at": profile.created_at,
        "updated_at": profile.updated_at,
    }


def active(conn: Connection, profile_id: str) -> ProfileRecord | None:
    row = conn.execute(_ACTIVE_BY_ID, {"id": profile_id}).first()
    return None if row is None else record(row)


def _name_taken(conn: Connection, name: str, other_than: str | None = None) -> bool:
    condition = profiles.c.name == name
    if other_than is not None:
        condition = and_(condition, profiles.c.id != other_than)
    return bool(conn.execute(select(exists().where(condition))).scalar())


def create(conn: Connection, fields: dict[str, Any]) -> ProfileRecord:
    """Insert a profile from validated fields (name, primary_provider, the LIST_FIELDS and, optionally,
    `limits` and `retention`)."""
    if _name_taken(conn, fields["name"]):
        raise DuplicateName(fields["name"])
    stamp = now()
    row = {
        "id": new_id("pro_"),
        "name": fields["name"],
        "primary_provider": fields["primary_provider"],
        **{name: fields[name] for name in LIST_FIELDS},
        "limits": fields.get("limits"),
        "retention": fields.get("retention"),
        "created_at": stamp,
        "updated_at": stamp,
        "deleted_at": None,
    }
    conn.execute(insert(profiles), row)
    return ProfileRecord(**row)


def replace(conn: Connection, profile_id: str, fields: dict[str, Any]) -> ProfileRecord | None:
    """Full replacement of an active profile; None if there is none."""
    current = active(conn, profile_id)
    if current is None:
        return None
    if _name_taken(conn, fields["name"], other_than=profile_id):
        raise DuplicateName(fields["name"])
    stamp = now()
    conn.execute(
        update(profiles)
        .where(profiles.c.id == profile_id)
        .values(
            name=fields["name"],
            primary_provider=fields["primary_provider"],
            updated_at=stamp,
            limits=fields.get("limits"),
            retention=fields.get("retention"),
            **{name: fields[name] for name in LIST_FIELDS},
        )
    )
    return dataclasses.replace(current, **{"limits": None, "retention": None, **fields}, updated_at=stamp)


def soft_delete(conn: Connection, profile_id: str) -> None:
    conn.execute(update(profiles).where(profiles.c.id == profile_id).values(deleted_at=now()))


def delete_unused(conn: Connection, profile_id: str) -> int | None:
    """Soft-delete an active profile no active client key uses. None: no such active profile;
    otherwise the number of active client keys that use it (0: it was deleted)."""
    if active(conn, profile_id) is None:
        return None
    in_use = keys.active_client_count(conn, profile_id)
    if not in_use:
        soft_delete(conn, profile_id)
    return in_use


def page(conn: Connection, after_seq: int, limit: int) -> list[tuple[int, ProfileRecord]]:
    rows = conn.execute(_ACTIVE_PAGE, {"after": after_seq, "limit": limit})
    return [(row.seq, record(row)) for row in rows]


def all_active(conn: Connection) -> list[ProfileRecord]:
    """Every non-deleted profile, in insertion order (start-up image provisioning)."""
    rows = conn.execute(select(profiles).where(profiles.c.deleted_at.is_(None)).order_by(profiles.c.seq))
    return [record(row) for row in rows]
