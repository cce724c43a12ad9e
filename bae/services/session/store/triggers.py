"""HTTP trigger rows and their runs (api/triggers.py serves them, engine/triggers.py drives the runs).

A call's run row is inserted in the transaction that opens its session (`start_run`). With an
Idempotency-Key, UNIQUE(trigger_id, idempotency_key) lets one of concurrent calls insert it; the
others find the winner's row and answer its run, so one key starts one session.

A run row names the replica driving it and keeps the call's message while it runs: a running run
whose replica stopped is taken by another with a compare-and-swap on that name (`take_run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, and_, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from bae.common.errors import Conflict
from bae.common.ids import new_id
from bae.common.timefmt import now
from bae.services.session.store import opening
from bae.services.session.store.fired import Outcome
from bae.services.session.store.opening import Declarations, Opened, Refused, Vetting
from bae.services.session.store.records import KeyRecord, TriggerRecord, TriggerRunRecord
from bae.services.session.store.schema import trigger_runs, triggers

# Fields a POST or PUT sets (the rest are the row's own: id and timestamps).
BODY_FIELDS = ("name", "profile_id", "input_schema", "message_template", "close_after")


class DuplicateName(Conflict):
    def __init__(self, name: str) -> None:
        super().__init__("a trigger with that name already exists", reason="trigger_name_taken")


class KeyReused(Conflict):
    def __init__(self) -> None:
        super().__init__(
            "this Idempotency-Key was used with another body for this trigger within 24 hours; "
            "use a new key for a new call",
            reason="idempotency_key_reused",
        )


def record(row: Row[Any]) -> TriggerRecord:
    return TriggerRecord(
        id=row.id,
        name=row.name,
        profile_id=row.profile_id,
        input_schema=row.input_schema,
        message_template=row.message_template,
        close_after=bool(row.close_after),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def run_record(row: Row[Any]) -> TriggerRunRecord:
    return TriggerRunRecord(
        id=row.id,
        trigger_id=row.trigger_id,
        fired_at=row.fired_at,
        created_at=row.created_at,
        session_id=row.session_id,
        outcome=row.outcome,
        detail=row.detail,
        idempotency_key=row.idempotency_key,
        released_idempotency_key=row.released_idempotency_key,
        input_sha256=row.input_sha256,
        replica_id=row.replica_id,
        message=row.message,
    )


def _name_taken(conn: Connection, name: str, other_than: str | None = None) -> bool:
    query = select(triggers.c.id).where(triggers.c.name == name)
    if other_than is not None:
        query = query.where(triggers.c.id != other_than)
    return conn.execute(query).first() is not None


def create(conn: Connection, fields: dict[str, Any]) -> TriggerRecord:
    if _name_taken(conn, fields["name"]):
        raise DuplicateName(fields["name"])
    stamp = now()
    row = {"id": new_id("trg_"), **{name: fields[name] for name in BODY_FIELDS}, "created_at": stamp, "updated_at": stamp}
    conn.execute(insert(triggers), row)
    return TriggerRecord(**row)


def get(conn: Connection, trigger_id: str) -> TriggerRecord | None:
    row = conn.execute(select(triggers).where(triggers.c.id == trigger_id)).first()
    return None if row is None else record(row)


def by_name(conn: Connection, name: str) -> TriggerRecord | None:
    row = conn.execute(select(triggers).where(triggers.c.name == name)).first()
    return None if row is None else record(row)


def replace(conn: Connection, trigger_id: str, fields: dict[str, Any]) -> TriggerRecord | None:
    """Full replacement; None if there is no such trigger. Runs under way keep the message they sent."""
    current = get(conn, trigger_id)
    if current is None:
        return None
    if _name_taken(conn, fields["name"], other_than=trigger_id):
        raise DuplicateName(fields["name"])
    values = {name: fields[name] for name in BODY_FIELDS}
    stamp = now()
    conn.execute(update(triggers).where(triggers.c.id == trigger_id).values(**values, updated_at=stamp))
    return TriggerRecord(**{**current.__dict__, **values, "updated_at": stamp})


def delete_trigger(conn: Connection, trigger_id: str) -> bool:
    """Delete a trigger and its runs (their sessions stay); False if there was none."""
    deleted = conn.execute(delete(triggers).where(triggers.c.id == trigger_id)).rowcount
    conn.execute(delete(trigger_runs).where(trigger_runs.c.trigger_id == trigger_id))
    return bool(deleted)


def page(conn: Connection, after_seq: int, limit: int) -> list[tuple[int, TriggerRecord]]:
    rows = conn.execute(select(triggers).where(triggers.c.seq > after_seq).order_by(triggers.c.seq).limit(limit))
    return [(row.seq, record(row)) for row in rows]


def runs_page(conn: Connection, trigger_id: str, after_seq: int, limit: int) -> list[tuple[int, TriggerRunRecord]]:
    rows = conn.execute(
        select(trigger_runs)
        .where(and_(trigger_runs.c.trigger_id == trigger_id, trigger_runs.c.seq > after_seq))
        .order_by(trigger_runs.c.seq)
        .limit(limit)
    )
    return [(row.seq, run_record(row)) for row in rows]


@dataclass(frozen=True)
class Call:
    """One call of a trigger, as the run row records it."""

    trigger_id: str
    idempotency_key: str | None
    input_sha256: str
    message: str  # the rendered message the run sends
    at: float  # epoch seconds
    window: float  # how long a key is held, in seconds


@dataclass(frozen=True)
class Started:
    run: TriggerRunRecord
    opened: Opened


@dataclass(frozen=True)
class Repeated:
    """An earlier call with the same key and body: its run is the answer, nothing starts."""

    run: TriggerRunRecord


def _held(conn: Connection, call: Call) -> TriggerRunRecord | None:
    row = conn.execute(
        select(trigger_runs).where(
            and_(trigger_runs.c.trigger_id == call.trigger_id, trigger_runs.c.idempotency_key == call.idempotency_key)
        )
    ).first()
    return None if row is None else run_record(row)


def _repeat_of(run: TriggerRunRecord, call: Call) -> Repeated:
    if run.input_sha256 != call.input_sha256:
        raise KeyReused()
    return Repeated(run)


def new_run_id() -> str:
    """A run's id, made before its row is: the replica marks the run its own before it commits."""
    return new_id("trn_")


