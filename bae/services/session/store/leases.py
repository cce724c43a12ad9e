"""Session ownership rows: replica heartbeats and per-session leases.

A lease is valid while its replica's heartbeat (`replicas.expires_at`, epoch
seconds) lies ahead. A duty (periodic work one replica runs for all, such as the
sandbox reconciliation) has a lease of its own with its own expiry. Every change of owner is a compare-and-swap on the
lease's `epoch`, so two replicas taking over one session at once cannot both
win: the loser's UPDATE matches no row (or its INSERT finds the row there).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Insert, and_, delete, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from bae.services.session.store.schema import duty_leases, replicas, session_leases, sessions


@dataclass(frozen=True)
class Replica:
    id: str
    address: str
    sessions: int  # leases it holds


@dataclass(frozen=True)
class Lease:
    """Who owns a session after a claim; `taken` is set when this claim changed the owner."""

    replica_id: str
    address: str
    taken: bool = False


def heartbeat(conn: Connection, replica_id: str, address: str, started_at: str, expires_at: float) -> None:
    """Create or renew this replica's row (a restart on the same address renews its old row)."""
    renewed = conn.execute(
        update(replicas).where(replicas.c.id == replica_id).values(address=address, expires_at=expires_at)
    ).rowcount
    if not renewed:
        conn.execute(insert(replicas).values(id=replica_id, address=address, started_at=started_at,
                                             expires_at=expires_at))


def live_replicas(conn: Connection, now: float) -> list[Replica]:
    """Replicas whose heartbeat has not expired, with the number of leases each holds."""
    held = (
        select(session_leases.c.replica_id, func.count().label("held"))
        .group_by(session_leases.c.replica_id)
        .subquery()
    )
    rows = conn.execute(
        select(replicas.c.id, replicas.c.address, func.coalesce(held.c.held, 0))
        .select_from(replicas.outerjoin(held, held.c.replica_id == replicas.c.id))
        .where(replicas.c.expires_at > now)
        .order_by(replicas.c.id)
    ).all()
    return [Replica(row[0], row[1], int(row[2])) for row in rows]


def claim(conn: Connection, session_id: str, replica_id: str, address: str, now: float) -> Lease | None:
    """The open session's owner: a live replica that holds it, else this replica, which takes it.

    None for a session that is not open: it has no live state to own.
    """
    state = conn.execute(select(sessions.c.state).where(sessions.c.id == session_id)).scalar()
    if state != "open":
        return None
    row = conn.execute(
        select(session_leases.c.replica_id, session_leases.c.epoch, replicas.c.address, replicas.c.expires_at)
        .select_from(session_leases.outerjoin(replicas, replicas.c.id == session_leases.c.replica_id))
        .where(session_leases.c.session_id == session_id)
    ).first()
    if row is None:
        created = conn.execute(
            _insert_new(conn).values(session_id=session_id, replica_id=replica_id, epoch=1)
        ).rowcount
        # Nothing inserted: another replica created the lease a moment ago, and owns the session.
        return Lease(replica_id, address, taken=True) if created else _current(conn, session_id)
    holder, epoch, holder_address, expires_at = row
    if holder == replica_id:
        return Lease(replica_id, address)
    if expires_at is not None and expires_at > now:
        return Lease(holder, holder_address)
    swapped = conn.execute(
        update(session_leases)
        .where(and_(session_leases.c.session_id == session_id, session_leases.c.epoch == epoch))
        .values(replica_id=replica_id, epoch=epoch + 1)
    ).rowcount
    return Lease(replica_id, address, taken=True) if swapped else _current(conn, session_id)


