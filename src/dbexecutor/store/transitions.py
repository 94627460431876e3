"""The fenced state changes of one attempt, and the one writer of attempt rows.

Every write made on behalf of an attempt is one of the catalogue's fenced
statements (:meth:`Statements.fenced`: ``id`` and ``attempt`` must still hold
an active lease), run through :func:`fenced`. An attempt that lost its lease
(reclaimed after it expired, timed out, finished elsewhere) changes nothing,
which is what "finalized exactly once" means in practice. How each attempt
ended goes into the attempts table through :func:`record_attempts` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Update

from .context import Context

__all__ = ["AttemptRow", "attempt_row", "fenced", "outcome_column", "record_attempts"]

_OUTCOME_WIDTH = 64  # the attempts.outcome column


@dataclass(slots=True)
class AttemptRow:
    """How one attempt of a job ended: ``outcome`` is short (``ok``, ``timeout``, ``lease expired``...), ``detail`` free text.

    Not frozen: one or more per job, see :mod:`~dbexecutor.records`.
    """

    job_id: int
    attempt: int
    worker: str | None
    started_at: float | None
    ended_at: float
    outcome: str
    detail: str | None = None


def fenced(conn: Connection, stmt: Update, job_id: int, attempt: int, **params: Any) -> bool:
    """Run the fenced ``stmt`` for ``(job_id, attempt)``; True if that attempt still held its lease and the row changed."""
    values = {f"p_{name}": value for name, value in params.items()}
    return bool(conn.execute(stmt, {"p_id": job_id, "p_attempt": attempt, **values}).rowcount == 1)


def outcome_column(outcome: str) -> str:
    """``outcome`` as the attempts table stores it (cut to the column's width)."""
    return outcome[:_OUTCOME_WIDTH]


def attempt_row(r: AttemptRow) -> dict[str, Any]:
    """``r`` as the columns of its row in the attempts table."""
    return {
        "job_id": r.job_id,
        "attempt": r.attempt,
        "worker": r.worker,
        "started_at": r.started_at,
        "ended_at": r.ended_at,
        "outcome": outcome_column(r.outcome),
        "detail": r.detail,
    }


def record_attempts(ctx: Context, conn: Connection, rows: Sequence[AttemptRow]) -> None:
    """Write attempt rows (one statement where the database allows)."""
    ctx.driver.insert_rows(conn, ctx.tables.attempts, [attempt_row(r) for r in rows])
