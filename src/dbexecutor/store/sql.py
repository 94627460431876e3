"""The catalogue: every statement the store runs, by name, with a line that says what it does.

Statements are built once per store (per table prefix and driver) and run
with bound parameters, all named ``p_*``: building and hashing a statement
costs more Python time than its round trip on a local server. Lists of ids
are one parameter (the driver decides how: an array, a JSON text, an
expanding ``IN``), so no statement's text depends on how many ids it gets.

Where a database can do an operation in fewer statements, the driver has its
own form next to these (``Driver.finish_done``, ``Driver.insert_rows``,
``Driver.insert_job_rows``); ``python -m dbexecutor.store.sql`` prints the
catalogue with each statement's SQL for one database.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from functools import cached_property
from typing import Any

from sqlalchemy import (
    Integer,
    Select,
    Update,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    tuple_,
    update,
)

from .. import schema
from ..dialects import Driver

__all__ = ["Statements", "Scope", "BACK_TO_READY", "THROUGHPUT_BUCKETS"]


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

#: Buckets of the throughput operators see (minutes, by default).
THROUGHPUT_BUCKETS = 15


def _states(column: Any, states: tuple[str, ...]) -> Any:
    # Literal values, not parameters: a partial index (state = 'ready') is only
    # usable when the planner sees the value, and a prepared statement's
    # generic plan then knows which states it reads.
    return column.in_([literal_column(f"'{s}'") for s in states])


def _p(name: str, column: Any = None, **kw: Any) -> Any:
    """The parameter ``p_<name>``, typed like ``column`` if one is given."""
    if column is not None:
        kw["type_"] = column.type
    return bindparam(f"p_{name}", **kw)


class Statements:
    """Every statement of one store, built on first use and kept (``cached_property``)."""

    def __init__(self, tables: schema.Tables, driver: Driver) -> None:
        self.tables = tables
        self.driver = driver
        self._variants: dict[tuple[Any, ...], Any] = {}  # statements built per scope kind (see Scope)
        j = tables.jobs
        self.ready = j.c.state == literal_column(f"'{schema.READY}'")
        self.active = _states(j.c.state, schema.ACTIVE_STATES)
        self.final = _states(j.c.state, schema.FINAL_STATES)
        self.pending = _states(j.c.state, schema.PENDING_STATES)

    def runnable(self, now: Any, scope: tuple[bool, bool] | None = None) -> Any:
        """Ready, and not held back by ``run_after``; within a claim's scope (``Scope.key``) if one is given."""
        j = self.tables.jobs
        cond = and_(self.ready, or_(j.c.run_after.is_(None), j.c.run_after <= now))
        if scope is not None:
            every_queue, skip = scope
            if not every_queue:
                cond = and_(cond, j.c.queue.in_(_p("queues", expanding=True)))
            if skip:
                cond = and_(cond, j.c.fn_name.not_in(_p("skip", expanding=True)))
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

    # -- schema ---------------------------------------------------------------------------------------

    @cached_property
    def schema_version(self) -> Select[Any]:
        """The recorded schema version (None on a database without one)."""
        meta = self.tables.meta
        return select(meta.c.value).where(meta.c.name == "schema_version")

    @cached_property
    def take_write_lock(self) -> Update:
        """A write that changes no row: on a single-writer database (SQLite) the transaction it runs in holds the write lock from then on."""
        meta = self.tables.meta
        return update(meta).where(literal_column("0") == literal_column("1")).values(value=meta.c.value)

    @cached_property
    def set_schema_version(self) -> Update:
        """Record schema version ``p_value``."""
        meta = self.tables.meta
        return update(meta).where(meta.c.name == "schema_version").values(value=_p("value"))

    # -- groups ---------------------------------------------------------------------------------------

    @cached_property
    def ensure_group(self) -> Any:
        """Create group ``p_name`` with weight ``p_weight`` unless it exists."""
        g = self.tables.groups
        return self.driver.insert_ignore(g).values(name=_p("name", g.c.name), weight=_p("weight", g.c.weight))

    @cached_property
    def set_group_weight(self) -> Update:
        """Give group ``p_name`` the weight ``p_weight`` (no write when it has it already)."""
        g = self.tables.groups
        return update(g).where(g.c.name == _p("name"), g.c.weight != _p("weight")).values(weight=_p("weight"))

    @cached_property
    def set_group_limit(self) -> Update:
        """Set group ``p_name``'s concurrency limit to ``p_limit`` (NULL: none; 0 pauses it)."""
        g = self.tables.groups
        return update(g).where(g.c.name == _p("name")).values(max_running=_p("limit", g.c.max_running))

    @cached_property
    def group(self) -> Select[Any]:
        """Group ``p_name``: weight, limit, virtual time."""
        g = self.tables.groups
        return select(g).where(g.c.name == _p("name"))

    @cached_property
    def groups(self) -> Select[Any]:
        """Every group, by name."""
        g = self.tables.groups
        return select(g).order_by(g.c.name)

    # -- submit ---------------------------------------------------------------------------------------

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
        failed_result = case((j.c.state == schema.FAILED, j.c.result)).label("result")
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

    # -- claim ----------------------------------------------------------------------------------------

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

    def _along_ready_index(self, stmt: Select[Any]) -> Select[Any]:
        """A read of ready rows in the claim's order (group, priority, age), along the ready index."""
        return self.driver.along_index(stmt, self.tables.jobs, self._jobs_index("ready_g"))

    def _jobs_index(self, suffix: str) -> str:
        """The name of the jobs table's index ``ix_jobs_<suffix>`` (prefixed as the table is)."""
        return f"{self.tables.jobs.name[: -len('jobs')]}ix_jobs_{suffix}"

    @staticmethod
    def _claimed_columns(j: Any) -> tuple[Any, ...]:
        """What a claim reads of each row it leases."""
        return (j.c.id, j.c.attempt, j.c.payload, j.c.fn_name, j.c.timeout, j.c.arg_refs, j.c.retry_delay, j.c.priority)

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
        j = self.tables.jobs
        return self._variant(  # type: ignore[no-any-return]
            "lease_picked",
            scope,
            lambda: self._lease()
            .where(self.driver.id_in(j.c.id, self.pick(scope).with_only_columns(j.c.id)))
            .returning(*self._claimed_columns(j)),
        )

    @cached_property
    def lease_ids(self) -> Update:
        """Lease rows ``p_ids`` (just locked by :attr:`pick`) to ``p_owner``."""
        return self._lease().where(self._ids(self.tables.jobs.c.id))

    # -- finish ---------------------------------------------------------------------------------------

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
        return select(j.c.id, j.c.attempt).where(self._ids(j.c.id), j.c.state == schema.DONE)

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
    def refusals(self) -> Select[Any]:
        """Who refused job ``p_id`` before, and why (its ``refused`` attempts)."""
        a = self.tables.attempts
        return select(a.c.worker, a.c.detail).where(a.c.job_id == _p("id"), a.c.outcome == "refused").order_by(a.c.id)

    # -- the DAG --------------------------------------------------------------------------------------

    @cached_property
    def edges_out(self) -> Select[Any]:
        """``(job_id, depends_on_id, batch)`` of every edge out of the jobs ``p_ids`` (``batch``: the dependent's flag)."""
        return self.driver.edges_out(self.tables.deps, self.tables.jobs, "p_ids")

    @cached_property
    def count_down(self) -> Update:
        """Jobs ``p_ids`` (waiting) each had ``p_k`` upstream jobs finish: count down; at zero they are ready."""
        j = self.tables.jobs
        # state is assigned before open_deps: MySQL evaluates SET items left
        # to right with the new values, PostgreSQL and SQLite with the old.
        k = _p("k", type_=Integer)
        return (
            update(j)
            .where(self._ids(j.c.id), j.c.state == schema.WAITING)
            .values(state=case((j.c.open_deps <= k, schema.READY), else_=j.c.state), open_deps=j.c.open_deps - k)
        )

    @cached_property
    def count_down_batches(self) -> Update:
        """Batches ``p_ids`` each had ``p_k`` children finish: count down (a batch stays waiting; it is rolled up)."""
        j = self.tables.jobs
        k = _p("k", type_=Integer)
        return update(j).where(self._ids(j.c.id), j.c.state == schema.WAITING).values(open_deps=j.c.open_deps - k)

    @cached_property
    def full_batches(self) -> Select[Any]:
        """The batches among ``p_ids`` still waiting with every child done (to roll up)."""
        j = self.tables.jobs
        return select(j.c.id).where(self._ids(j.c.id), j.c.batch == 1, j.c.state == schema.WAITING, j.c.open_deps <= 0)

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
            .where(j.c.id == _p("id"), j.c.state == schema.WAITING)
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

    # -- retry (revive) -------------------------------------------------------------------------------

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

    # -- leases ---------------------------------------------------------------------------------------

    @cached_property
    def renew_leases(self) -> Update:
        """Extend to ``p_expires`` the leases of ``p_held`` (id, attempt) pairs not asked to stop; the ids in ``p_started`` become running."""
        j = self.tables.jobs
        running = case((j.c.id.in_(_p("started", expanding=True)), schema.RUNNING), else_=j.c.state)
        return (
            update(j)
            # A job asked to stop is left out: the short count makes its owner
            # read why (active_tokens), so a renewal costs no extra read otherwise.
            .where(tuple_(j.c.id, j.c.attempt).in_(_p("held", expanding=True)), self.active, j.c.terminate_requested.is_(None))
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

    # -- the registry of executors --------------------------------------------------------------------

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
    def wake_addresses(self) -> Select[Any]:
        """Name and wake address of every executor alive at ``p_now`` that can be woken."""
        e = self.tables.executors
        return select(e.c.name, e.c.wake).where(e.c.stopped_at.is_(None), e.c.expires > _p("now"), e.c.wake.is_not(None))

    # -- reads ----------------------------------------------------------------------------------------

    @cached_property
    def finals(self) -> Select[Any]:
        """State and result of the finished jobs among ``p_ids``."""
        j = self.tables.jobs
        return select(j.c.id, j.c.state, j.c.result).where(self._ids(j.c.id), self.final)

    @cached_property
    def results(self) -> Select[Any]:
        """Result pickles of the done jobs among ``p_ids``."""
        j = self.tables.jobs
        return select(j.c.id, j.c.result).where(self._ids(j.c.id), j.c.state == schema.DONE)

    @cached_property
    def upstream_results(self) -> Select[Any]:
        """``(job_id, upstream id, result)`` for every done upstream job of the jobs ``p_ids``."""
        j, d = self.tables.jobs, self.tables.deps
        return (
            select(d.c.job_id, j.c.id, j.c.result)
            .join(j, j.c.id == d.c.depends_on_id)
            .where(self._ids(d.c.job_id), j.c.state == schema.DONE)
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

    # -- operators' reads -----------------------------------------------------------------------------

    @cached_property
    def running_jobs(self) -> Select[Any]:
        """Up to ``p_limit`` leased or running jobs, longest running first, with their progress."""
        j = self.tables.jobs
        return (
            select(
                j.c.id, j.c.fn_name, j.c.state, j.c.group_key, j.c.lease_owner, j.c.attempt, j.c.started_at,
                j.c.lease_expires, j.c.progress, j.c.progress_message, j.c.terminate_requested,
            )
            .where(self.active)
            .order_by(j.c.started_at, j.c.id)
            .limit(_p("limit", type_=Integer))
        )

    @cached_property
    def oldest_ready(self) -> Select[Any]:
        """The job that has been ready longest."""
        j = self.tables.jobs
        return (
            select(j.c.id, j.c.fn_name, j.c.group_key, j.c.created_at, j.c.run_after)
            .where(self.ready)
            .order_by(j.c.created_at, j.c.id)
            .limit(1)
        )

    def _filtered(self, stmt: Select[Any], **given: bool) -> Select[Any]:
        """``stmt`` narrowed by the filters named True.

        Their parameters: ``p_states`` (a list) or ``p_state`` (with ``listed`` when every state
        is one of ``schema.LISTED_STATES``), ``p_queue``, ``p_group``, ``p_function``
        (a LIKE pattern escaped with ``/``; with ``exact_function``, a name),
        ``p_key``, ``p_created_before``/``p_created_after`` (times),
        ``p_before``/``p_after`` (ids, for keyset paging).
        """
        j = self.tables.jobs
        conditions: dict[str, Callable[[], Any]] = {
            "states": lambda: j.c.state.in_(_p("states", expanding=True)),
            "state": lambda: j.c.state == _p("state"),
            # Repeats the partial state index's predicate (the states are all among
            # them), where a database reads a partial index only when the query says so.
            "listed": lambda: _states(j.c.state, schema.LISTED_STATES),
            "queue": lambda: j.c.queue == _p("queue"),
            "group": lambda: j.c.group_key == _p("group"),
            "function": lambda: j.c.fn_name.like(_p("function"), escape="/"),
            "exact_function": lambda: j.c.fn_name == _p("function"),
            "key": lambda: j.c.job_key == _p("key"),
            "created_before": lambda: j.c.created_at < _p("created_before"),
            "created_after": lambda: j.c.created_at >= _p("created_after"),
            "before": lambda: j.c.id < _p("before", type_=Integer),
            "after": lambda: j.c.id > _p("after", type_=Integer),
        }
        unknown = set(given) - set(conditions)
        if unknown:
            raise TypeError(f"unknown filters {sorted(unknown)}")
        if not self.driver.repeats_index_predicate:
            given = {**given, "listed": False}
        return stmt.where(*(conditions[name]() for name, on in given.items() if on))

    def list_jobs(self, *, after: bool = False, **given: bool) -> Select[Any]:
        """Jobs matching the filters named True (see ``_filtered``), ``p_limit`` of them, newest first (oldest first with ``after``)."""
        j = self.tables.jobs
        stmt = select(
            j.c.id, j.c.state, j.c.queue, j.c.group_key, j.c.fn_name, j.c.job_key, j.c.attempt, j.c.retries,
            j.c.created_at, j.c.finished_at, j.c.lease_owner, j.c.error, j.c.progress, j.c.progress_message,
        )
        # Keyset paging on the primary key: a page costs the same at any depth,
        # and each filter has an index led by its column and followed by the id.
        order = j.c.id.asc() if after else j.c.id.desc()
        paged: Select[Any] = self._filtered(stmt, after=after, **given).order_by(order).limit(_p("limit", type_=Integer))
        leading = [name for name in ("state", "group", "exact_function") if given.get(name)]
        if (after or given.get("before")) and len(leading) == 1 and not any(given.get(n) for n in ("states", "function")):
            column = {"state": "state", "group": "group", "exact_function": "function"}[leading[0]]
            paged = self.driver.along_index(paged, j, self._jobs_index(column))
        return paged

    def matching_ids(self, **given: bool) -> Select[Any]:
        """Ids of up to ``p_limit`` jobs matching the filters named True (as :meth:`list_jobs`), oldest first."""
        j = self.tables.jobs
        return self._filtered(select(j.c.id), **given).order_by(j.c.id).limit(_p("limit", type_=Integer))

    @cached_property
    def recent_functions(self) -> Select[Any]:
        """The distinct function names among the ``p_limit`` newest jobs (what a filter offers to pick)."""
        j = self.tables.jobs
        newest = select(j.c.fn_name).order_by(j.c.id.desc()).limit(_p("limit", type_=Integer)).subquery("newest")
        return select(newest.c.fn_name).distinct().order_by(newest.c.fn_name)

    @cached_property
    def throughput(self) -> Select[Any]:
        """Jobs that finished in ``[p_since, p_until)``, per bucket of ``p_width`` seconds and final state."""
        j = self.tables.jobs
        since = _p("since", j.c.finished_at)
        bucket = self.driver.bucket(j.c.finished_at - since, _p("width", j.c.finished_at)).label("bucket")
        # The range on finished_at reads the retention index; grouped by position, since the
        # bucket's expression holds parameters that the server would not match by text.
        return (
            select(bucket, j.c.state, func.count().label("n"))
            .where(j.c.finished_at >= since, j.c.finished_at < _p("until", j.c.finished_at), self.final)
            .group_by(literal_column("1"), literal_column("2"))
        )

    @cached_property
    def job_progress(self) -> Select[Any]:
        """Job ``p_id``'s progress: fraction, message, when it was written."""
        j = self.tables.jobs
        return select(j.c.progress, j.c.progress_message, j.c.progress_at).where(j.c.id == _p("id"))

    @cached_property
    def graph_nodes(self) -> Select[Any]:
        """What a graph draws of jobs ``p_ids``: state, function, key, group, batch flag, progress."""
        j = self.tables.jobs
        return select(
            j.c.id, j.c.state, j.c.fn_name, j.c.job_key, j.c.group_key, j.c.batch, j.c.progress
        ).where(self._ids(j.c.id))

    @cached_property
    def edges_in(self) -> Select[Any]:
        """``(job_id, depends_on_id)`` of every edge into the jobs ``p_ids`` (what they depend on)."""
        d = self.tables.deps
        return select(d.c.job_id, d.c.depends_on_id).where(self._ids(d.c.job_id))

    @cached_property
    def ids_by_key_prefix(self) -> Select[Any]:
        """Ids of up to ``p_limit`` jobs whose key starts with ``p_prefix`` (a LIKE pattern escaped with ``/``), oldest first."""
        j = self.tables.jobs
        return select(j.c.id).where(j.c.job_key.like(_p("prefix"), escape="/")).order_by(j.c.id).limit(_p("limit", type_=Integer))

    @cached_property
    def job_row(self) -> Select[Any]:
        """Every column of job ``p_id``."""
        j = self.tables.jobs
        return select(j).where(j.c.id == _p("id"))

    @cached_property
    def job_upstream(self) -> Select[Any]:
        """The jobs job ``p_id`` depends on, with their states."""
        j, d = self.tables.jobs, self.tables.deps
        return select(j.c.id, j.c.state).join(d, d.c.depends_on_id == j.c.id).where(d.c.job_id == _p("id")).order_by(j.c.id)

    @cached_property
    def job_downstream(self) -> Select[Any]:
        """The jobs that depend on job ``p_id``, with their states."""
        j, d = self.tables.jobs, self.tables.deps
        return select(j.c.id, j.c.state).join(d, d.c.job_id == j.c.id).where(d.c.depends_on_id == _p("id")).order_by(j.c.id)

    @cached_property
    def job_attempts(self) -> Select[Any]:
        """Job ``p_id``'s attempts, in the order they were written."""
        a = self.tables.attempts
        return select(a).where(a.c.job_id == _p("id")).order_by(a.c.id)

    # -- retention ------------------------------------------------------------------------------------

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


def catalogue(stmts: Statements) -> list[tuple[str, str]]:
    """``(name, first docstring line)`` of every named statement, in source order."""
    out: list[tuple[str, str]] = []
    for name, member in vars(Statements).items():
        target = member.func if isinstance(member, cached_property) else member
        if name.startswith("_") or not callable(target) or name in ("runnable", "fenced"):
            continue
        doc = (target.__doc__ or "").strip().splitlines()
        out.append((name, doc[0] if doc else ""))
    return out


def _main() -> None:  # pragma: no cover - a reading aid
    import sys

    from ..dialects import resolve

    url = sys.argv[1] if len(sys.argv) > 1 else "sqlite:///catalogue.db"
    driver = resolve(url)
    stmts = Statements(schema.make_tables("", partial_indexes=driver.supports_partial_indexes), driver)
    from sqlalchemy import create_engine

    dialect = create_engine(driver.url).dialect
    for name, line in catalogue(stmts):
        member = getattr(stmts, name)
        stmt = member() if callable(member) and not hasattr(member, "compile") else member
        print(f"-- {name}: {line}\n{stmt.compile(dialect=dialect)};\n")


if __name__ == "__main__":  # pragma: no cover
    _main()