def _insert_new(conn: Connection) -> Insert:
    """An INSERT into session_leases that does nothing when the session already has a lease."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(session_leases).on_conflict_do_nothing(index_elements=[session_leases.c.session_id])
    return sqlite.insert(session_leases).on_conflict_do_nothing(index_elements=[session_leases.c.session_id])


def _current(conn: Connection, session_id: str) -> Lease:
    row = conn.execute(
        select(session_leases.c.replica_id, replicas.c.address)
        .select_from(session_leases.join(replicas, replicas.c.id == session_leases.c.replica_id))
        .where(session_leases.c.session_id == session_id)
    ).one()
    return Lease(row[0], row[1])


def owners(conn: Connection, session_ids: list[str], now: float) -> dict[str, str]:
    """session id -> address of its live owner, for those of `session_ids` that have one."""
    rows = conn.execute(
        select(session_leases.c.session_id, replicas.c.address)
        .select_from(session_leases.join(replicas, replicas.c.id == session_leases.c.replica_id))
        .where(and_(session_leases.c.session_id.in_(session_ids), replicas.c.expires_at > now))
    ).all()
    return {row[0]: row[1] for row in rows}


def holders(conn: Connection, session_ids: list[str]) -> dict[str, str]:
    """session id -> the replica its lease names, live or not, for those of `session_ids` that have one."""
    rows = conn.execute(
        select(session_leases.c.session_id, session_leases.c.replica_id).where(session_leases.c.session_id.in_(session_ids))
    ).all()
    return {row[0]: row[1] for row in rows}


def held_by(conn: Connection, replica_id: str) -> set[str]:
    return set(conn.execute(select(session_leases.c.session_id).where(session_leases.c.replica_id == replica_id))
               .scalars())


def orphaned(conn: Connection, now: float, limit: int) -> list[str]:
    """Open sessions whose owner's heartbeat has expired, oldest first."""
    return list(
        conn.execute(
            select(session_leases.c.session_id)
            .select_from(
                session_leases.join(sessions, sessions.c.id == session_leases.c.session_id).outerjoin(
                    replicas, replicas.c.id == session_leases.c.replica_id
                )
            )
            .where(and_(sessions.c.state == "open", func.coalesce(replicas.c.expires_at, 0) <= now))
            .order_by(sessions.c.seq)
            .limit(limit)
        ).scalars()
    )


def release(conn: Connection, session_id: str, replica_id: str) -> None:
    conn.execute(
        delete(session_leases).where(
            and_(session_leases.c.session_id == session_id, session_leases.c.replica_id == replica_id)
        )
    )


def retire(conn: Connection, replica_id: str) -> None:
    """A replica that stops gives its sessions up at once, for the others to take on their next call."""
    conn.execute(delete(session_leases).where(session_leases.c.replica_id == replica_id))
    conn.execute(delete(replicas).where(replicas.c.id == replica_id))


def take_duty(conn: Connection, name: str, replica_id: str, now: float, hold: float) -> bool:
    """Hold duty `name` until `now + hold`: True when this replica holds it now (taken, or its own
    hold renewed), False while another replica's hold lasts.

    One statement decides: the UPDATE matches the row only if this replica holds it or its hold
    has expired (PostgreSQL re-checks that condition on the row a concurrent taker committed), and
    of two replicas creating the row the second inserts nothing.
    """
    until = now + hold
    taken = conn.execute(
        update(duty_leases)
        .where(and_(duty_leases.c.name == name,
                    or_(duty_leases.c.replica_id == replica_id, duty_leases.c.expires_at <= now)))
        .values(replica_id=replica_id, expires_at=until)
    ).rowcount
    if taken:
        return True
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    created = conn.execute(
        dialect.insert(duty_leases)
        .on_conflict_do_nothing(index_elements=[duty_leases.c.name])
        .values(name=name, replica_id=replica_id, expires_at=until)
    ).rowcount
    return bool(created)


def release_duty(conn: Connection, name: str, replica_id: str) -> None:
    """Give duty `name` up (if this replica still holds it): the next replica to ask takes it."""
    conn.execute(delete(duty_leases).where(and_(duty_leases.c.name == name, duty_leases.c.replica_id == replica_id)))
