"""Control over running jobs: what they report about their progress, and stopping them where they run.

::

    operator ── request_stop ──► terminate_requested on the row (leased/running)
                                 (waiting/ready jobs are simply cancelled)
    owner's next beat ── renew ──► its renewal leaves that lease out, reads why,
                                   returns the id in Renewal.stop
    owner ── kills the process tree ──► finish(Report(stopped=True)) ──► cancelled,
                                        attempt "terminated", dependents cancelled

A child never writes to the database: its progress reaches its owner over the
pipe, and the owner writes the latest value per job with its next lease
renewal (:func:`write_progress`, one executemany per beat). An attempt that
ends without its owner's kill (its lease expired, its executor died, its
worker gave it back) while its job was asked to stop is cancelled too
(:func:`end_stopped`), never put back to ready.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from .. import schema
from ..readmodels import JobProgress, StopRequest
from ..records import Final
from . import dag
from .context import Context, chunks
from .transitions import AttemptRow, fenced, record_attempts

__all__ = ["request_stop", "end_stopped", "write_progress", "progress", "STOPPED", "MESSAGE_WIDTH"]

#: The outcome of an attempt stopped on request (the attempts table).
STOPPED = "terminated"
#: Characters of a progress message that are kept (the column's width).
MESSAGE_WIDTH = 255


def request_stop(ctx: Context, conn: Connection, job_ids: Sequence[int], now: float) -> tuple[StopRequest, list[Final]]:
    """Cancel the given jobs that have not started; ask the owners of the running ones to stop them.

    Returns what happened to each requested id, and the jobs this
    transaction finished (the cancelled ones and their dependents).
    """
    wanted = sorted(set(job_ids))
    finals = dag.cancel(ctx, conn, wanted, now)
    for part in chunks(wanted):
        conn.execute(ctx.sql.request_stop, {"p_ids": list(part), "p_now": now})
    cancelled = {f.job_id for f in finals}
    terminating: list[int] = []
    refused: dict[int, str] = {}
    found: dict[int, Any] = {}
    for part in chunks(wanted):
        found.update((int(r.id), r) for r in conn.execute(ctx.sql.job_states, {"p_ids": list(part)}))
    for job_id in wanted:
        row = found.get(job_id)
        if job_id in cancelled:
            continue
        if row is None:
            refused[job_id] = "no such job"
        elif row.state in schema.ACTIVE_STATES and row.terminate_requested is not None:
            terminating.append(job_id)
        else:
            refused[job_id] = f"it is {row.state} already"
    ctx.notify(conn, finished=sorted(cancelled))
    request = StopRequest(sorted(cancelled), terminating, refused)
    return request, finals


def stop_error(job_id: int) -> str:
    """The error text of a job stopped on request."""
    return f"Terminated: job {job_id} was asked to stop while it ran; its process tree was killed"


def cancel_downstream(ctx: Context, conn: Connection, job_ids: Sequence[int], now: float) -> list[Final]:
    """Cancel what waits on jobs that were stopped (their dependents can never run)."""
    below = sorted({dep for dep, _, _ in dag.dependents(ctx, conn, list(job_ids))})
    return dag.cancel(ctx, conn, below, now) if below else []


def end_stopped(
    ctx: Context, conn: Connection, rows: Sequence[Any], now: float, why: str
) -> tuple[list[int], list[Final]]:
    """Cancel the jobs among ``rows`` (id, attempt, lease_owner, started_at) that were asked to stop.

    For attempts that end without their owner's kill: a lease that expired,
    an executor found dead, a worker that gives its jobs back. Each is
    fenced by its token and recorded as a ``terminated`` attempt. Returns
    the ids cancelled this way and every job this finished.
    """
    ended = [r for r in rows if fenced(conn, ctx.sql.stop_attempt, int(r.id), r.attempt, error=stop_error(int(r.id)), now=now)]
    if not ended:
        return [], []
    ids = [int(r.id) for r in ended]
    record_attempts(ctx, conn, [AttemptRow(int(r.id), r.attempt, r.lease_owner, r.started_at, now, STOPPED, why) for r in ended])
    finals = [Final(i, schema.CANCELLED, None) for i in ids] + cancel_downstream(ctx, conn, ids, now)
    return ids, finals


def write_progress(
    ctx: Context, conn: Connection, updates: Mapping[tuple[int, int], tuple[float | None, str | None]], now: float
) -> None:
    """Record the latest progress of each ``(job_id, attempt)`` still active (one executemany)."""
    if not updates:
        return
    params = [
        {"p_id": job_id, "p_attempt": attempt, "p_progress": fraction,
         "p_message": None if message is None else message[:MESSAGE_WIDTH], "p_now": now}
        for (job_id, attempt), (fraction, message) in sorted(updates.items())
    ]
    conn.execute(ctx.sql.set_progress, params if len(params) > 1 else params[0])


def progress(ctx: Context, conn: Connection, job_id: int) -> JobProgress | None:
    """What job ``job_id`` last said about its progress (None: nothing, or no such job)."""
    row = conn.execute(ctx.sql.job_progress, {"p_id": job_id}).first()
    return None if row is None else JobProgress.of(row.progress, row.progress_message, row.progress_at)
