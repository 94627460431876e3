"""Statements of the leases: renewals, progress and stop requests of running jobs, release and reclaim.

``store.leases`` renews, releases and reclaims expired leases;
``store.control`` writes progress and asks running jobs to stop.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Select, Update, case, select, update

from ... import schema
from .base import BACK_TO_READY, StatementsBase, _p

__all__ = ["LeaseStatements"]


class LeaseStatements(StatementsBase):
    """The statements on the leases of leased and running jobs."""

    @cached_property
    def renew_leases(self) -> Update:
        """Extend to ``p_expires`` the leases of the (id, attempt) pairs bound as ``p_held`` (``driver.pairs``) not asked to stop; the ids in ``p_started`` become running."""
        j = self.tables.jobs
        running = case((self._ids(j.c.id, "started"), schema.RUNNING), else_=j.c.state)
        return (
            update(j)
            # A job asked to stop is left out: the short count makes its owner
            # read why (active_tokens), so a renewal costs no extra read otherwise.
            .where(self.driver.in_pairs(j.c.id, j.c.attempt, "p_held"), self.active, j.c.terminate_requested.is_(None))
            .values(lease_expires=_p("expires"), state=running)
        )

    @cached_property
    def active_tokens(self) -> Select[Any]:
        """Id, token and stop request of the leased or running rows among ``p_ids``."""
        j = self.tables.jobs
        return select(j.c.id, j.c.attempt, j.c.terminate_requested).where(self._ids(j.c.id), self.active)

    @cached_property
    def set_progress(self) -> Update:
        """Attempt ``p_attempt`` of job ``p_id`` reports ``p_progress`` and ``p_message`` at ``p_now`` (run as an executemany)."""
        j = self.tables.jobs
        return (
            update(j)
            .where(j.c.id == _p("id"), j.c.attempt == _p("attempt"), self.active)
            .values(progress=_p("progress", j.c.progress), progress_message=_p("message", j.c.progress_message), progress_at=_p("now"))
        )

    @cached_property
    def request_stop(self) -> Update:
        """Ask the owners of the leased or running jobs among ``p_ids`` to stop them (at ``p_now``), once."""
        j = self.tables.jobs
        return (
            update(j)
            .where(self._ids(j.c.id), self.active, j.c.terminate_requested.is_(None))
            .values(terminate_requested=_p("now"))
        )

    @cached_property
    def job_states(self) -> Select[Any]:
        """Id, state and stop request of jobs ``p_ids``."""
        j = self.tables.jobs
        return select(j.c.id, j.c.state, j.c.terminate_requested).where(self._ids(j.c.id))

    @cached_property
    def release(self) -> Update:
        """Attempt ``p_attempt`` of job ``p_id`` gives its lease back: the job is ready for anyone (fenced; not if asked to stop)."""
        values = {k: v for k, v in BACK_TO_READY.items() if k != "state"}
        return self.fenced(schema.READY, self.tables.jobs.c.terminate_requested.is_(None), **values)

    @cached_property
    def expired_locked(self) -> Select[Any]:
        """Leased or running rows whose lease expired before ``p_now``, locked (skipping rows others hold)."""
        j = self.tables.jobs
        return self.driver.for_claim(
            select(j.c.id, j.c.attempt, j.c.lease_owner, j.c.started_at, j.c.terminate_requested)
            .where(self.active, j.c.lease_expires < _p("now"))
        )

    @cached_property
    def reclaim(self) -> Update:
        """Rows ``p_ids`` whose lease (still) expired before ``p_now``, not asked to stop: back to ready."""
        j = self.tables.jobs
        return (
            update(j)
            .where(self._ids(j.c.id), self.active, j.c.lease_expires < _p("now"), j.c.terminate_requested.is_(None))
            .values(**BACK_TO_READY)
        )
