"""What every part of the catalogue stands on: the scope of a claim, how parameters and states
are spelled, and :class:`StatementsBase`, which holds the tables and the driver, the
statements built per kind of scope, and the conditions and the fenced update the parts share.

The statements themselves are in this package's modules, one per operation;
:class:`~dbexecutor.store.sql.Statements` is made of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Update, and_, bindparam, or_, update

from ... import schema
from ...dialects import Driver

__all__ = ["StatementsBase", "Scope", "DEFAULT_SCOPE", "BACK_TO_READY"]


@dataclass(frozen=True)
class Scope:
    """Which runnable rows a claim may take: those of ``queues`` (None: every queue), minus the functions in ``skip``.

    The claim's statements come in a variant per kind of scope (every queue or
    a list; functions skipped or not), each built once; the lists themselves
    are parameters (``p_queues``, ``p_skip``).
    """

    queues: tuple[str, ...] | None = ()
    skip: frozenset[str] = frozenset()

    @property
    def key(self) -> tuple[bool, bool]:
        """Which variant of the claim's statements serves this scope."""
        return self.queues is None, bool(self.skip)

    def params(self) -> dict[str, Any]:
        """The scope's lists as the statements' parameters."""
        out: dict[str, Any] = {}
        if self.queues is not None:
            out["p_queues"] = list(self.queues)
        if self.skip:
            out["p_skip"] = sorted(self.skip)
        return out

    def serves(self, queue: str) -> bool:
        """Whether a job of ``queue`` is in this scope (functions aside)."""
        return self.queues is None or queue in self.queues


#: A scope for code that claims without queues (tests and tools): the default queue.
DEFAULT_SCOPE = Scope((schema.DEFAULT_QUEUE,))

#: What every "back to ready" writes besides the state: the lease is gone, and
#: with it what the attempt said about its progress.
BACK_TO_READY: dict[str, Any] = {
    "state": schema.READY, "lease_owner": None, "lease_expires": None,
    "progress": None, "progress_message": None, "progress_at": None,
}


def _p(name: str, column: Any = None, **kw: Any) -> Any:
    """The parameter ``p_<name>``, typed like ``column`` if one is given."""
    if column is not None:
        kw["type_"] = column.type
    return bindparam(f"p_{name}", **kw)


class StatementsBase:
    """What every part of :class:`~dbexecutor.store.sql.Statements` stands on.

    The tables and the driver, the statements built once per kind of scope
    (``_variant``), the conditions on a job's state (``ready``, ``active``,
    ``final``, ``pending``), and the forms the parts share (``runnable``,
    ``fenced``, lists of ids, the jobs' index names).
    """

    def __init__(self, tables: schema.Tables, driver: Driver) -> None:
        self.tables = tables
        self.driver = driver
        self._variants: dict[tuple[Any, ...], Any] = {}  # statements built per scope kind (see Scope)
        j = tables.jobs
        self.ready = schema.state_is(j.c.state, schema.READY)
        self.active = schema.states_in(j.c.state, schema.ACTIVE_STATES)
        self.final = schema.states_in(j.c.state, schema.FINAL_STATES)
        self.pending = schema.states_in(j.c.state, schema.PENDING_STATES)

    def runnable(self, now: Any, scope: tuple[bool, bool] | None = None) -> Any:
        """Ready, and not held back by ``run_after``; within a claim's scope (``Scope.key``) if one is given."""
        j = self.tables.jobs
        cond = and_(self.ready, or_(j.c.run_after.is_(None), j.c.run_after <= now))
        if scope is not None:
            every_queue, skip = scope
            if not every_queue:
                cond = and_(cond, self.driver.in_names(j.c.queue, "p_queues"))
            if skip:
                cond = and_(cond, ~self.driver.in_names(j.c.fn_name, "p_skip"))
        return cond

    def _variant(self, name: str, scope: tuple[bool, bool], build: Any) -> Any:
        stmt = self._variants.get((name, scope))
        if stmt is None:
            stmt = self._variants[(name, scope)] = build()
        return stmt

    def _ids(self, column: Any, name: str = "ids") -> Any:
        return self.driver.in_ids(column, f"p_{name}")

    def fenced(self, to_state: str, *extra: Any, **values: Any) -> Update:
        """The one form of a guarded state change: ``(p_id, p_attempt)`` must still hold an active lease.

        Every write on behalf of an attempt (finish, fail, retry, release)
        goes through this, so an attempt that lost its lease (reclaimed, timed
        out, finished elsewhere) changes nothing.
        """
        j = self.tables.jobs
        return (
            update(j)
            .where(j.c.id == _p("id"), j.c.attempt == _p("attempt"), self.active, *extra)
            .values(state=to_state, **values)
        )

    # Here rather than with the claim's statements: the operators' lists are read along the jobs' indexes too.
    def _jobs_index(self, suffix: str) -> str:
        """The name of the jobs table's index ``ix_jobs_<suffix>`` (prefixed as the table is)."""
        return f"{self.tables.jobs.name[: -len('jobs')]}ix_jobs_{suffix}"
