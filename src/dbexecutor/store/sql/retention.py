"""Statements of retention: finished jobs that no dependent still needs, deleted with their attempts and edges.

``store.admin``'s purge reads the candidates, locks them, reads again which
a dependent still needs, then deletes the rest.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Integer, Select, delete, or_, select

from ... import schema
from .base import StatementsBase, _p

__all__ = ["RetentionStatements"]


class RetentionStatements(StatementsBase):
    """The statements of a purge of finished jobs."""

    def _keeps(self, downstream: Any) -> Any:
        """A dependent that still needs its upstream: unfinished, or finished at or after ``p_cutoff``."""
        return or_(
            downstream.c.state.not_in(schema.FINAL_STATES),
            downstream.c.finished_at.is_(None),
            downstream.c.finished_at >= _p("cutoff"),
        )

    @cached_property
    def purge_candidates(self) -> Select[Any]:
        """Up to ``p_limit`` jobs finished before ``p_cutoff`` that no job still needs, oldest first."""
        j, d = self.tables.jobs, self.tables.deps
        dj = j.alias("downstream")
        needed = select(d.c.job_id).join(dj, dj.c.id == d.c.job_id).where(d.c.depends_on_id == j.c.id, self._keeps(dj))
        return (
            select(j.c.id)
            .where(self.final, j.c.finished_at < _p("cutoff"), ~needed.exists())
            .order_by(j.c.id)
            .limit(_p("limit", type_=Integer))
        )

    @cached_property
    def purge_lock(self) -> Select[Any]:
        """The candidates ``p_ids`` still finished before ``p_cutoff``, locked (skipping rows others hold)."""
        j = self.tables.jobs
        return self.driver.for_claim(select(j.c.id).where(self._ids(j.c.id), self.final, j.c.finished_at < _p("cutoff")))

    @cached_property
    def purge_blocked(self) -> Select[Any]:
        """The locked candidates ``p_ids`` that a dependent still needs (re-read after the lock)."""
        j, d = self.tables.jobs, self.tables.deps
        dj = j.alias("downstream")
        return select(d.c.depends_on_id).join(dj, dj.c.id == d.c.job_id).where(self._ids(d.c.depends_on_id), self._keeps(dj))

    @cached_property
    def delete_attempts(self) -> Any:
        """Delete the attempts of jobs ``p_ids``."""
        a = self.tables.attempts
        return delete(a).where(self._ids(a.c.job_id))

    @cached_property
    def delete_edges(self) -> Any:
        """Delete every edge into or out of jobs ``p_ids``."""
        d = self.tables.deps
        return delete(d).where(or_(self._ids(d.c.job_id), self._ids(d.c.depends_on_id)))

    @cached_property
    def delete_jobs(self) -> Any:
        """Delete the finished jobs among ``p_ids``."""
        j = self.tables.jobs
        return delete(j).where(self._ids(j.c.id), self.final)
