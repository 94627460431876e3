"""Statements of a retry of a finished job (its revival): the rows read and locked, then the job's outcome cleared.

``store.dag``'s ``revive`` locks the job and its upstream, then puts the job
back to the state it decided (waiting or ready), with a new retry budget.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Integer, Select, Update, select, update

from .base import StatementsBase, _p

__all__ = ["ReviveStatements"]


class ReviveStatements(StatementsBase):
    """The statements of reviving a finished job for another run."""

    @cached_property
    def job_for_retry(self) -> Select[Any]:
        """Job ``p_id``'s state, token, inherited failure and batch flag, locked."""
        j = self.tables.jobs
        return self.driver.for_update(
            select(j.c.id, j.c.state, j.c.attempt, j.c.failed_upstream, j.c.batch).where(j.c.id == _p("id"))
        )

    @cached_property
    def upstream_ids(self) -> Select[Any]:
        """The jobs job ``p_id`` depends on."""
        d = self.tables.deps
        return select(d.c.depends_on_id).where(d.c.job_id == _p("id"))

    @cached_property
    def states_locked(self) -> Select[Any]:
        """Id and state of jobs ``p_ids``, locked in id order."""
        j = self.tables.jobs
        return self.driver.for_update(select(j.c.id, j.c.state).where(self._ids(j.c.id)).order_by(j.c.id))

    @cached_property
    def revive(self) -> Update:
        """Job ``p_id``, still ``p_old_state`` with token ``p_attempt``, back to ``p_state`` with ``p_retries`` allowed; its outcome cleared."""
        j = self.tables.jobs
        return (
            update(j)
            .where(j.c.id == _p("id"), j.c.state == _p("old_state"), j.c.attempt == _p("attempt"))
            .values(
                state=_p("state"), open_deps=_p("open_deps", type_=Integer), retries=_p("retries", type_=Integer),
                result=None, error=None, failed_upstream=None, finished_at=None, run_after=None,
                lease_owner=None, lease_expires=None, progress=None, progress_message=None, progress_at=None,
                terminate_requested=None,
            )
        )
