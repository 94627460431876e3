"""Statements of the claim: which groups have runnable work, the fair share's bookkeeping, picking and leasing rows.

The bookkeeping is the running count per group and the virtual times
(``store.claim``); ``Driver.lease_rows`` runs the pick and the lease, in
one statement where the database has ``UPDATE ... RETURNING``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Integer, Select, Update, exists, func, select, update
from sqlalchemy.sql.util import ClauseAdapter

from ... import schema
from ...dialects.base import CLAIMED_COLUMNS
from .base import StatementsBase, _p

__all__ = ["ClaimStatements"]


class ClaimStatements(StatementsBase):
    """The claim's statements, each variant of a scope built once."""

    def runnable_groups(self, scope: tuple[bool, bool] = (False, False)) -> Select[Any]:
        """The groups with runnable work in the claim's scope at ``p_now``: one probe of the ready index per group and queue, no locks."""
        g, j = self.tables.groups, self.tables.jobs

        def build() -> Select[Any]:
            # The group's best runnable row, in the ready index's order: every
            # planner then reads that index and stops at the first row. As an
            # EXISTS, PostgreSQL hashed every ready row into a semi-join and
            # SQLite and MariaDB, without fresh statistics, read the group's
            # rows of every state (ix_jobs_group): costs that grew with the backlog
            # or with every job ever finished.
            first = self._along_ready_index(
                select(j.c.id)
                .where(j.c.group_key == g.c.name, self.runnable(_p("now"), scope))
                .order_by(j.c.priority.desc(), j.c.id)
                .limit(1)
            ).scalar_subquery()
            return (
                select(g.c.name, g.c.weight, g.c.max_running, g.c.vtime).where(first.is_not(None)).order_by(g.c.name)
            )

        return self._variant("runnable_groups", scope, build)  # type: ignore[no-any-return]

    def runnable_groups_locked(self, scope: tuple[bool, bool] = (False, False)) -> Select[Any]:
        """:meth:`runnable_groups` with the groups' rows locked in name order: claims that share groups take turns."""
        return self._variant(  # type: ignore[no-any-return]
            "runnable_groups_locked", scope, lambda: self.driver.for_update(self.runnable_groups(scope))
        )

    @cached_property
    def running_per_group(self) -> Select[Any]:
        """Leased and running jobs of each group in ``p_groups`` (expanding list of names)."""
        j = self.tables.jobs
        return (
            select(j.c.group_key, func.count())
            .where(self.active, j.c.group_key.in_(_p("groups", expanding=True)))
            .group_by(j.c.group_key)
        )

    @cached_property
    def global_vtime_locked(self) -> Select[Any]:
        """The scheduler's global virtual time (the lowest among busy groups), locked."""
        meta = self.tables.meta
        return self.driver.for_update(select(meta.c.value).where(meta.c.name == "vtime"))

    @cached_property
    def set_group_vtime(self) -> Update:
        """Advance group ``p_name``'s virtual time to ``p_vtime`` (run as an executemany)."""
        g = self.tables.groups
        return update(g).where(g.c.name == _p("name")).values(vtime=_p("vtime"))

    @cached_property
    def set_global_vtime(self) -> Update:
        """Set the global virtual time to ``p_value``."""
        meta = self.tables.meta
        return update(meta).where(meta.c.name == "vtime").values(value=_p("value"))

    def pick(self, scope: tuple[bool, bool] = (False, False)) -> Select[Any]:
        """Group ``p_group``'s ``p_limit`` best runnable rows in the scope (priority, then age), locked, skipping rows another claim holds."""
        j = self.tables.jobs
        return self._variant(  # type: ignore[no-any-return]
            "pick",
            scope,
            lambda: self.driver.for_claim(
                self._along_ready_index(select(*self._claimed_columns(j)))
                .where(j.c.group_key == _p("group"), self.runnable(_p("now"), scope))
                .order_by(j.c.priority.desc(), j.c.id)
                # A parameter, not a constant: the number of free slots changes
                # from tick to tick, and a statement per number would be built anew.
                .limit(_p("limit", type_=Integer))
            ),
        )

    def pick_alone(self, scope: tuple[bool, bool] = (False, False)) -> Select[Any]:
        """:meth:`pick`, selecting nothing unless group ``p_group`` would be the claim's only choice.

        That is: it has no concurrency limit, and no other group has runnable
        work in the scope. Then its best rows are what the whole claim
        (:meth:`runnable_groups`, then :meth:`pick`) would lease, in one
        read fewer. The condition refers to no row of the pick: the database
        evaluates it once.
        """
        return self._variant(  # type: ignore[no-any-return]
            "pick_alone", scope, lambda: self.pick(scope).where(self._alone(scope))
        )

    def _alone(self, scope: tuple[bool, bool]) -> Any:
        """Group ``p_group`` has no limit, and no other group has a runnable row in the scope."""
        g, j = self.tables.groups.alias("alone_g"), self.tables.jobs.alias("alone_j")
        # The runnable_groups probe, over aliases: the pick reads the same tables.
        first = self.driver.along_index(
            select(j.c.id)
            .where(j.c.group_key == g.c.name, ClauseAdapter(j).traverse(self.runnable(_p("now"), scope)))
            .order_by(j.c.priority.desc(), j.c.id)
            .limit(1),
            j,
            self._jobs_index("ready_g"),
        ).scalar_subquery()
        limits = self.tables.groups.alias("alone_limit")
        return ~exists().where(g.c.name != _p("group"), first.is_not(None)) & ~exists().where(
            limits.c.name == _p("group"), limits.c.max_running.is_not(None)
        )

    def _along_ready_index(self, stmt: Select[Any]) -> Select[Any]:
        """A read of ready rows in the claim's order (group, priority, age), along the ready index."""
        return self.driver.along_index(stmt, self.tables.jobs, self._jobs_index("ready_g"))

    @staticmethod
    def _claimed_columns(j: Any) -> tuple[Any, ...]:
        """What a claim reads of each row it leases."""
        return tuple(j.c[name] for name in CLAIMED_COLUMNS)

    def _lease(self) -> Update:
        j = self.tables.jobs
        return update(j).values(
            state=schema.LEASED,
            attempt=j.c.attempt + 1,
            lease_owner=_p("owner"),
            lease_expires=_p("expires"),
            started_at=_p("now"),
        )

    def lease_picked(self, scope: tuple[bool, bool] = (False, False)) -> Update:
        """Lease to ``p_owner`` the rows :meth:`pick` selects and return them (databases with UPDATE ... RETURNING)."""
        return self._variant(  # type: ignore[no-any-return]
            "lease_picked", scope, lambda: self._lease_returning(self.pick(scope))
        )

    def lease_picked_alone(self, scope: tuple[bool, bool] = (False, False)) -> Update:
        """:meth:`lease_picked` of the rows :meth:`pick_alone` selects."""
        return self._variant(  # type: ignore[no-any-return]
            "lease_picked_alone", scope, lambda: self._lease_returning(self.pick_alone(scope))
        )

    def _lease_returning(self, pick: Select[Any]) -> Update:
        """Lease the rows ``pick`` selects, found by primary key, and return what a claim reads of them."""
        j = self.tables.jobs
        return (
            self._lease()
            .where(self.driver.id_in(j.c.id, pick.with_only_columns(j.c.id)))
            .returning(*self._claimed_columns(j))
        )

    @cached_property
    def lease_ids(self) -> Update:
        """Lease rows ``p_ids`` (just locked by :attr:`pick`) to ``p_owner``."""
        return self._lease().where(self._ids(self.tables.jobs.c.id))
