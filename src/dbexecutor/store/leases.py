"""Leases after the claim: renewing them, giving them back, and reclaiming the ones that expired.

A lease is ``(lease_owner, lease_expires)`` on a leased or running row, and
its token is the row's ``attempt``. The executor that holds jobs renews all of
their leases in one statement per tick (:func:`renew`); a job whose lease
expired (its executor died, or its child froze and stopped beating) is put
back to ``ready`` by whoever looks next (:func:`reclaim_expired`), and the
late report of the attempt that lost it is discarded by the fenced finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from sqlalchemy import Connection

from .context import Context, chunks
from .transitions import AttemptRow, fenced, record_attempts

__all__ = ["renew", "release", "reclaim_expired", "release_held"]


def renew(
    ctx: Context, conn: Connection, held: Sequence[tuple[int, int]], started: AbstractSet[int], ttl: float, now: float
) -> set[int]:
    """Extend the leases of ``held`` ``(job_id, attempt)``; the ``started`` ones become running. The ids whose lease is gone."""
    lost: set[int] = set()
    for part in chunks(sorted(held)):
        ids = {job_id for job_id, _ in part}
        params = {"p_held": list(part), "p_started": sorted(ids & started), "p_expires": now + ttl}
        if conn.execute(ctx.sql.renew_leases, params).rowcount < len(part):
            mine = set(part)
            found = conn.execute(ctx.sql.active_tokens, {"p_ids": sorted(ids)}).all()
            lost |= ids - {int(r.id) for r in found if (int(r.id), r.attempt) in mine}
    return lost


def release(ctx: Context, conn: Connection, job_id: int, attempt: int) -> bool:
    """Give back a claimed job that never started (its child could not start); False if not held."""
    released = fenced(conn, ctx.sql.release, job_id, attempt)
    ctx.notify(conn, ready=released)
    return released


def reclaim_expired(ctx: Context, conn: Connection, now: float) -> list[int]:
    """Put jobs whose lease expired before ``now`` back to ``ready``, each with an attempt row saying so."""
    rows = conn.execute(ctx.sql.expired_locked, {"p_now": now}).all()
    if not rows:
        return []
    ids = [int(r.id) for r in rows]
    for part in chunks(ids):
        conn.execute(ctx.sql.reclaim, {"p_ids": list(part), "p_now": now})
    record_attempts(
        ctx,
        conn,
        [
            AttemptRow(
                int(r.id), r.attempt, r.lease_owner, r.started_at, now, "lease expired",
                "no heartbeat before the lease expired; the job was put back to ready",
            )
            for r in rows
        ],
    )
    ctx.notify(conn, ready=True)
    return ids


def release_held(
    ctx: Context, conn: Connection, held: Sequence[tuple[int, int, float | None]], worker: str, now: float, why: str
) -> list[int]:
    """Put jobs a stopping worker still holds back to ``ready``, each recorded as a ``released`` attempt; ids released.

    ``held`` is ``(job_id, attempt, started_at)``. Fenced by the token: a job
    whose lease was already lost (reclaimed, finished elsewhere) is left alone.
    """
    released = [(job_id, attempt, started) for job_id, attempt, started in sorted(held) if fenced(conn, ctx.sql.release, job_id, attempt)]
    record_attempts(ctx, conn, [AttemptRow(i, a, worker, s, now, "released", why) for i, a, s in released])
    ctx.notify(conn, ready=bool(released))
    return [i for i, _, _ in released]