def _insert_run(conn: Connection, call: Call, run_id: str, replica_id: str) -> TriggerRunRecord | None:
    """The call's run row, or None when a concurrent call with the same key inserted one first."""
    row: dict[str, Any] = {
        "id": run_id,
        "trigger_id": call.trigger_id,
        "fired_at": now(),
        "created_at": call.at,
        "session_id": None,
        "outcome": Outcome.RUNNING,
        "detail": None,
        "idempotency_key": call.idempotency_key,
        "released_idempotency_key": None,
        "input_sha256": call.input_sha256,
        "replica_id": replica_id,
        "message": call.message,
    }
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    # On PostgreSQL an insert that meets an uncommitted row with the same key waits for that
    # transaction: it then does nothing if the row committed, and inserts if it rolled back.
    inserted = conn.execute(
        dialect.insert(trigger_runs)
        .on_conflict_do_nothing(index_elements=[trigger_runs.c.trigger_id, trigger_runs.c.idempotency_key])
        .values(**row)
    ).rowcount
    return TriggerRunRecord(**row) if inserted else None


def start_run(
    conn: Connection, call: Call, run_id: str, replica_id: str, key: KeyRecord, body: Declarations, vetting: Vetting
) -> Started | Repeated | Refused:
    """Record the call's run (`run_id`, driven by `replica_id`) and open its session, in one transaction.

    A key held by an earlier call within the window answers that call's run (same body) or raises
    KeyReused (another body); a key older than the window is released first. A refused open (an
    unavailable profile or provider, with its audit row) leaves no run, so a retry with the same
    key is a new call; over the open-sessions quota, QuotaExceeded rolls everything back."""
    if call.idempotency_key is not None:
        held = _held(conn, call)
        if held is not None and held.created_at > call.at - call.window:
            return _repeat_of(held, call)
        if held is not None:
            conn.execute(
                update(trigger_runs)
                .where(trigger_runs.c.id == held.id)
                .values(idempotency_key=None, released_idempotency_key=call.idempotency_key)
            )
    run = _insert_run(conn, call, run_id, replica_id)
    if run is None:
        winner = _held(conn, call)
        assert winner is not None  # the conflicting row committed: the insert saw it
        return _repeat_of(winner, call)
    opened = opening.open_session(conn, key, body, vetting)
    if isinstance(opened, Refused):
        conn.execute(delete(trigger_runs).where(trigger_runs.c.id == run.id))
        return opened
    conn.execute(update(trigger_runs).where(trigger_runs.c.id == run.id).values(session_id=opened.session_id))
    return Started(TriggerRunRecord(**{**run.__dict__, "session_id": opened.session_id}), opened)


def running(conn: Connection, after_seq: int, limit: int) -> list[tuple[int, TriggerRunRecord]]:
    """Runs still running on any replica, oldest first, from `after_seq` on (the check for runs whose
    replica stopped)."""
    rows = conn.execute(
        select(trigger_runs)
        .where(and_(trigger_runs.c.outcome == Outcome.RUNNING, trigger_runs.c.seq > after_seq))
        .order_by(trigger_runs.c.seq)
        .limit(limit)
    )
    return [(row.seq, run_record(row)) for row in rows]


def take_run(conn: Connection, run_id: str, from_replica: str, to_replica: str) -> bool:
    """Move a running run to `to_replica` if `from_replica` still has it (a compare-and-swap: of two
    replicas taking over a stopped one's run, one does)."""
    return bool(conn.execute(
        update(trigger_runs)
        .where(and_(trigger_runs.c.id == run_id, trigger_runs.c.replica_id == from_replica,
                    trigger_runs.c.outcome == Outcome.RUNNING))
        .values(replica_id=to_replica)
    ).rowcount)


def finish(conn: Connection, run_id: str, outcome: str, detail: str | None) -> None:
    """A running run's outcome (a run already ended keeps its first). Its message goes: the session's
    log has it, and only a resumed run needed it here."""
    conn.execute(
        update(trigger_runs)
        .where(and_(trigger_runs.c.id == run_id, trigger_runs.c.outcome == Outcome.RUNNING))
        .values(outcome=outcome, detail=detail, message=None)
    )
