"""Statements of the submit: a job by key, a new job's upstream rows locked, and leasing on insert.

``insert_leased`` inserts a job leased to its submitter when the
submitter's claim could pick nothing else, read in the insert's own
statement (``store.submit``); rows and edges go in through the driver.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Select, and_, case, exists, insert, literal_column, select

from ... import schema
from .base import StatementsBase, _p

__all__ = ["SubmitStatements"]


class SubmitStatements(StatementsBase):
    """What a submit reads and writes besides its plain inserts (the driver's)."""

    @cached_property
    def job_by_key(self) -> Select[Any]:
        """The job with key ``p_key``: id, state, result."""
        j = self.tables.jobs
        return select(j.c.id, j.c.state, j.c.result).where(j.c.job_key == _p("key"))

    @cached_property
    def lock_upstream(self) -> Select[Any]:
        """Upstream rows ``p_ids``, locked in id order: state, finish time, and the result of failed ones.

        A failed row's result is what its dependent inherits; a fan-in over
        large results does not load the others.
        """
        j = self.tables.jobs
        failed_result = case((schema.state_is(j.c.state, schema.FAILED), j.c.result)).label("result")
        stmt = select(j.c.id, j.c.state, failed_result, j.c.finished_at).where(self._ids(j.c.id)).order_by(j.c.id)
        return self.driver.for_update(stmt)

    def free_for(self, scope: tuple[bool, bool] = (False, False)) -> Select[Any]:
        """One row ``free``: 1 if nothing in the claim's scope is runnable and group ``p_group`` has no concurrency limit."""
        j = self.tables.jobs
        stmt: Select[Any] = self._variant(
            "free_for", scope, lambda: self._free_select(_p("group", j.c.group_key), _p("now", j.c.started_at), scope)
        )
        return stmt

    def _free_select(self, group: Any, now: Any, scope: tuple[bool, bool]) -> Select[Any]:
        g = self.tables.groups
        other_work = exists().where(self.runnable(now, scope))
        limited = exists().where(g.c.name == group, g.c.max_running.is_not(None))
        return select(case((and_(~other_work, ~limited), 1), else_=0).label("free"))

    #: The columns of a job row that :meth:`insert_leased` takes as ``p_<name>``.
    LEASED_INSERT_COLUMNS = (
        "fn_name", "payload", "queue", "priority", "timeout", "retries", "retry_delay", "arg_refs", "run_after",
        "submitted_by", "created_at",
    )

    def insert_leased(self, scope: tuple[bool, bool] = (False, False)) -> Any:
        """INSERT one runnable job, leased to ``p_owner`` if its claim could pick nothing else, else ready.

        That is: no other row in the claim's scope is runnable (so the job is
        every group's best pick and no other group is owed a turn), and its
        group has no concurrency limit (a limit is counted under the group's
        row lock, which the claim takes). Both are read in the insert's own statement.
        """
        return self._variant("insert_leased", scope, lambda: self._insert_leased(scope))

    def _insert_leased(self, scope: tuple[bool, bool]) -> Any:
        j = self.tables.jobs
        group = _p("group", j.c.group_key)
        now = _p("now", j.c.started_at)
        # OFFSET 0 keeps ``f`` a subquery of its own. Pulled up into the outer
        # SELECT, its CASE (two EXISTS) was copied into each of the five places
        # that read ``f.free``, and PostgreSQL planned, and could run, both
        # subqueries five times: 0.33 ms of planning per submit against 0.10.
        free = self._free_select(group, now, scope).offset(0).subquery("f")
        mine = free.c.free == 1
        columns: dict[str, Any] = {name: _p(name, j.c[name]) for name in self.LEASED_INSERT_COLUMNS}
        columns["group_key"] = group
        columns.update(
            state=case((mine, literal_column(f"'{schema.LEASED}'")), else_=literal_column(f"'{schema.READY}'")),
            attempt=free.c.free,
            lease_owner=case((mine, _p("owner", j.c.lease_owner))),
            lease_expires=case((mine, _p("expires", j.c.lease_expires))),
            started_at=case((mine, now)),
        )
        return insert(j).from_select(list(columns), select(*columns.values()).select_from(free))
