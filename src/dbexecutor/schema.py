"""Tables, indexes, job states and the schema version. Nothing else.

``jobs`` holds one row per submitted job; ``job_deps`` the dependency edges
(``job_id`` waits for ``depends_on_id``); ``attempts`` one row per run of a job;
``groups`` the fair-share groups (weight, concurrency limit, and the virtual
time the stride scheduler keeps for each); ``meta`` the schema version and the
scheduler's global virtual time. Every name carries the store's table prefix, so
the tables can live inside an application's own database.

Readiness is kept on the row: ``open_deps`` counts the upstream jobs that are
not done yet, and a job moves from ``waiting`` to ``ready`` in the transaction
that finishes its last upstream. The claim therefore reads only ``ready`` rows
through the ready index and never walks the DAG.

A batch is a row with ``batch = 1`` that depends on its children (edges carry
the child's ``position``). It is never ``ready``: the transaction that
finishes its last child rolls it up to ``done`` with the children's results,
and the first child failure fails it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    UniqueConstraint,
    literal_column,
    text,
)

from .dialects.types import JOBS_OPTIONS, TABLE_OPTIONS, Blob, Id, LongText, options, partial

#: Version 3 added ``arg_refs``, ``failed_upstream`` and ``retry_delay`` to ``jobs``;
#: version 4 the ``executors`` table; version 5 queues (``jobs.queue``,
#: ``executors.queues``, the ready index led by the queue); version 6 a job's
#: progress, the request to terminate it while it runs, and the indexes
#: operators' lists page by; version 7 makes the state index partial where
#: the database can (``LISTED_STATES``); version 8 orders the ready index as the
#: claim reads it (group, priority, age, queue); version 9 leaves out of the
#: retention index the rows not finished, and, where an index can be partial and
#: the old constraint dropped, out of the key's unique index the rows without a
#: key; version 10 the ``functions`` table (the program's functions pickled by
#: value, stored once and named by digest in payloads). ``dbexecutor.store.migrations`` upgrades tables of version 2 and later
#: in place when it opens them.
SCHEMA_VERSION = 10

# The states live in their own module (no database code) and are re-exported here.
from .states import (  # noqa: E402
    ACTIVE_STATES,
    ALL_STATES,
    CANCELLED,
    DEFAULT_GROUP,
    DEFAULT_QUEUE,
    DONE,
    FAILED,
    FINAL_STATES,
    LEASED,
    PENDING_STATES,
    READY,
    RUNNING,
    WAITING,
)

#: The indexes that operators' lists page through: ``ix_jobs_<name>`` on (column, id).
PAGED_BY = {"state": "state", "group": "group_key", "function": "fn_name"}
#: The states ``ix_jobs_state`` holds where indexes can be partial (the predicate, spelled as
#: the listing query repeats it: SQLite uses a partial index only for a query that says so).
LISTED_STATES = (WAITING, FAILED, CANCELLED)
LISTED_STATES_SQL = "state IN (" + ", ".join(f"'{s}'" for s in LISTED_STATES) + ")"


def state_is(column: Any, state: str) -> Any:
    """``column = '<state>'``, the state written into the SQL rather than bound as a parameter.

    Where indexes are partial, SQLite checks a statement's conditions against
    their predicates (``state = 'ready'``, ...) when it prepares it; a
    condition on ``state`` with a parameter makes it prepare the statement
    again at every run, to see the value (a chain's count-down: 190 us a run
    against 60 with the state written in). PostgreSQL's custom plans and
    MySQL see the value either way.
    """
    return column == literal_column(f"'{state}'")


def states_in(column: Any, states: tuple[str, ...]) -> Any:
    """``column IN ('<state>', ...)``, the states written into the SQL (a partial index is
    usable only when the planner sees the values; see :func:`state_is`)."""
    return column.in_([literal_column(f"'{s}'") for s in states])


_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,29}$")

_Id, _Blob, _Text = Id, Blob, LongText

__all__ = [
    "SCHEMA_VERSION", "Tables", "make_tables", "validate_prefix", "state_is", "states_in", "ACTIVE_STATES", "ALL_STATES", "CANCELLED",
    "DEFAULT_GROUP", "DEFAULT_QUEUE", "DONE", "FAILED", "FINAL_STATES", "LEASED", "PENDING_STATES", "READY", "RUNNING", "WAITING",
]


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a safe table-name prefix, else raise ``ValueError``."""
    if prefix and not _PREFIX_RE.match(prefix):
        raise ValueError(
            f"table prefix {prefix!r} must start with a letter or underscore and hold at most "
            "30 letters, digits or underscores"
        )
    return prefix


@dataclass(frozen=True)
class Tables:
    """The tables of one store, bound to one prefix."""

    metadata: MetaData
    jobs: Table
    deps: Table
    attempts: Table
    groups: Table
    meta: Table
    executors: Table
    functions: Table


