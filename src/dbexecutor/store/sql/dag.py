"""Statements of the DAG: edges out of finished jobs, dependents counted down, batches rolled up, cascades.

A finished job's dependents count down to ready, a full batch rolls up its
children's results, and a failure or a cancellation reaches the jobs that
have not started (``store.dag``).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Integer, Select, Update, case, select, update

from ... import schema
from .base import StatementsBase, _p

__all__ = ["DagStatements"]


class DagStatements(StatementsBase):
    """The statements that move dependents on when their upstream jobs finish, fail or are cancelled."""

    @cached_property
    def edges_out(self) -> Select[Any]:
        """``(job_id, depends_on_id, batch)`` of every edge out of the jobs ``p_ids`` (``batch``: the dependent's flag)."""
        return self.driver.edges_out(self.tables.deps, self.tables.jobs, "p_ids")

    @cached_property
    def edges_out_finished(self) -> Select[Any]:
        """:attr:`edges_out` of the jobs done at the attempts bound as the pairs ``p_done`` (``Driver.pairs``).

        As :attr:`count_down_finished`: the jobs the finish before it in the
        same transaction won, so that it can be sent with the finish.
        """
        return self.driver.edges_out_finished(self.tables.deps, self.tables.jobs, "p_done")

    @cached_property
    def count_down(self) -> Update:
        """Jobs ``p_ids`` (waiting) each had ``p_k`` upstream jobs finish: count down; at zero they are ready."""
        j = self.tables.jobs
        # state is assigned before open_deps: MySQL evaluates SET items left
        # to right with the new values, PostgreSQL and SQLite with the old.
        k = _p("k", type_=Integer)
        return (
            update(j)
            .where(self._ids(j.c.id), schema.state_is(j.c.state, schema.WAITING))
            .values(state=case((j.c.open_deps <= k, schema.READY), else_=j.c.state), open_deps=j.c.open_deps - k)
        )

    @cached_property
    def count_down_returning(self) -> Update:
        """Every waiting dependent of jobs ``p_ids``, counted down by its edges from them: ``(id, batch, open_deps)`` after.

        The edges' read and :attr:`count_down` (with the batches') in one
        statement, where ``UPDATE ... RETURNING`` tells which rows it changed:
        a chain's link is one round trip fewer. A plain job reaching zero
        becomes ready; a batch stays waiting (a full one is rolled up).
        """
        return self.driver.count_down_returning(self.tables.jobs, self.tables.deps, "p_ids")

    @cached_property
    def count_down_finished(self) -> Update:
        """:attr:`count_down_returning` of the jobs done at the attempts bound as the pairs ``p_done`` (``Driver.pairs``).

        The jobs the finish before it in the same transaction won, read by this
        statement: sent with the finish in one pipeline, it needs nothing of its answer.
        """
        return self.driver.count_down_finished(self.tables.jobs, self.tables.deps, "p_done")

    @cached_property
    def count_down_batches(self) -> Update:
        """Batches ``p_ids`` each had ``p_k`` children finish: count down (a batch stays waiting; it is rolled up)."""
        j = self.tables.jobs
        k = _p("k", type_=Integer)
        return update(j).where(self._ids(j.c.id), schema.state_is(j.c.state, schema.WAITING)).values(open_deps=j.c.open_deps - k)

    @cached_property
    def full_batches(self) -> Select[Any]:
        """The batches among ``p_ids`` still waiting with every child done (to roll up)."""
        j = self.tables.jobs
        return select(j.c.id).where(self._ids(j.c.id), j.c.batch == 1, schema.state_is(j.c.state, schema.WAITING), j.c.open_deps <= 0)

    @cached_property
    def batch_children(self) -> Select[Any]:
        """Batch ``p_id``'s children: id and result, in submission order."""
        j, d = self.tables.jobs, self.tables.deps
        return (
            select(j.c.id, j.c.result)
            .select_from(d.join(j, j.c.id == d.c.depends_on_id))
            .where(d.c.job_id == _p("id"))
            .order_by(d.c.position)
        )

    @cached_property
    def roll_up(self) -> Update:
        """Batch ``p_id`` (waiting) ends as ``p_state`` with ``p_result`` (its children's results, or the error)."""
        j = self.tables.jobs
        return (
            update(j)
            .where(j.c.id == _p("id"), schema.state_is(j.c.state, schema.WAITING))
            .values(state=_p("state"), result=_p("result"), error=_p("error"), finished_at=_p("now"), open_deps=0)
        )

    @cached_property
    def pending_locked(self) -> Select[Any]:
        """The waiting or ready jobs among ``p_ids``, locked (the ones a cascade may still change)."""
        j = self.tables.jobs
        return self.driver.for_update(select(j.c.id).where(self._ids(j.c.id), self.pending))

    @cached_property
    def fail_pending(self) -> Update:
        """Jobs ``p_ids`` (waiting or ready) fail because job ``p_upstream`` failed: ``p_result`` is their exception."""
        j = self.tables.jobs
        return (
            update(j)
            .where(self._ids(j.c.id), self.pending)
            .values(
                state=schema.FAILED, result=_p("result"), error=_p("error"), finished_at=_p("now"),
                failed_upstream=_p("upstream", j.c.failed_upstream),
            )
        )

    @cached_property
    def cancel_pending(self) -> Update:
        """Jobs ``p_ids`` that have not started are cancelled."""
        j = self.tables.jobs
        return update(j).where(self._ids(j.c.id), self.pending).values(state=schema.CANCELLED, finished_at=_p("now"))

    @cached_property
    def pending_batch_children(self) -> Select[Any]:
        """The children of the batches among ``p_ids`` that have not finished (cancelling a batch cancels them)."""
        j, d = self.tables.jobs, self.tables.deps
        return (
            select(d.c.depends_on_id)
            .join(j, j.c.id == d.c.job_id)
            .where(self._ids(d.c.job_id), j.c.batch == 1, self.pending)
        )
