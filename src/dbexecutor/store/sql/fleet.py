"""Statements of the registry of executors: register, beat, stop, list, wake, rescue, forget.

``store.fleet`` registers executors and their heartbeats, lists them,
finds the ones to wake, rescues the jobs of dead ones and forgets
registrations long dead.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Select, Update, delete, exists, func, insert, select, update

from .base import BACK_TO_READY, StatementsBase, _p

__all__ = ["FleetStatements"]


class FleetStatements(StatementsBase):
    """The statements on the executors table, and on the jobs that executors hold."""

    @cached_property
    def register(self) -> Any:
        """Register an executor: ``p_name``, ``p_kind``, ``p_host``, ``p_pid``, ... alive until ``p_expires``."""
        e = self.tables.executors
        names = (
            "name", "kind", "host", "pid", "pid_started", "version", "slots", "queues", "wake", "started_at", "last_beat", "expires",
        )
        return insert(e).values(**{n: _p(n, e.c[n]) for n in names})

    @cached_property
    def executor_beat(self) -> Update:
        """Executor ``p_name`` is alive at ``p_now``, until ``p_expires`` (it also undoes a wrong "found dead")."""
        e = self.tables.executors
        return update(e).where(e.c.name == _p("name")).values(last_beat=_p("now"), expires=_p("expires"), stopped_at=None)

    @cached_property
    def executor_stopped(self) -> Update:
        """Executor ``p_name`` stopped (or was found dead) at ``p_now``."""
        e = self.tables.executors
        return (
            update(e)
            .where(e.c.name == _p("name"), e.c.stopped_at.is_(None))
            .values(stopped_at=_p("now"), expires=_p("now"))
        )

    @cached_property
    def executors_listed(self) -> Select[Any]:
        """Every registered executor with the number of jobs it holds, newest first."""
        e, j = self.tables.executors, self.tables.jobs
        held = select(func.count()).where(j.c.lease_owner == e.c.name, self.active).scalar_subquery()
        return select(e, held.label("running")).order_by(e.c.started_at.desc(), e.c.id.desc())

    @cached_property
    def executors_here(self) -> Select[Any]:
        """The executors on host ``p_host`` not known to have stopped: name, pid and its start time."""
        e = self.tables.executors
        return select(e.c.name, e.c.pid, e.c.pid_started).where(e.c.host == _p("host"), e.c.stopped_at.is_(None))

    @cached_property
    def jobs_held_by(self) -> Select[Any]:
        """The leased or running jobs of the executors ``p_names``, locked (skipping rows others hold)."""
        j = self.tables.jobs
        return self.driver.for_claim(
            select(j.c.id, j.c.attempt, j.c.lease_owner, j.c.started_at, j.c.terminate_requested)
            .where(self.active, j.c.lease_owner.in_(_p("names", expanding=True)))
        )

    @cached_property
    def rescue(self) -> Update:
        """Jobs ``p_ids`` that a dead executor among ``p_names`` still holds, not asked to stop: back to ready."""
        j = self.tables.jobs
        return (
            update(j)
            .where(
                self._ids(j.c.id), self.active, j.c.lease_owner.in_(_p("names", expanding=True)),
                j.c.terminate_requested.is_(None),
            )
            .values(**BACK_TO_READY)
        )

    @cached_property
    def forget_executors(self) -> Any:
        """Delete registrations dead since before ``p_cutoff`` that hold no job."""
        e, j = self.tables.executors, self.tables.jobs
        holds = exists().where(j.c.lease_owner == e.c.name, self.active)
        return delete(e).where(e.c.expires < _p("cutoff"), ~holds)

    @cached_property
    def another_alive(self) -> Select[Any]:
        """The name of one executor other than ``p_name`` alive at ``p_now`` (none: nobody else hears a notification)."""
        e = self.tables.executors
        return select(e.c.name).where(e.c.stopped_at.is_(None), e.c.expires > _p("now"), e.c.name != _p("name")).limit(1)

    @cached_property
    def wake_addresses(self) -> Select[Any]:
        """Name and wake address of every executor alive at ``p_now`` that can be woken."""
        e = self.tables.executors
        return select(e.c.name, e.c.wake).where(e.c.stopped_at.is_(None), e.c.expires > _p("now"), e.c.wake.is_not(None))
