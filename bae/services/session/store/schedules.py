"""Schedule rows and their runs (engine/schedules.py fires them; api/schedules.py serves them).

A run row is inserted before its tick fires, and UNIQUE(schedule_id, scheduled_for) refuses a
second one: of the replicas that find a tick due, the one whose insert succeeds fires it.
"""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Row, and_, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from bae.common.ids import new_id
from bae.common.timefmt import now
from bae.services.session.store import keys, opening
from bae.services.session.store.records import KeyRecord, ScheduleRecord, ScheduleRunRecord
from bae.services.session.store.schema import keys as key_rows
from bae.services.session.store.schema import schedule_runs, schedules

# Fields a POST or PUT sets (the rest are the row's own: id, checked_through, timestamps).
BODY_FIELDS = (
    "name", "profile_id", "client_key_id", "cron", "timezone", "message", "overlap", "catch_up", "close_after",
    "enabled",
)


class Outcome(StrEnum):
    """A run's outcome, as stored and as the API writes it."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"


def record(row: Row[Any]) -> ScheduleRecord:
    return ScheduleRecord(
        id=row.id,
        name=row.name,
        profile_id=row.profile_id,
        client_key_id=row.client_key_id,
        cron=row.cron,
        timezone=row.timezone,
        message=row.message,
        overlap=row.overlap,
        catch_up=row.catch_up,
        close_after=bool(row.close_after),
        enabled=bool(row.enabled),
        checked_through=row.checked_through,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def run_record(row: Row[Any]) -> ScheduleRunRecord:
    return ScheduleRunRecord(
        id=row.id,
        schedule_id=row.schedule_id,
        scheduled_for=row.scheduled_for,
        fired_at=row.fired_at,
        session_id=row.session_id,
        outcome=row.outcome,
        detail=row.detail,
        replica_id=row.replica_id,
    )


def active_client_key(conn: Connection, key_id: str) -> KeyRecord | None:
    """The client key a schedule acts as, if it is active (not revoked)."""
    row = conn.execute(
        select(key_rows)
        .where(and_(key_rows.c.id == key_id, key_rows.c.role == "client", key_rows.c.deleted_at.is_(None)))
    ).first()
    return None if row is None else keys.record(row)


def create(conn: Connection, fields: dict[str, Any], at: float) -> ScheduleRecord:
    stamp = now()
    row = {
        "id": new_id("sch_"),
        **{name: fields[name] for name in BODY_FIELDS},
        "checked_through": at,  # ticks before the schedule existed never fire
        "created_at": stamp,
        "updated_at": stamp,
    }
    conn.execute(insert(schedules), row)
    return ScheduleRecord(**row)


def get(conn: Connection, schedule_id: str) -> ScheduleRecord | None:
    row = conn.execute(select(schedules).where(schedules.c.id == schedule_id)).first()
    return None if row is None else record(row)


def replace(conn: Connection, schedule_id: str, fields: dict[str, Any], at: float) -> ScheduleRecord | None:
    """Full replacement; None if there is no such schedule. Ticks before the replacement never fire:
    a new expression, or a schedule enabled again, starts from now."""
    current = get(conn, schedule_id)
    if current is None:
        return None
    values = {name: fields[name] for name in BODY_FIELDS}
    stamp = now()
    conn.execute(
        update(schedules).where(schedules.c.id == schedule_id).values(**values, checked_through=at, updated_at=stamp)
    )
    return dataclasses.replace(current, **values, checked_through=at, updated_at=stamp)


def delete_schedule(conn: Connection, schedule_id: str) -> bool:
    """Delete a schedule and its runs (their sessions stay); False if there was none. A run still
    running finishes its turn; its row is gone, so its end is recorded nowhere."""
    deleted = conn.execute(delete(schedules).where(schedules.c.id == schedule_id)).rowcount
    conn.execute(delete(schedule_runs).where(schedule_runs.c.schedule_id == schedule_id))
    return bool(deleted)


def page(conn: Connection, after_seq: int, limit: int) -> list[tuple[int, ScheduleRecord]]:
    rows = conn.execute(
        select(schedules).where(schedules.c.seq > after_seq).order_by(schedules.c.seq).limit(limit)
    )
    return [(row.seq, record(row)) for row in rows]


def enabled(conn: Connection, after_seq: int, limit: int) -> list[tuple[int, ScheduleRecord]]:
    """Enabled schedules in insertion order, a page at a time (the ticker's pass)."""
    rows = conn.execute(
        select(schedules)
        .where(and_(schedules.c.enabled.is_(True), schedules.c.seq > after_seq))
        .order_by(schedules.c.seq)
        .limit(limit)
    )
    return [(row.seq, record(row)) for row in rows]


def advance(conn: Connection, schedule_id: str, through: float) -> None:
    """The ticker looked at the schedule's ticks up to `through` (never moves back)."""
    conn.execute(
        update(schedules)
        .where(and_(schedules.c.id == schedule_id, schedules.c.checked_through < through))
        .values(checked_through=through)
    )


def insert_run(
    conn: Connection, schedule_id: str, scheduled_for: str, outcome: str, detail: str | None, replica_id: str
) -> ScheduleRunRecord | None:
    """The tick's run row, or None when another replica inserted it first (it fires the tick)."""
    row: dict[str, Any] = {
        "id": new_id("run_"),
        "schedule_id": schedule_id,
        "scheduled_for": scheduled_for,
        "fired_at": now(),
        "session_id": None,
        "outcome": outcome,
        "detail": detail,
        "replica_id": replica_id,
    }
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    inserted = conn.execute(
        dialect.insert(schedule_runs)
        .on_conflict_do_nothing(index_elements=[schedule_runs.c.schedule_id, schedule_runs.c.scheduled_for])
        .values(**row)
    ).rowcount
    return ScheduleRunRecord(**row) if inserted else None


def get_run(conn: Connection, run_id: str) -> ScheduleRunRecord | None:
    row = conn.execute(select(schedule_runs).where(schedule_runs.c.id == run_id)).first()
    return None if row is None else run_record(row)


def running_before(conn: Connection, schedule_id: str, scheduled_for: str) -> ScheduleRunRecord | None:
    """The oldest run of the schedule still running for an earlier tick (the overlap check)."""
    row = conn.execute(
        select(schedule_runs)
        .where(and_(schedule_runs.c.schedule_id == schedule_id, schedule_runs.c.outcome == Outcome.RUNNING,
                    schedule_runs.c.scheduled_for < scheduled_for))
        .order_by(schedule_runs.c.scheduled_for)
        .limit(1)
    ).first()
    return None if row is None else run_record(row)


def running(conn: Connection, limit: int) -> list[ScheduleRunRecord]:
    """Runs still running on any replica, oldest first (the check for runs whose replica stopped)."""
    rows = conn.execute(
        select(schedule_runs).where(schedule_runs.c.outcome == Outcome.RUNNING).order_by(schedule_runs.c.seq).limit(limit)
    )
    return [run_record(row) for row in rows]


def take_run(conn: Connection, run_id: str, from_replica: str, to_replica: str) -> bool:
    """Move a running run to `to_replica` if `from_replica` still has it (a compare-and-swap: of two
    replicas taking over a stopped one's run, one does)."""
    return bool(conn.execute(
        update(schedule_runs)
        .where(and_(schedule_runs.c.id == run_id, schedule_runs.c.replica_id == from_replica,
                    schedule_runs.c.outcome == Outcome.RUNNING))
        .values(replica_id=to_replica)
    ).rowcount)


def set_session(conn: Connection, run_id: str, session_id: str) -> None:
    conn.execute(update(schedule_runs).where(schedule_runs.c.id == run_id).values(session_id=session_id))


def finish(conn: Connection, run_id: str, outcome: str, detail: str | None) -> None:
    """A running run's outcome (a run already ended keeps its first)."""
    conn.execute(
        update(schedule_runs)
        .where(and_(schedule_runs.c.id == run_id, schedule_runs.c.outcome == Outcome.RUNNING))
        .values(outcome=outcome, detail=detail)
    )


def runs_page(conn: Connection, schedule_id: str, after_seq: int, limit: int) -> list[tuple[int, ScheduleRunRecord]]:
    rows = conn.execute(
        select(schedule_runs)
        .where(and_(schedule_runs.c.schedule_id == schedule_id, schedule_runs.c.seq > after_seq))
        .order_by(schedule_runs.c.seq)
        .limit(limit)
    )
    return [(row.seq, run_record(row)) for row in rows]


def binder(run_id: str) -> opening.Then:
    """What records a run's session in the transaction that opens it (opening.open_session_then)."""

    def bind(conn: Connection, session_id: str) -> None:
        set_session(conn, run_id, session_id)

    return bind


def claim_tick(
    conn: Connection, schedule: ScheduleRecord, scheduled_for: str, replica_id: str
) -> ScheduleRunRecord | None:
    """The run row of one tick, decided in one transaction: "skipped" when the overlap policy is
    "skip" and an earlier run still runs, else "running" (this replica fires it). None when another
    replica inserted it first."""
    if schedule.overlap == "skip":
        earlier = running_before(conn, schedule.id, scheduled_for)
        if earlier is not None:
            detail = f"the run {earlier.id} for {earlier.scheduled_for} was still running"
            insert_run(conn, schedule.id, scheduled_for, Outcome.SKIPPED, detail, replica_id)
            return None
    return insert_run(conn, schedule.id, scheduled_for, Outcome.RUNNING, None, replica_id)

