"""Leases after the claim: renewing them, giving them back, and reclaiming the ones that expired.

A lease is ``(lease_owner, lease_expires)`` on a leased or running row, and
its token is the row's ``attempt``. The executor that holds jobs renews all of
their leases in one statement per tick (:func:`renew`); a job whose lease
expired (its executor died, or its child froze and stopped beating) is put
back to ``ready`` by whoever looks next (:func:`reclaim_expired`), and the
late report of the attempt that lost it is discarded by the fenced finish.
A job whose owner was asked to stop it is never put back to ready by these:
it ends cancelled (:func:`dbexecutor.store.control.end_stopped`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from sqlalchemy import Connection

from ..records import Renewal
from . import control
from .context import Context, chunks
from .transitions import AttemptRow, fenced, record_attempts

__all__ = ["renew", "release", "reclaim_expired", "release_held", "release_unknown"]


def renew(
    ctx: Context,
    conn: Connection,
    held: Sequence[tuple[int, int]],
    started: AbstractSet[int],
    ttl: float,
    now: float,
    progress: Mapping[tuple[int, int], tuple[float | None, str | None]] | None = None,
) -> Renewal:
    """Extend the leases of ``held`` ``(job_id, attempt)``; the ``started`` ones become running; write their ``progress``.

    Returns the ids whose lease is gone and those whose owner must stop them.
    """
    out = Renewal()
    for part in chunks(sorted(held)):
        ids = {job_id for job_id, _ in part}
        params = {**ctx.driver.pairs("p_held", part), "p_started": sorted(ids & started), "p_expires": now + ttl}
        if conn.execute(ctx.sql.renew_leases, params).rowcount < len(part):
            # Short: a lease is gone, or a job was asked to stop (left unrenewed). Which?
            mine = set(part)
            found = [r for r in conn.execute(ctx.sql.active_tokens, {"p_ids": sorted(ids)}) if (int(r.id), r.attempt) in mine]
            gone = ids - {int(r.id) for r in found}
            out.stop.update(int(r.id) for r in found if r.terminate_requested is not None)
            if gone:
                # Done by the attempt held: a child committed its job transaction, its Result is on the way.
                done = conn.execute(ctx.sql.done_tokens, {"p_ids": sorted(gone)}).all()
                out.done.update(int(r.id) for r in done if (int(r.id), r.attempt) in mine)
                out.lost.update(gone - out.done)
    if progress:
        control.write_progress(ctx, conn, progress, now)
    return out


def release(ctx: Context, conn: Connection, job_id: int, attempt: int) -> bool:
    """Give back a claimed job that never started (its child could not start); False if not held.

    A job asked to stop meanwhile is cancelled instead (and counts as given back).
    """
    released = fenced(conn, ctx.sql.release, job_id, attempt)
    if not released:
        row = _Held(job_id, attempt, None, None)
        stopped, finals = control.end_stopped(ctx, conn, [row], _now(ctx), "asked to stop before it started")
        ctx.notify(conn, finished=[f.job_id for f in finals])
        return bool(stopped)
    ctx.notify(conn, ready=released)
    return released


class _Held:
    """An attempt a stopping owner still holds, in the shape ``end_stopped`` reads."""

    def __init__(self, job_id: int, attempt: int, owner: str | None, started: float | None) -> None:
        self.id, self.attempt, self.lease_owner, self.started_at = job_id, attempt, owner, started


def _now(ctx: Context) -> float:
    return ctx.clock.now()


def reclaim_expired(ctx: Context, conn: Connection, now: float) -> list[int]:
    """Put jobs whose lease expired before ``now`` back to ``ready``, each with an attempt row saying so.

    A job asked to stop is cancelled instead. Returns the ids put back.
    """
    rows = conn.execute(ctx.sql.expired_locked, {"p_now": now}).all()
    if not rows:
        return []
    stopping = [r for r in rows if r.terminate_requested is not None]
    rows = [r for r in rows if r.terminate_requested is None]
    _, finals = control.end_stopped(
        ctx, conn, stopping, now, "asked to stop; its lease expired before its owner stopped it"
    ) if stopping else ([], [])
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
    ctx.notify(conn, ready=bool(ids), finished=[f.job_id for f in finals])
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
    kept = {i for i, _, _ in released}
    # The ones not given back may have been asked to stop: those end cancelled.
    rest: list[Any] = [_Held(i, a, worker, s) for i, a, s in sorted(held) if i not in kept]
    _, finals = control.end_stopped(ctx, conn, rest, now, "asked to stop; its worker stopped first") if rest else ([], [])
    ctx.notify(conn, ready=bool(released), finished=[f.job_id for f in finals])
    return [i for i, _, _ in released]


def release_unknown(ctx: Context, conn: Connection, owner: str, known: AbstractSet[tuple[int, int]], now: float) -> list[int]:
    """Give back the jobs leased to ``owner`` that are not in its ``known`` ``(job_id, attempt)`` leases; ids given back.

    For an executor whose claim's ``COMMIT`` failed: it may have been made
    all the same, its answer lost, and then those leases are held by nobody
    until they expire. Each is released as ``released`` (fenced by its
    attempt; one asked to stop is cancelled), back to ready at once.
    """
    rows = conn.execute(ctx.sql.jobs_held_by, {"p_names": [owner]}).all()
    unknown = [(int(r.id), int(r.attempt), r.started_at) for r in rows if (int(r.id), int(r.attempt)) not in known]
    if not unknown:
        return []
    return release_held(ctx, conn, unknown, owner, now, "leased by a claim whose commit did not answer")