def make_tables(prefix: str = "", *, partial_indexes: bool = True, dialect: str | None = None) -> Tables:
    """Build the table definitions for ``prefix``.

    ``partial_indexes`` says whether the database supports ``CREATE INDEX ... WHERE``;
    without it the ready index becomes a composite index led by ``state``.
    ``dialect``: the SQLAlchemy dialect the tables are for (their options are
    then that database's only); None: every database's.
    """
    validate_prefix(prefix)
    md = MetaData()
    opts: dict[str, Any] = options(TABLE_OPTIONS, dialect)
    jobs = Table(
        f"{prefix}jobs",
        md,
        Column("id", _Id, primary_key=True, autoincrement=True),
        Column("state", String(16), nullable=False),
        Column("fn_name", String(255), nullable=False),
        Column("payload", _Blob, nullable=False),
        Column("result", _Blob, nullable=True),  # pickled result or exception
        Column("error", _Text, nullable=True),  # "Type: message" of the final exception, for people
        Column("job_key", String(255), nullable=True),
        Column("group_key", String(255), nullable=False, server_default=DEFAULT_GROUP),
        # Which executors may run it: those that serve this queue.
        Column("queue", String(255), nullable=False, server_default=DEFAULT_QUEUE),
        Column("batch", Integer, nullable=False, server_default="0"),  # 1: a container that never runs
        Column("priority", Integer, nullable=False, server_default="0"),
        Column("timeout", Double, nullable=True),
        Column("retries", Integer, nullable=False, server_default="0"),
        Column("retry_delay", Double, nullable=True),  # base of the backoff (None: the executor's default)
        Column("attempt", Integer, nullable=False, server_default="0"),  # the fencing token
        Column("open_deps", Integer, nullable=False, server_default="0"),
        # The upstream jobs whose results the payload takes as arguments, comma-separated
        # ("" for none): the executor that runs the job hands them to its child. NULL means
        # "not recorded" (a row written before version 3): every done upstream's result goes.
        Column("arg_refs", _Text, nullable=True),
        # Why a job failed without running: the upstream job (or, for a batch, the child)
        # whose failure it inherited. ``retry`` revives such dependents with their upstream.
        Column("failed_upstream", _Id, nullable=True),
        Column("lease_owner", String(255), nullable=True),
        Column("lease_expires", Double, nullable=True),
        Column("run_after", Double, nullable=True),
        Column("submitted_by", String(64), nullable=True),
        Column("created_at", Double, nullable=False),
        Column("started_at", Double, nullable=True),
        Column("finished_at", Double, nullable=True),
        # What the job says about itself (dbexecutor.report_progress), written by its
        # owner with a lease renewal: a fraction from 0 to 1 (NULL: only a message).
        Column("progress", Double, nullable=True),
        Column("progress_message", String(255), nullable=True),
        Column("progress_at", Double, nullable=True),
        # When someone asked for the running job to stop (JobFuture.terminate, cancel
        # --running): its owner sees it at its next beat, kills the process tree and
        # records the job cancelled.
        Column("terminate_requested", Double, nullable=True),
        *([] if partial_indexes else [UniqueConstraint("job_key", name=f"{prefix}uq_jobs_key")]),
        **options(JOBS_OPTIONS, dialect),
    )
    # A job's row is written three times (inserted, leased, finished), and as its state
    # changes every write is a new version of the row in every index whose predicate it
    # meets. Most jobs have no key and are not finished for two of the three: where
    # indexes can be partial, the key's unique index and the retention index leave those
    # rows out (version 9: 5-15% of PostgreSQL's CPU a job, measured).
    if partial_indexes:
        Index(f"{prefix}uq_jobs_key", jobs.c.job_key, unique=True, **partial(text("job_key IS NOT NULL"), dialect))
    # The claim reads a group's ready rows best first (priority, then age),
    # keeping those of the queues it serves: (group, priority, age, queue),
    # in the claim's own order, so it reads the few rows it leases and sorts
    # nothing, whether it serves every queue (a worker, attach()) or a list.
    # Versions 5 to 7 led it by the queue (ix_jobs_ready_q): an executor
    # serving every queue could not search it, and one serving two queues
    # sorted its whole backlog at each claim. (Version 4 and earlier had
    # ix_jobs_ready; the upgrades replace both.)
    ready_columns = (jobs.c.group_key, jobs.c.priority.desc(), jobs.c.id, jobs.c.queue)
    if partial_indexes:
        Index(f"{prefix}ix_jobs_ready_g", *ready_columns, **partial(text("state = 'ready'"), dialect))
    else:
        Index(f"{prefix}ix_jobs_ready_g", jobs.c.state, *ready_columns)
    # Reclaim looks for expired leases among leased/running rows. Partial where
    # possible, so that no planner prefers it over the ready index for a claim.
    active = text("state IN ('leased', 'running')")
    Index(f"{prefix}ix_jobs_lease", jobs.c.state, jobs.c.lease_expires, **partial(active, dialect))
    # Retention and purge look for jobs finished before a bound (a range, which implies
    # IS NOT NULL: PostgreSQL and SQLite read the partial index for it).
    finished = partial(text("finished_at IS NOT NULL"), dialect) if partial_indexes else {}
    Index(f"{prefix}ix_jobs_finished", jobs.c.finished_at, **finished)
    # Operators' lists show jobs newest first, a page at a time (keyset paging on
    # the id) within a state, a group or a function, or by age.
    # The state index holds only the states that stay few, or that operators
    # look for among many done jobs (LISTED_STATES): a full one is rewritten on
    # every change of state, which cost one-by-one submits about a tenth of
    # their rate on SQLite. A page of a common state reads the primary key
    # backwards (those rows are most rows, or the newest); MySQL/MariaDB have
    # no partial indexes and keep a full one.
    for name, column in PAGED_BY.items():
        where = partial(text(LISTED_STATES_SQL), dialect) if name == "state" and partial_indexes else {}
        Index(f"{prefix}ix_jobs_{name}", jobs.c[column], jobs.c.id, **where)
    Index(f"{prefix}ix_jobs_created", jobs.c.created_at)
    deps = Table(
        f"{prefix}job_deps",
        md,
        Column("job_id", _Id, ForeignKey(f"{prefix}jobs.id"), nullable=False),
        Column("depends_on_id", _Id, ForeignKey(f"{prefix}jobs.id"), nullable=False),
        Column("position", Integer, nullable=True),  # a batch's edges: the child's place in the result list
        PrimaryKeyConstraint("job_id", "depends_on_id", name=f"{prefix}pk_job_deps"),
        Index(f"{prefix}ix_job_deps_up", "depends_on_id"),
        **opts,
    )
    attempts = Table(
        f"{prefix}attempts",
        md,
        Column("id", _Id, primary_key=True, autoincrement=True),
        Column("job_id", _Id, ForeignKey(f"{prefix}jobs.id"), nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("worker", String(255), nullable=True),  # host:pid of the child
        Column("started_at", Double, nullable=True),
        Column("ended_at", Double, nullable=False),
        Column("outcome", String(64), nullable=False),  # ok, exception, timeout, signal 9, exit code 3, lease lost...
        Column("detail", _Text, nullable=True),
        Index(f"{prefix}ix_attempts_job", "job_id", "attempt"),
        **opts,
    )
    groups = Table(
        f"{prefix}groups",
        md,
        Column("name", String(255), primary_key=True),
        Column("weight", Integer, nullable=False, server_default="1"),
        Column("max_running", Integer, nullable=True),  # leased + running jobs allowed at once, everywhere
        # Stride scheduling: jobs started so far divided by the weight (a virtual time), advanced
        # by every claim; the group furthest behind is served first.
        Column("vtime", Double, nullable=False, server_default="0"),
        **opts,
    )
    meta = Table(
        f"{prefix}meta",
        md,
        Column("name", String(64), primary_key=True),
        Column("value", String(255), nullable=False),
        **opts,
    )
    # One row per executor, standalone worker or submit-only process: who it is,
    # where, and whether it is alive. Its jobs' lease_owner is its name.
    executors = Table(
        f"{prefix}executors",
        md,
        Column("id", _Id, primary_key=True, autoincrement=True),
        Column("name", String(255), nullable=False),  # host:pid:token; the lease_owner of its jobs
        Column("kind", String(16), nullable=False),  # executor, worker, submitter
        Column("host", String(255), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("pid_started", Double, nullable=True),  # the process's start time on its host: tells a reused pid
        Column("version", String(32), nullable=False),
        Column("slots", Integer, nullable=False),  # child processes it may run (0: submits only)
        Column("queues", _Text, nullable=True),  # the queues it serves, comma-separated (NULL: every queue)
        Column("wake", String(255), nullable=True),  # where a datagram wakes it (host:port), if anywhere
        Column("started_at", Double, nullable=False),
        Column("last_beat", Double, nullable=False),
        Column("expires", Double, nullable=False),  # dead once the server's clock passes this without a beat
        Column("stopped_at", Double, nullable=True),  # set when it stopped, or was found dead
        UniqueConstraint("name", name=f"{prefix}uq_executors_name"),
        Index(f"{prefix}ix_executors_host", "host"),
        **opts,
    )
    # The program's own functions (a script's), pickled by value once and named in
    # payloads by the pickle's SHA-256 (hex): a row of the jobs table then holds
    # 46 bytes for its function instead of 500-2,000. ``used_at`` is renewed by
    # the processes that name it (at most every half hour); retention deletes a
    # pickle no job left in the table can name (see store.functions).
    functions = Table(
        f"{prefix}functions",
        md,
        Column("digest", String(64), primary_key=True),
        Column("data", _Blob, nullable=False),
        Column("created_at", Double, nullable=False),
        Column("used_at", Double, nullable=False),
        **opts,
    )
    return Tables(md, jobs, deps, attempts, groups, meta, executors, functions)
