"""Statements of the finish: how an attempt ended (done, retried, stopped, failed, refused).

Each is fenced by the attempt's lease (``StatementsBase.fenced``), so an
attempt that lost it changes nothing (``store.finish``; the driver's
``finish_done`` runs ``mark_done``).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Select, Update, select

from ... import schema
from .base import BACK_TO_READY, StatementsBase, _p

__all__ = ["FinishStatements"]


class FinishStatements(StatementsBase):
    """The fenced writes that record how an attempt ended, and the reads a short count needs."""

    @cached_property
    def mark_done(self) -> Update:
        """Attempt ``p_attempt`` of job ``p_id`` succeeded: done, with result ``p_result`` (fenced)."""
        return self.fenced(
            schema.DONE, result=_p("result"), error=None, finished_at=_p("now"), lease_owner=None, lease_expires=None
        )

    @cached_property
    def done_tokens(self) -> Select[Any]:
        """Id and token of the done rows among ``p_ids`` (which rows a short-counted finish did finish)."""
        j = self.tables.jobs
        return select(j.c.id, j.c.attempt).where(self._ids(j.c.id), schema.state_is(j.c.state, schema.DONE))

    @cached_property
    def retry_attempt(self) -> Update:
        """Attempt ``p_attempt`` failed and retries are left: back to ready after ``p_run_after`` (fenced)."""
        j = self.tables.jobs
        values = {k: v for k, v in BACK_TO_READY.items() if k != "state"}
        return self.fenced(
            schema.READY, j.c.retries >= _p("attempt"), j.c.terminate_requested.is_(None),
            error=_p("error"), run_after=_p("run_after"), **values,
        )

    @cached_property
    def stop_attempt(self) -> Update:
        """Attempt ``p_attempt`` was stopped on request (its process tree killed): cancelled, with ``p_error`` (fenced)."""
        return self.fenced(
            schema.CANCELLED, error=_p("error"), finished_at=_p("now"), lease_owner=None, lease_expires=None
        )

    @cached_property
    def fail_attempt(self) -> Update:
        """Attempt ``p_attempt`` failed for good: failed, with exception ``p_result`` (fenced)."""
        return self.fenced(
            schema.FAILED, result=_p("result"), error=_p("error"), finished_at=_p("now"), lease_owner=None, lease_expires=None
        )

    @cached_property
    def refuse(self) -> Update:
        """Attempt ``p_attempt`` could not load the job: back to ready for another executor, its retry budget kept (fenced)."""
        j = self.tables.jobs
        values = {k: v for k, v in BACK_TO_READY.items() if k != "state"}
        return self.fenced(schema.READY, retries=j.c.retries + 1, **values)

    @cached_property
    def attempts_of(self) -> Select[Any]:
        """``(job_id, attempt, worker, outcome)`` of every attempt row of the jobs ``p_ids`` (what a try before recorded)."""
        a = self.tables.attempts
        return select(a.c.job_id, a.c.attempt, a.c.worker, a.c.outcome).where(self._ids(a.c.job_id))

    @cached_property
    def refusals(self) -> Select[Any]:
        """Who refused job ``p_id`` before, and why (its ``refused`` attempts)."""
        a = self.tables.attempts
        return select(a.c.worker, a.c.detail).where(a.c.job_id == _p("id"), a.c.outcome == "refused").order_by(a.c.id)
