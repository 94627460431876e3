"""Recording how attempts ended: done with the result, retried after a backoff, or failed for good.

Everything a batch of reports changes is written in the caller's transaction:
the final states with their results (or exceptions), the attempt rows, and
the DAG downstream of every job that finished. A report ``finalized`` by its
child (a job transaction, :mod:`dbexecutor.store.completion`) was all of that
already, in the child's commit: it only joins the finals. Each write is fenced by the
attempt's token; a report from an attempt that lost its lease is recorded in
the attempts table as ``lease lost (...)`` and changes no job. An attempt its
owner stopped on request ends the job ``cancelled`` (never retried), with
everything downstream of it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from .. import schema, serialization
from ..errors import NotRunnable
from ..dialects.base import Rows
from ..records import Final, Finished, Report
from . import control, dag
from .context import Context, chunks
from .transitions import AttemptRow, attempt_row, fenced, outcome_column, record_attempts

__all__ = ["finish", "finish_pipelined", "pipelinable", "backoff", "recorded_before"]


def backoff(retry_delay: float, attempt: int) -> float:
    """Seconds before attempt ``attempt + 1``: exponential in the attempt, with +/-25% jitter."""
    return float(retry_delay * (2 ** max(attempt - 1, 0)) * (0.75 + random.random() / 2))


#: Refusals (children that could not load a job), from any executors, before the job fails with NotRunnable.
MAX_REFUSALS = 5


def _refused(ctx: Context, conn: Connection, rep: Report, now: float, out: Finished, lost: set[int]) -> None:
    """A child could not load the job: put it back for another executor, or fail it after too many refusals."""
    earlier = conn.execute(ctx.sql.refusals, {"p_id": rep.job_id}).all()
    if len(earlier) + 1 < MAX_REFUSALS:
        if fenced(conn, ctx.sql.refuse, rep.job_id, rep.attempt):
            out.refused.append(rep.job_id)
        else:
            lost.add(rep.job_id)
        return
    hosts = sorted({(w or "?").rsplit(":", 1)[0] for w, _ in earlier} | {(rep.worker or "?").rsplit(":", 1)[0]})
    error = NotRunnable(
        f"{rep.fn_name or 'the job'} could not be loaded by any of the {len(earlier) + 1} executors that tried "
        f"(on {', '.join(hosts)}); the last said: {rep.error}"
    )
    blob = serialization.dump_exception(error, signer=ctx.signer)
    summary = serialization.exception_summary(error)
    if fenced(conn, ctx.sql.fail_attempt, rep.job_id, rep.attempt, result=blob, error=summary, now=now):
        out.finals.append(Final(rep.job_id, schema.FAILED, blob))
        out.finals += dag.fail_dependents(ctx, conn, rep.job_id, blob, now)
    else:
        lost.add(rep.job_id)


def finish(ctx: Context, conn: Connection, reports: Sequence[Report], now: float) -> Finished:
    """Record how a batch of attempts ended (see the module docstring)."""
    out = Finished()
    # Committed by their children with the jobs' own writes (job transactions): nothing left to write.
    out.finalized = sorted(r.job_id for r in reports if r.finalized)
    out.finals += [Final(r.job_id, schema.DONE, r.blob) for r in reports if r.finalized]
    reports = sorted((r for r in reports if not r.finalized), key=lambda r: r.job_id)  # one lock order for every writer
    ok = [r for r in reports if r.ok]
    rows = [(r.job_id, r.attempt, r.blob) for r in ok]
    # Where the database can, the finish and its attempt rows are one
    # statement (a chain's link is then one round trip fewer).
    pipelined = bool(ok) and ctx.driver.pipelines  # the successes' statements sent together (finish_pipelined)
    recorded = bool(rows) and (ctx.driver.finishes_recording or pipelined)
    if pipelined:
        part, _ = finish_pipelined(ctx, conn, ok, now)
        out.finals += part.finals
        out.released, lost = part.released, set(part.lost)
    else:
        if recorded:
            won = ctx.driver.finish_done_recording(conn, ctx.sql, rows, now, [_both_outcomes(rep, now) for rep in ok])
        else:
            won = ctx.driver.finish_done(conn, ctx.sql, rows, now) if rows else set()
        out.finals += [Final(r.job_id, schema.DONE, r.blob) for r in ok if r.job_id in won]
        out.released, rolled = dag.release_dependents(ctx, conn, sorted(won), now)
        out.finals += rolled
        lost = {r.job_id for r in ok} - won
    for rep in reports:
        if rep.ok:
            continue
        if rep.refused:
            _refused(ctx, conn, rep, now, out, lost)
            continue
        if rep.stopped:  # killed on request: cancelled, with everything that waits on it
            if fenced(conn, ctx.sql.stop_attempt, rep.job_id, rep.attempt, error=control.stop_error(rep.job_id), now=now):
                out.finals.append(Final(rep.job_id, schema.CANCELLED, None))
                out.finals += control.cancel_downstream(ctx, conn, [rep.job_id], now)
            else:
                lost.add(rep.job_id)
            continue
        run_after = now + backoff(rep.retry_delay, rep.attempt)
        if fenced(conn, ctx.sql.retry_attempt, rep.job_id, rep.attempt, error=rep.error, run_after=run_after):
            out.retried.append(rep.job_id)
        elif fenced(conn, ctx.sql.fail_attempt, rep.job_id, rep.attempt, result=rep.blob, error=rep.error, now=now):
            out.finals.append(Final(rep.job_id, schema.FAILED, rep.blob))
            out.finals += dag.fail_dependents(ctx, conn, rep.job_id, rep.blob, now)
        else:
            lost.add(rep.job_id)
    out.lost = sorted(lost)
    # The attempt rows of the reports not written with their finish above.
    record_attempts(
        ctx, conn, [_attempt(rep, now, lost=rep.job_id in lost) for rep in reports if not (rep.ok and recorded)]
    )
    return out


def recorded_before(ctx: Context, conn: Connection, reports: Sequence[Report]) -> tuple[list[Report], list[Final]]:
    """Of ``reports`` sent before in a transaction whose ``COMMIT`` was not confirmed: those still to record, and the finals of the rest.

    A connection can drop after the server committed and before its answer
    arrived; the transaction then runs again with the same reports. Their
    fenced writes would change nothing the second time, but what the first
    try did beside them would be done again: the dependents of a finished
    job counted down twice (a job with two upstreams released when one was
    done), the attempt row written twice. Each report writes one attempt
    row, with its child's name, in the transaction that records it: a row
    for the report's job, attempt and child says that transaction committed.
    Those reports are left out; the successes among them that won (outcome
    ``ok``, not ``lease lost (ok)``) are returned as finals, so their
    futures resolve now. Any other outcome is not final here (a retry), or
    its future follows the row at the next poll, as for a job finished
    elsewhere. Reports their children committed themselves pass through.
    """
    ids = sorted({r.job_id for r in reports if not r.finalized})
    seen: dict[tuple[int, int, str | None], str] = {}
    for part in chunks(ids):
        for job_id, attempt, worker, outcome in conn.execute(ctx.sql.attempts_of, {"p_ids": list(part)}):
            seen[(int(job_id), int(attempt), worker)] = outcome
    rest: list[Report] = []
    finals: list[Final] = []
    for rep in reports:
        outcome = None if rep.finalized else seen.get((rep.job_id, rep.attempt, rep.worker))
        if outcome is None:
            rest.append(rep)
        elif rep.ok and outcome == outcome_column(rep.outcome):
            finals.append(Final(rep.job_id, schema.DONE, rep.blob))
    return rest, finals


def pipelinable(ctx: Context, reports: Sequence[Report]) -> bool:
    """Whether :func:`finish_pipelined` can record ``reports``: all successes their children did not commit, on a database that pipelines."""
    return ctx.driver.pipelines and bool(reports) and all(r.ok and not r.finalized for r in reports)


def finish_pipelined(
    ctx: Context, conn: Connection, reports: Sequence[Report], now: float, then: tuple[Any, dict[str, Any]] | None = None
) -> tuple[Finished, Rows | None]:
    """:func:`finish` of successes (:func:`pipelinable`), with the statements that need none of its answer in one pipeline.

    Where the last finished jobs had dependents (:attr:`Context.dependents_likely`:
    a chain, a DAG), three statements, one wait for the server: the finish
    with the attempt rows, the count-down of the dependents of the jobs the
    finish won (the statement reads which those are: ``count_down_finished``),
    and ``then``, a statement that needs neither's answer (the claim's lease
    of the next runnable rows, which then sees the dependents just
    released). Otherwise the finish goes with a read of the edges out of
    the jobs it won (``edges_out_finished``; any count-down follows, as in
    :func:`finish`): for jobs without dependents that read is the cheaper
    statement for the server, and ``then`` must be None. Either way the
    transaction's BEGIN goes with them. Returns what the reports changed,
    and ``then``'s rows.
    """
    reports = sorted(reports, key=lambda r: r.job_id)  # one lock order for every writer
    rows = [(r.job_id, r.attempt, r.blob) for r in reports]
    batch = [ctx.driver.finish_recording(conn, ctx.sql, rows, now, [_both_outcomes(r, now) for r in reports])]
    counted = ctx.dependents_likely
    won_pairs = ctx.driver.pairs("p_done", [(r.job_id, r.attempt) for r in reports])
    batch.append((ctx.sql.count_down_finished if counted else ctx.sql.edges_out_finished, won_pairs))
    if counted and then is not None:
        batch.append(then)
    answers = ctx.driver.pipelined(conn, batch, many=len(reports) >= dag.MANY_IDS)
    won = {int(r[0]) for r in answers[0].rows}
    out = Finished()
    out.finals = [Final(r.job_id, schema.DONE, r.blob) for r in reports if r.job_id in won]
    out.lost = sorted({r.job_id for r in reports} - won)
    if counted:
        out.released, rolled = dag.released_by(ctx, conn, answers[1].rows, now)
    else:
        out.released, rolled = dag.release_dependents(ctx, conn, sorted(won), now, read=dag.edges(answers[1].rows))
    out.finals += rolled
    return out, (answers[2] if counted and then is not None else None)


def _attempt(rep: Report, now: float, *, lost: bool) -> AttemptRow:
    """The attempt row of ``rep`` (``lost``: its attempt no longer held the lease, and changed nothing)."""
    outcome = _lost(rep.outcome) if lost else rep.outcome
    return AttemptRow(rep.job_id, rep.attempt, rep.worker, rep.started_at, rep.ended_at or now, outcome, rep.error)


def _lost(outcome: str) -> str:
    """The outcome recorded for an attempt that ended as ``outcome`` after its lease was lost."""
    return f"lease lost ({outcome})"


def _both_outcomes(rep: Report, now: float) -> dict[str, Any]:
    """``rep``'s attempt row with the outcome it gets if its finish wins, and ``outcome_lost`` if the lease was lost."""
    row = attempt_row(_attempt(rep, now, lost=False))
    row["outcome_lost"] = outcome_column(_lost(rep.outcome))  # one row per job finished: not built twice
    return row
