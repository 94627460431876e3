"""Whether a transaction whose ``COMMIT`` did not answer was made all the same.

A connection can drop after the server committed a transaction and before
its answer arrived; the store cannot tell that from a commit that failed,
and tries the transaction again (:meth:`Database.txn <dbexecutor.store.database.Database.txn>`).
Before it does, one of these reads whether the try before landed, from
what that try returned: then it is not written again. A submit would
otherwise store its jobs twice, a claim lease jobs that nobody runs until
their leases expire, and a finish count its dependents down twice.

Each looks for a trace only that transaction could have left: a row it
inserted, with its id and creation time; a lease it took, with its owner and
attempt; an attempt row it wrote, with its job, attempt and child
(:func:`~dbexecutor.store.finish.recorded_before`). Ids are not reused
after a rollback on the servers; on SQLite, where one may be, a commit
cannot be lost this way (no connection), and a reused id was created at
another time.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from ..records import Claimed, NewJob, Report, Submitted
from . import finish
from .context import Context

__all__ = ["inserted", "leased", "recorded", "submitted", "tick"]


def inserted(ctx: Context, conn: Connection, rows: Sequence[Submitted], now: float) -> bool | None:
    """Whether the rows a try inserted at ``now`` are there; None if it inserted none (a key's row found is not one)."""
    new = next((row for row in rows if not row.existing), None)
    if new is None:
        return None
    return conn.execute(ctx.sql.created_at, {"p_id": new.job_id, "p_now": now}).first() is not None


def submitted(
    ctx: Context, conn: Connection, jobs: Sequence[NewJob], now: float, rows: Sequence[Submitted] | None
) -> list[Submitted] | None:
    """The rows of ``jobs`` (no keys) if an earlier try inserted them at ``now``, else None.

    ``rows``: what the last try that returned said it inserted. A try in
    autocommit (a one-row submit on PostgreSQL) may have been committed
    without returning: its rows are found by their submitter and creation
    time, as they are now (a job run meanwhile has its final state).
    """
    by = jobs[0].submitted_by
    if by is not None and all(job.submitted_by == by for job in jobs):
        found = conn.execute(ctx.sql.created_by, {"p_now": now, "p_by": by}).all()
        if len(found) == len(jobs) and [r.fn_name for r in found] == [job.fn_name for job in jobs]:
            return [Submitted(int(r.id), r.state, r.result) for r in found]
        return None
    return list(rows) if rows is not None and inserted(ctx, conn, rows, now) else None


def leased(ctx: Context, conn: Connection, owner: str, claimed: Sequence[Claimed]) -> bool | None:
    """Whether ``owner`` holds the leases a try took; None if it took none."""
    if not claimed:
        return None
    first = claimed[0]
    params = {"p_id": first.job_id, "p_attempt": first.attempt, "p_owner": owner}
    return conn.execute(ctx.sql.held_by, params).first() is not None


def recorded(ctx: Context, conn: Connection, reports: Sequence[Report]) -> bool | None:
    """Whether every one of ``reports`` is recorded (its attempt row is there); None if none is the store's to write.

    Every one, not any: some may have been recorded by an earlier tick
    whose answer was lost too (the loop sends them again as unsure).
    """
    own = [r for r in reports if not r.finalized]
    if not own:
        return None
    rest, _ = finish.recorded_before(ctx, conn, own)
    return not rest


def tick(
    ctx: Context,
    conn: Connection,
    now: float,
    owner: str,
    reports: Sequence[Report],
    rows: Sequence[Submitted],
    claimed: Sequence[Claimed],
    late: Sequence[Report] = (),
) -> bool:
    """Whether a scheduler tick (:meth:`Store.finish_and_claim`) landed: by its first trace, the cheapest read first.

    A tick that wrote nothing a second try could repeat (no row, no lease,
    no report of its own) is taken as not landed: running it again is harmless.
    ``late``: reports of jobs it leased and recorded too (no lease of theirs is left to find).
    """
    ended = {(r.job_id, r.attempt) for r in late}
    found = inserted(ctx, conn, rows, now)
    if found is None:
        found = leased(ctx, conn, owner, [c for c in claimed if (c.job_id, c.attempt) not in ended])
    if found is None:
        found = recorded(ctx, conn, [*reports, *late])
    return bool(found)
