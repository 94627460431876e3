"""Statements of what executors read back: final states, results, one job's state, counts.

``store.reads`` runs them (and ``store.admin``'s status, the counts).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Select, func, select

from ... import schema
from .base import StatementsBase, _p

__all__ = ["ReadStatements"]


class ReadStatements(StatementsBase):
    """What executors (and the store's status) read back."""

    @cached_property
    def created_at(self) -> Select[Any]:
        """Job ``p_id`` if it was created at ``p_now`` (whether a write whose ``COMMIT`` did not answer was made)."""
        j = self.tables.jobs
        return select(j.c.id).where(j.c.id == _p("id"), j.c.created_at == _p("now", j.c.created_at))

    @cached_property
    def created_by(self) -> Select[Any]:
        """``(id, state, result, fn_name)`` of the jobs ``p_by`` created at ``p_now``, by id (a one-statement submit whose answer was lost)."""
        j = self.tables.jobs
        return (
            select(j.c.id, j.c.state, j.c.result, j.c.fn_name)
            .where(j.c.created_at == _p("now", j.c.created_at), j.c.submitted_by == _p("by"))
            .order_by(j.c.id)
        )

    @cached_property
    def held_by(self) -> Select[Any]:
        """Job ``p_id`` if ``p_owner`` holds its lease at attempt ``p_attempt`` (whether a claim whose ``COMMIT`` did not answer was made)."""
        j = self.tables.jobs
        return select(j.c.id).where(j.c.id == _p("id"), j.c.attempt == _p("attempt"), j.c.lease_owner == _p("owner"))

    @cached_property
    def finals(self) -> Select[Any]:
        """State and result of the finished jobs among ``p_ids``."""
        j = self.tables.jobs
        return select(j.c.id, j.c.state, j.c.result).where(self._ids(j.c.id), self.final)

    @cached_property
    def results(self) -> Select[Any]:
        """Result pickles of the done jobs among ``p_ids``."""
        j = self.tables.jobs
        return select(j.c.id, j.c.result).where(self._ids(j.c.id), schema.state_is(j.c.state, schema.DONE))

    @cached_property
    def upstream_results(self) -> Select[Any]:
        """``(job_id, upstream id, result)`` for every done upstream job of the jobs ``p_ids``."""
        j, d = self.tables.jobs, self.tables.deps
        return (
            select(d.c.job_id, j.c.id, j.c.result)
            .join(j, j.c.id == d.c.depends_on_id)
            .where(self._ids(d.c.job_id), schema.state_is(j.c.state, schema.DONE))
        )

    @cached_property
    def job_state(self) -> Select[Any]:
        """Job ``p_id``'s state and result."""
        j = self.tables.jobs
        return select(j.c.state, j.c.result).where(j.c.id == _p("id"))

    @cached_property
    def id_for_key(self) -> Select[Any]:
        """The id of the job with key ``p_key``."""
        j = self.tables.jobs
        return select(j.c.id).where(j.c.job_key == _p("key"))

    @cached_property
    def count_states(self) -> Select[Any]:
        """Number of jobs per state."""
        j = self.tables.jobs
        return select(j.c.state, func.count()).group_by(j.c.state)

    @cached_property
    def count_queue_states(self) -> Select[Any]:
        """Number of jobs per queue and state."""
        j = self.tables.jobs
        return select(j.c.queue, j.c.state, func.count()).group_by(j.c.queue, j.c.state)

    @cached_property
    def count_group_states(self) -> Select[Any]:
        """Number of jobs per group and state."""
        j = self.tables.jobs
        return select(j.c.group_key, j.c.state, func.count()).group_by(j.c.group_key, j.c.state)

    @cached_property
    def unfinished_ids(self) -> Select[Any]:
        """Ids of every job not in a final state, oldest first."""
        j = self.tables.jobs
        return select(j.c.id).where(j.c.state.not_in(schema.FINAL_STATES)).order_by(j.c.id)

    @cached_property
    def ids_in_state(self) -> Select[Any]:
        """Ids of every job in state ``p_state``, oldest first."""
        j = self.tables.jobs
        return select(j.c.id).where(j.c.state == _p("state")).order_by(j.c.id)
