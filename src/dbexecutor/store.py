"""Every statement dbexecutor runs, as one typed method per operation.

This is the only module that opens transactions. Each state change is a
conditional ``UPDATE``: a running attempt's heartbeat and finalize are guarded
by ``(id, attempt)`` and an active state, so an attempt that lost its lease
(reclaimed, timed out) changes nothing when it reports late. Readiness,
failure propagation and cancellation of dependents happen in the transaction
that finishes the upstream job, so the claim only ever reads ``ready`` rows.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Integer,
    and_,
    bindparam,
    Select,
    case,
    create_engine,
    exists,
    delete,
    func,
    insert,
    inspect,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Engine, Row
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, NoSuchModuleError, OperationalError

from . import schema, serialization
from .dialects import Dialect, resolve
from .errors import ConfigurationError, DatabaseUnavailable, PayloadRejected, SchemaVersionError

__all__ = ["Store", "NewJob", "Submitted", "Claimed", "Report", "Final", "GroupInfo", "masked_url"]

log = logging.getLogger("dbexecutor.store")
T = TypeVar("T")

_MAX_TXN_TRIES = 8
# The columns of a job's row that the lease-on-insert statement takes from the submit.
_DIRECT_COLUMNS = ("fn_name", "payload", "priority", "timeout", "retries", "run_after", "submitted_by", "created_at")
_IN_CHUNK = 500  # ids per IN (...) list, well under every driver's parameter limit
_NOTIFY_IDS = 600  # finished ids listed in one notification (PostgreSQL caps a payload at 8000 bytes)
# The error a dependent gets when its upstream fails (see _fail_dependents / insert_job).
_DEPENDENCY_ERROR = re.compile(r"^(?:DependencyFailed: upstream|batch child) job (\d+) failed")


def masked_url(url: Any) -> str:
    """The URL as text with its password replaced by ``***``."""
    return url.render_as_string(hide_password=True)


@dataclass(frozen=True)
class NewJob:
    """What ``submit`` hands the store: a pickled payload and the row's options."""

    fn_name: str
    payload: bytes
    deps: tuple[int, ...]
    key: str | None = None
    group: str = schema.DEFAULT_GROUP
    weight: int | None = None  # set the group's weight (None: leave it as configured)
    priority: int = 0
    timeout: float | None = None
    retries: int = 0
    run_after: float | None = None
    submitted_by: str | None = None
    batch: bool = False  # a container whose ``deps`` are its children, in order


@dataclass(frozen=True)
class GroupInfo:
    """A fair-share group as stored: weight, concurrency limit (None: none) and virtual time."""

    name: str
    weight: int
    limit: int | None
    vtime: float


@dataclass(frozen=True)
class Submitted:
    """The row a submit produced, or found (``existing``) when its key was taken."""

    job_id: int
    state: str
    result: bytes | None = None
    existing: bool = False


@dataclass(frozen=True)
class Claimed:
    """A job this executor now holds the lease of, with the token ``attempt``."""

    job_id: int
    attempt: int
    payload: bytes
    fn_name: str
    timeout: float | None


@dataclass(frozen=True)
class Report:
    """How one attempt ended, as the parent saw it."""

    job_id: int
    attempt: int
    ok: bool
    blob: bytes  # pickled result, or pickled exception
    outcome: str  # ok, exception, timeout, signal 9, exit code 3, ...
    error: str | None = None  # "Type: message", for people
    worker: str | None = None
    started_at: float | None = None
    ended_at: float = 0.0
    retry_delay: float = 1.0


@dataclass(frozen=True)
class Final:
    """A job that reached a final state (``result`` holds the result or exception pickle)."""

    job_id: int
    state: str
    result: bytes | None


@dataclass
class Finished:
    """What a batch of reports changed: final rows, retried ids, ids whose lease was lost."""

    finals: list[Final]
    retried: list[int]
    lost: list[int]
    released: int = 0  # dependents that became ready


def _chunks(ids: Sequence[int]) -> Iterable[Sequence[int]]:
    for i in range(0, len(ids), _IN_CHUNK):
        yield ids[i : i + _IN_CHUNK]


class Store:
    """The database behind one executor, worker or child: engine, tables and statements."""

    def __init__(
        self,
        url: Any,
        prefix: str = "",
        *,
        create: bool = True,
        pool_size: int | None = None,
        signer: serialization.Signer | None = None,
        listen_url: str | None = None,
    ) -> None:
        #: Signs the exceptions the store writes and checks the ones it reads.
        self.signer = signer or serialization.UNSIGNED
        self.dialect: Dialect = resolve(url)
        self.url = self.dialect.url
        #: Where :meth:`listen` connects, if not at ``url`` (PostgreSQL): a
        #: direct URL of the server when ``url`` goes through a transaction pooler.
        self.listen_url = None
        if listen_url is not None:
            listener = resolve(listen_url)
            if not (self.dialect.supports_notify and listener.supports_notify):
                raise ConfigurationError(
                    "listen_url is for PostgreSQL, whose executors LISTEN for wake-ups: a postgresql:// URL of "
                    "the same database, reached directly, when the database URL goes through a pooler such as PgBouncer"
                )
            self.listen_url = listener.url
        self.prefix = schema.validate_prefix(prefix)
        self.tables = schema.make_tables(prefix, partial_indexes=self.dialect.supports_partial_indexes)
        options = self.dialect.engine_options()
        if pool_size is not None and "pool_size" in options:
            options.update(pool_size=pool_size, max_overflow=pool_size)
        try:
            self.engine: Engine = create_engine(self.url, **options)
        except (ModuleNotFoundError, ImportError, NoSuchModuleError) as error:
            extra = self.dialect.extra
            hint = f"pip install 'dbexecutor[{extra}]'" if extra else "check the installation"
            raise ConfigurationError(f"the driver for {self.dialect.label} is not installed ({error}); {hint}") from None
        self.dialect.setup_engine(self.engine)
        self._connect_check()
        if create:
            self.ensure_schema()
        j = self.tables.jobs
        self._ready = j.c.state == literal_column(f"'{schema.READY}'")  # literal, so partial indexes apply
        self._active = j.c.state.in_([literal_column(f"'{s}'") for s in schema.ACTIVE_STATES])
        # Literal too: a prepared statement's generic plan then knows which states it reads.
        self._final = j.c.state.in_([literal_column(f"'{s}'") for s in schema.FINAL_STATES])
        #: Where this store's notifications go (PostgreSQL); one channel per table prefix.
        self.channel = f"{prefix}dbexecutor"
        #: Names this store's notifications, so a listener can skip its own.
        self.sender = uuid.uuid4().hex[:12]
        self._groups_seen: dict[str, int | None] = {}  # groups this process has made sure exist
        self._stmts: dict[Any, Any] = {}  # statements built once (see _groups_stmt)
        self._backlog = False  # the last claim filled every slot it had: more is probably runnable
        # Once: every future carries it, and rendering the URL cost ~10 us a submit.
        self._identity = (masked_url(self.url), self.prefix)

    def __repr__(self) -> str:
        return f"Store({masked_url(self.url)!r}, prefix={self.prefix!r})"

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    @property
    def identity(self) -> tuple[str, str]:
        """Which database and table prefix this is (futures from the same one can be dependencies)."""
        return self._identity

    # -- plumbing -------------------------------------------------------------

    def _connect_check(self) -> None:
        url = self.url
        try:
            with self.engine.connect() as conn:
                self.dialect.check_server(conn)
        except OperationalError as error:
            where = f"{url.host or 'localhost'}:{url.port or 'default port'}" if url.host or url.port else url.database
            reason = str(error.orig).strip().splitlines()[0] if error.orig else str(error)
            if url.password:
                reason = reason.replace(url.password, "***")
            self.engine.dispose()
            raise DatabaseUnavailable(
                f"cannot connect to {self.dialect.label} at {where} ({masked_url(url)}): {reason}"
            ) from None

    def _txn(self, work: Callable[[Connection], T], *, read_only: bool = False, tries: int = _MAX_TXN_TRIES) -> T:
        """Run ``work`` in one transaction, again after a deadlock, busy database or lost connection."""
        delay = 0.02
        for attempt in itertools.count(1):
            try:
                with self.engine.connect() as conn:
                    if read_only:
                        conn.execution_options(dbexecutor_read_only=True)
                    with conn.begin():
                        return work(conn)
            except DBAPIError as error:
                if attempt >= tries or not self.dialect.is_transient(error):
                    raise
                log.info("transaction failed (%s), retry %d of %d", type(error.orig).__name__, attempt, tries - 1)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def retry_later(self, error: DBAPIError) -> bool:
        """Whether ``error`` is the database's state (down, busy, restarting) rather than a refused row."""
        return isinstance(error, (OperationalError, InterfaceError)) or self.dialect.is_transient(error)

    # -- schema ---------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Create the tables if missing and check the recorded schema version.

        Safe when several processes start at once: creation runs under a
        database-wide lock (advisory lock, ``GET_LOCK`` or ``BEGIN IMMEDIATE``).
        """
        meta = self.tables.meta

        def work(conn: Connection) -> None:
            with self.dialect.schema_lock(conn, f"dbexecutor:{self.prefix}"):
                self.tables.metadata.create_all(conn, checkfirst=True)
                found = conn.execute(select(meta.c.value).where(meta.c.name == "schema_version")).scalar()
                if found is None:
                    conn.execute(insert(meta), [
                        {"name": "schema_version", "value": str(schema.SCHEMA_VERSION)},
                        {"name": "vtime", "value": "0"},
                    ])
                    conn.execute(insert(self.tables.groups).values(name=schema.DEFAULT_GROUP))
                elif int(found) > schema.SCHEMA_VERSION:
                    raise SchemaVersionError(
                        f"the tables with prefix {self.prefix!r} have schema version {found}, but this "
                        f"dbexecutor knows only up to {schema.SCHEMA_VERSION}; upgrade dbexecutor"
                    )
                elif int(found) < schema.SCHEMA_VERSION:
                    raise SchemaVersionError(
                        f"the tables with prefix {self.prefix!r} have schema version {found}, from a pre-release "
                        f"dbexecutor that cannot be upgraded in place; finish or drop those jobs, or use another prefix"
                    )

        self._txn(work)

    def drop_schema(self) -> None:
        """Drop this prefix's tables (tests and tooling)."""
        self.tables.metadata.drop_all(self.engine, checkfirst=True)

    # -- notifications ----------------------------------------------------------

    def _notify(self, conn: Connection, *, ready: bool = False, finished: Sequence[int] = ()) -> None:
        """Tell other processes (PostgreSQL) that work became ready or jobs finished.

        Called at most once per transaction, at its end, so a burst of changes
        costs one notification. Payload: ``sender  flags  ids`` (tab-separated);
        ``*`` instead of ids when there are too many to list.
        """
        if not self.dialect.supports_notify or not (ready or finished):
            return
        flags = ("r" if ready else "") + ("f" if finished else "")
        ids = "*" if len(finished) > _NOTIFY_IDS else ",".join(map(str, finished))
        self.dialect.notify(conn, self.channel, f"{self.sender}\t{flags}\t{ids}")

    def listen(self, callback: Callable[[str | None], None], stop: threading.Event) -> threading.Thread | None:
        """Call ``callback`` for each notification on this store's channel (None where unsupported)."""
        return self.dialect.listen(self.engine, self.channel, callback, stop, self.listen_url)

    # -- groups ---------------------------------------------------------------

    def _ensure_groups(self, conn: Connection, jobs: Sequence[NewJob]) -> dict[str, int | None]:
        """Create the groups of ``jobs`` this process has not seen, and set weights given with them."""
        g = self.tables.groups
        todo: dict[str, int | None] = {}
        for job in jobs:
            seen = self._groups_seen.get(job.group, -1)
            if seen == -1 or (job.weight is not None and job.weight != seen):
                todo[job.group] = job.weight if job.weight is not None else todo.get(job.group)
        for name, weight in todo.items():
            conn.execute(self.dialect.insert_ignore(g).values(name=name, weight=weight or 1))
            if weight is not None:
                conn.execute(update(g).where(g.c.name == name, g.c.weight != weight).values(weight=weight))
        return todo

    def _groups_done(self, todo: dict[str, int | None]) -> None:
        # Only after the commit: a rolled-back insert must be tried again.
        for name, weight in todo.items():
            self._groups_seen[name] = weight if weight is not None else self._groups_seen.get(name)

    _KEEP: Any = object()

    def configure_group(self, name: str, *, weight: int | None = None, limit: Any = _KEEP) -> GroupInfo:
        """Create or change a group: its weight, and its limit (``None``: unlimited) unless left out."""
        g = self.tables.groups

        def work(conn: Connection) -> GroupInfo:
            conn.execute(self.dialect.insert_ignore(g).values(name=name, weight=weight or 1))
            values: dict[str, Any] = {}
            if weight is not None:
                values["weight"] = weight
            if limit is not self._KEEP:
                values["max_running"] = limit
            if values:
                conn.execute(update(g).where(g.c.name == name).values(**values))
            row = conn.execute(select(g).where(g.c.name == name)).one()
            if limit is not self._KEEP and (limit is None or limit > 0):
                self._notify(conn, ready=True)  # a raised limit may let waiting work run elsewhere
            return GroupInfo(row.name, row.weight, row.max_running, row.vtime)

        info = self._txn(work)
        self._groups_seen[name] = info.weight
        return info

    def groups(self) -> list[GroupInfo]:
        """Every group, by name."""
        g = self.tables.groups
        rows = self._txn(lambda c: c.execute(select(g).order_by(g.c.name)).all(), read_only=True)
        return [GroupInfo(r.name, r.weight, r.max_running, r.vtime) for r in rows]

    # -- submit ---------------------------------------------------------------

    def insert_job(self, job: NewJob, now: float) -> Submitted:
        """Insert one job and its edges; with a taken key, return the existing job instead.

        The upstream rows are locked while the edges are written, so an
        upstream cannot finish between "count open dependencies" and "insert
        edges" and leave this job waiting forever. A batch (``job.batch``)
        whose children have all finished is rolled up at once.
        """
        groups: dict[str, int | None] = {}

        def work(conn: Connection) -> Submitted:
            nonlocal groups
            if job.key is not None:
                found = self._by_key(conn, job.key)
                if found is not None:
                    return found
            groups = self._ensure_groups(conn, [job])
            out = self._insert_with_deps(conn, job, now, self._lock_upstream(conn, job.deps))
            self._notify(conn, ready=self._runnable_row(job, out.state, now), finished=[out.job_id] if out.state in schema.FINAL_STATES else ())
            return out

        try:
            out = self._txn(work)
        except IntegrityError:
            if job.key is None:
                raise
            # Another process inserted the same key between our lookup and insert.
            found = self._txn(lambda conn: self._by_key(conn, job.key), read_only=True)  # type: ignore[arg-type]
            if found is None:
                raise
            return found
        self._groups_done(groups)
        return out

    @staticmethod
    def _runnable_row(job: NewJob, state: str, now: float) -> bool:
        return state == schema.READY and (job.run_after is None or job.run_after <= now)

    def _insert_with_deps(self, conn: Connection, job: NewJob, now: float, upstream: dict[int, Row[Any]]) -> Submitted:
        """Insert one job (no key lookup) with its edges, in the caller's transaction.

        ``upstream``: its upstream rows, already locked (:meth:`_lock_upstream`).
        """
        row = self._row_after(job, upstream, now)
        # A batch is never ready: with every child already done it is rolled up below.
        roll_up_now = job.batch and row["state"] == schema.READY
        if roll_up_now:
            row["state"] = schema.WAITING
        job_id = self._insert_one(conn, row)
        self._insert_edges(conn, [job], [job_id])
        if roll_up_now:
            final = self._roll_up(conn, [job_id], now)[0]
            return Submitted(job_id, final.state, final.result)
        return Submitted(job_id, row["state"], row["result"])

    def _lock_upstream(self, conn: Connection, ids: Iterable[int]) -> dict[int, Row[Any]]:
        """The rows of the jobs ``ids`` depend on, locked until the transaction ends.

        Locked in id order, one statement per 500 ids: however many jobs a
        transaction inserts, their upstream rows cost a round trip or a few,
        not one per job. While locked, an upstream cannot finish between
        "count open dependencies" and "insert edges" and leave a job waiting
        forever. ``result`` is read only for failed rows (it is what a
        dependent inherits); a fan-in over large results does not load them.
        """
        j = self.tables.jobs
        found: dict[int, Row[Any]] = {}
        for part in _chunks(sorted(set(ids))):
            stmt = (
                select(j.c.id, j.c.state, case((j.c.state == schema.FAILED, j.c.result)).label("result"), j.c.finished_at)
                .where(self.dialect.in_ids(j.c.id, part))
                .order_by(j.c.id)
            )
            found.update((r.id, r) for r in conn.execute(self.dialect.for_update(stmt)))
        return found

    def _row_after(self, job: NewJob, upstream: dict[int, Row[Any]], now: float) -> dict[str, Any]:
        """``job``'s new row, its state decided by its (locked) upstream rows."""
        state, result, error, finished = schema.READY, None, None, None
        open_deps = 0
        if job.deps:
            rows = [upstream[d] for d in job.deps if d in upstream]
            if len(rows) < len(job.deps):
                missing = sorted(set(job.deps) - upstream.keys())
                raise ValueError(f"dependency job(s) {missing} do not exist in this database")
            # The first failure (in time) decides, as when it happens later.
            for r in sorted(rows, key=lambda r: (r.state != schema.FAILED, r.finished_at or 0.0, r.id)):
                if r.state == schema.FAILED:
                    state, finished = schema.FAILED, now
                    if job.batch:
                        result, error = r.result, f"batch child job {r.id} failed"
                    else:
                        result = serialization.dependency_failure(r.id, r.result, self.signer)
                        error = f"DependencyFailed: upstream job {r.id} failed"
                    break
            if state == schema.READY and any(r.state == schema.CANCELLED for r in rows):
                state, finished = schema.CANCELLED, now
            open_deps = sum(r.state != schema.DONE for r in rows)
            if state == schema.READY and open_deps:
                state = schema.WAITING
        row = self._row(job, state, now, open_deps)
        row.update(result=result, error=error, finished_at=finished)
        return row

    def _insert_edges(self, conn: Connection, jobs: Sequence[NewJob], ids: Sequence[int]) -> None:
        """The dependency edges of ``jobs``, just inserted as ``ids`` (a batch's keep their positions)."""
        edges = [
            {"job_id": job_id, "depends_on_id": d, "position": i if job.batch else None}
            for job, job_id in zip(jobs, ids)
            for i, d in enumerate(job.deps)
        ]
        self._insert_rows(conn, self.tables.deps, edges)

    def insert_jobs(self, jobs: Sequence[NewJob], now: float) -> list[Submitted]:
        """Insert many rows without keys in one transaction; rows in input order."""
        if not jobs:
            return []
        groups: dict[str, int | None] = {}

        def work(conn: Connection) -> list[Submitted]:
            nonlocal groups
            groups = self._ensure_groups(conn, jobs)
            out = self._insert_many(conn, jobs, now)
            self._notify_changes(conn, jobs, out, now)
            return out

        out = self._txn(work)
        self._groups_done(groups)
        return out

    def _notify_changes(
        self,
        conn: Connection,
        jobs: Sequence[NewJob],
        rows: Sequence[Submitted],
        now: float,
        done: Finished | None = None,
        taken: AbstractSet[int] = frozenset(),
    ) -> None:
        """Tell other processes what this transaction changed (delivered at its commit).

        Work is ready if a finish released or retried jobs, or a new row is
        runnable and not among ``taken`` (rows this transaction leased itself);
        finished: the jobs ``done`` finalized and new rows already final.
        """
        ready = bool(done and (done.released or done.retried)) or any(
            self._runnable_row(job, row.state, now) and row.job_id not in taken for job, row in zip(jobs, rows)
        )
        finished = [f.job_id for f in done.finals] if done else []
        self._notify(conn, ready=ready, finished=finished + [r.job_id for r in rows if r.state in schema.FINAL_STATES])

    def _insert_many(
        self, conn: Connection, jobs: Sequence[NewJob], now: float, lease: tuple[str, float, int] | None = None
    ) -> list[Submitted]:
        """Insert ``jobs`` (no keys) in the caller's transaction, ids in input order.

        Every upstream row (a batch's too) is locked first, in id order (see :meth:`_lock_upstream`);
        then each run of jobs goes in as one multi-row statement, with one more
        for all their edges. Only a batch (rolled up on insert) goes alone.
        ``lease``: ``(owner, ttl, limit)``: the ``limit`` best runnable rows
        (priority, then order) go in leased to ``owner``, as a claim would
        lease them; the caller has made sure that nothing else is runnable.
        """
        if any(job.key is not None for job in jobs):
            raise ValueError("keyed jobs go through insert_job, which looks the key up first")
        upstream = self._lock_upstream(conn, [d for job in jobs for d in job.deps])
        out: list[Submitted] = []
        i = 0
        while i < len(jobs):
            if jobs[i].batch:
                out.append(self._insert_with_deps(conn, jobs[i], now, upstream))
                i += 1
                continue
            end = i
            while end < len(jobs) and not jobs[end].batch:
                end += 1
            run = jobs[i:end]
            rows = [self._row_after(job, upstream, now) for job in run]
            if lease is not None:
                self._lease_rows(run, rows, now, *lease)
            ids = self._insert_job_rows(conn, rows)
            self._insert_edges(conn, run, ids)
            out += [Submitted(x, row["state"], row["result"]) for x, row in zip(ids, rows)]
            i = end
        return out

    def _lease_rows(
        self, jobs: Sequence[NewJob], rows: list[dict[str, Any]], now: float, owner: str, ttl: float, limit: int
    ) -> None:
        """Mark the ``limit`` best runnable ``rows`` leased to ``owner`` (attempt 1), before they are inserted."""
        runnable = [i for i, (job, row) in enumerate(zip(jobs, rows)) if self._runnable_row(job, row["state"], now)]
        runnable.sort(key=lambda i: (-jobs[i].priority, i))
        chosen = set(runnable[:limit])
        for i, row in enumerate(rows):
            # Every row gets the same columns: the multi-row insert takes them all alike.
            mine = i in chosen
            row.update(
                state=schema.LEASED if mine else row["state"],
                attempt=1 if mine else 0,
                lease_owner=owner if mine else None,
                lease_expires=now + ttl if mine else None,
                started_at=now if mine else None,
            )

    def _insert_job_rows(self, conn: Connection, rows: list[dict[str, Any]]) -> list[int]:
        """Insert job ``rows`` (same keys each); their new ids, in row order."""
        j = self.tables.jobs
        if len(rows) == 1:
            return [self._insert_one(conn, rows[0])]
        reserved = self.dialect.reserve_ids(conn, j, len(rows))
        if reserved is not None:
            for row, job_id in zip(rows, reserved):
                row["id"] = job_id
            self._insert_rows(conn, j, rows)
            return reserved
        got = self.dialect.insert_returning_ids(conn, j, rows)
        if got is not None:
            return got
        if getattr(self.engine.dialect, "insert_executemany_returning_sort_by_parameter_order", False):
            stmt = insert(j).returning(j.c.id, sort_by_parameter_order=True)
            return [int(x) for x in conn.execute(stmt, rows).scalars()]
        # No RETURNING with executemany (MySQL): one statement per row, still one commit.
        return [self._insert_one(conn, row) for row in rows]

    def _insert_rows(self, conn: Connection, table: Any, rows: list[dict[str, Any]]) -> None:
        """Insert ``rows`` (same keys each): set-based where the dialect can, else an executemany."""
        if rows and not self.dialect.insert_many(conn, table, rows):
            conn.execute(insert(table), rows)

    def _insert_one(self, conn: Connection, row: dict[str, Any]) -> int:
        key = conn.execute(insert(self.tables.jobs), row).inserted_primary_key
        assert key is not None
        return int(key[0])

    def _row(self, job: NewJob, state: str, now: float, open_deps: int = 0) -> dict[str, Any]:
        return {
            "state": state,
            "fn_name": job.fn_name,
            "payload": job.payload,
            "job_key": job.key,
            "group_key": job.group,
            "batch": int(job.batch),
            "priority": job.priority,
            "timeout": job.timeout,
            "retries": job.retries,
            "open_deps": open_deps,
            "run_after": job.run_after,
            "submitted_by": job.submitted_by,
            "created_at": now,
            "result": None,
            "error": None,
            "finished_at": None,
        }

    def _by_key(self, conn: Connection, key: str) -> Submitted | None:
        j = self.tables.jobs
        row = conn.execute(select(j.c.id, j.c.state, j.c.result).where(j.c.job_key == key)).first()
        if row is None:
            return None
        return Submitted(int(row.id), row.state, row.result if row.state in schema.FINAL_STATES else None, True)

    # -- claim and leases -----------------------------------------------------

    def claim(self, owner: str, limit: int, ttl: float, now: float, *, probe: bool = True) -> list[Claimed]:
        """Lease up to ``limit`` ready jobs in one transaction: fair share over groups, then priority, then age.

        With ``probe``, looks first, without a write lock, whether anything is
        runnable: an idle poll is one indexed read, also on SQLite. Without it
        (work is known to be there), one round trip less.
        """
        if limit <= 0:
            return []
        if probe and not self.runnable_groups(now):
            self._backlog = False
            return []
        out = self._txn(lambda conn: self._claim(conn, owner, limit, ttl, now))
        self._backlog = len(out) >= limit
        return out

    def finish_and_claim(
        self,
        reports: Sequence[Report],
        owner: str,
        limit: int,
        ttl: float,
        now: float,
        new: Sequence[NewJob] = (),
    ) -> tuple[list[Submitted], Finished, list[Claimed]]:
        """One scheduler tick in one commit: insert ``new`` jobs, record how attempts ended, then claim.

        The new rows are inserted first, so the claim can lease them at once:
        a job submitted to an idle executor starts after a single commit.
        """
        groups: dict[str, int | None] = {}
        # New jobs runnable at once, all of one group, written by a tick with
        # free slots and nothing to record: the idle cases (a submit, a map).
        # When nothing else is runnable and the group has no limit, the claim
        # could only pick these rows: they go in leased, and the claim's reads
        # and its UPDATE are saved. One job: one INSERT that checks and leases.
        # Several: a cheap read checks (skipped while the last claim left work
        # behind, when it would only find that again), then the insert.
        direct = (
            limit > 0
            and bool(new)
            and not reports
            and len({job.group for job in new}) == 1
            and all(self._leasable(job, now) for job in new)
        )

        def work(conn: Connection) -> tuple[list[Submitted], Finished, list[Claimed]]:
            nonlocal groups
            inserted: list[Submitted] = []
            if new:
                groups = self._ensure_groups(conn, new)
                if direct and len(new) == 1:
                    inserted = [self._insert_leased(conn, new[0], owner, ttl, now)]
                elif direct and not self._backlog and self._nothing_runnable(conn, new[0].group, now):
                    inserted = self._insert_many(conn, new, now, lease=(owner, ttl, limit))
                else:
                    inserted = self._insert_many(conn, new, now)
            done = self._finish(conn, reports, now) if reports else Finished([], [], [])
            # Rows that went in leased were the claim's only choice (nothing
            # else was runnable): then there is nothing more to claim.
            claimed = self._leased_on_insert(new, inserted)
            if limit > 0 and not claimed:
                claimed = self._claim(conn, owner, limit, ttl, now)
            # New rows this transaction claimed itself are nobody else's news.
            self._notify_changes(conn, new, inserted, now, done, taken={c.job_id for c in claimed})
            return inserted, done, claimed

        out = self._txn(work)
        self._groups_done(groups)
        # A hint only (other processes add work too): whether runnable rows
        # are likely left, so that the next burst need not look.
        self._backlog = limit > 0 and len(out[2]) >= limit
        return out

    @staticmethod
    def _leasable(job: NewJob, now: float) -> bool:
        """Whether ``job`` is runnable the moment it is inserted (no upstream, no key, no delay, not a batch)."""
        return not job.deps and job.key is None and not job.batch and (job.run_after is None or job.run_after <= now)

    def _insert_leased_stmt(self) -> Any:
        """INSERT of one runnable job that leases it to ``c_owner`` if nothing else could be claimed before it.

        That is: no other row is runnable (so the job is every group's best
        pick, and no other group is owed a turn), and its group has no
        concurrency limit (a limit is counted under the group's row lock,
        which the claim takes). Otherwise the row goes in ``ready`` for the
        claim. The two conditions are read in the insert's own statement.
        """
        key = "insert_leased"
        stmt = self._stmts.get(key)
        if stmt is None:
            j = self.tables.jobs
            group = bindparam("v_group_key", type_=j.c.group_key.type)
            now = bindparam("c_now", type_=j.c.started_at.type)
            free = self._free_select(group, now).subquery("f")
            mine = free.c.free == 1
            columns: dict[str, Any] = {name: bindparam(f"v_{name}", type_=j.c[name].type) for name in _DIRECT_COLUMNS}
            columns["group_key"] = group
            columns.update(
                state=case((mine, literal_column(f"'{schema.LEASED}'")), else_=literal_column(f"'{schema.READY}'")),
                attempt=free.c.free,
                lease_owner=case((mine, bindparam("c_owner", type_=j.c.lease_owner.type))),
                lease_expires=case((mine, bindparam("c_expires", type_=j.c.lease_expires.type))),
                started_at=case((mine, now)),
            )
            stmt = insert(j).from_select(list(columns), select(*columns.values()).select_from(free))
            if self.engine.dialect.insert_returning:
                stmt = stmt.returning(j.c.id, j.c.state)
            self._stmts[key] = stmt
        return stmt

    def _free_select(self, group: Any, now: Any) -> Select[Any]:
        """One row, one column ``free``: 1 if no row is runnable and ``group`` has no concurrency limit, else 0."""
        g = self.tables.groups
        other_work = exists().where(self._runnable(now))
        limited = exists().where(g.c.name == group, g.c.max_running.is_not(None))
        return select(case((and_(~other_work, ~limited), 1), else_=0).label("free"))

    def _nothing_runnable(self, conn: Connection, group: str, now: float) -> bool:
        """Whether new runnable jobs of ``group`` would be the claim's only choice (see :meth:`_free_select`)."""
        stmt = self._stmts.get("free")
        if stmt is None:
            j = self.tables.jobs
            stmt = self._stmts["free"] = self._free_select(
                bindparam("c_group", type_=j.c.group_key.type), bindparam("c_now", type_=j.c.started_at.type)
            )
        return bool(conn.execute(stmt, {"c_group": group, "c_now": now}).scalar())

    @staticmethod
    def _leased_on_insert(jobs: Sequence[NewJob], rows: Sequence[Submitted]) -> list[Claimed]:
        """The claims of the rows that went in leased, in the order a claim would have taken them."""
        got = [(job, row) for job, row in zip(jobs, rows) if row.state == schema.LEASED]
        got.sort(key=lambda pair: (-pair[0].priority, pair[1].job_id))
        return [Claimed(row.job_id, 1, job.payload, job.fn_name, job.timeout) for job, row in got]

    def _insert_leased(self, conn: Connection, job: NewJob, owner: str, ttl: float, now: float) -> Submitted:
        """Insert ``job`` (see :meth:`_leasable`), leased to ``owner`` if nothing else could be claimed first."""
        j = self.tables.jobs
        row = self._row(job, schema.READY, now)
        values = {f"v_{name}": row[name] for name in _DIRECT_COLUMNS}
        values.update(v_group_key=job.group, c_now=now, c_owner=owner, c_expires=now + ttl)
        res = conn.execute(self._insert_leased_stmt(), values)
        if self.engine.dialect.insert_returning:
            got = res.one()
            job_id, state = int(got.id), got.state
        else:
            # MySQL: no RETURNING; the id the insert made, and its state read back.
            job_id = int(res.lastrowid)
            state = conn.execute(select(j.c.state).where(j.c.id == job_id)).scalar_one()
        return Submitted(job_id, state)

    def _runnable(self, now: Any) -> Any:
        j = self.tables.jobs
        return and_(self._ready, or_(j.c.run_after.is_(None), j.c.run_after <= now))

    # The claim's statements are built once per store (per LIMIT where it is
    # part of the text) and run with bound values: building and hashing a
    # statement costs more Python time than its round trip on a local server.

    def _groups_stmt(self, locked: bool) -> Any:
        key = ("groups", locked)
        stmt = self._stmts.get(key)
        if stmt is None:
            g, j = self.tables.groups, self.tables.jobs
            has_work = exists().where(j.c.group_key == g.c.name, self._runnable(bindparam("c_now")))
            stmt = select(g.c.name, g.c.weight, g.c.max_running, g.c.vtime).where(has_work).order_by(g.c.name)
            stmt = self.dialect.for_update(stmt) if locked else stmt
            self._stmts[key] = stmt
        return stmt

    def _groups_select(self, now: float) -> Select[Any]:
        """The groups that have runnable work: one probe of the ready index per group."""
        return self._groups_stmt(False).params(c_now=now)  # type: ignore[no-any-return]

    def runnable_groups(self, now: float) -> list[str]:
        """Names of the groups with runnable work (a read that takes no write lock)."""
        return self._txn(lambda c: list(c.execute(self._groups_stmt(False), {"c_now": now}).scalars()), read_only=True)

    def _pick_stmt(self) -> Any:
        """A group's ``c_limit`` best runnable rows, locked (skipping rows another claim holds)."""
        key = "pick"
        stmt = self._stmts.get(key)
        if stmt is None:
            j = self.tables.jobs
            stmt = self.dialect.for_claim(
                select(j.c.id, j.c.attempt, j.c.payload, j.c.fn_name, j.c.timeout)
                .where(j.c.group_key == bindparam("c_group"), self._runnable(bindparam("c_now")))
                .order_by(j.c.priority.desc(), j.c.id)
                # A parameter, not a constant: the number of free slots changes
                # from tick to tick, and building the claim's statements anew
                # for each number cost ~1 ms of every tick that met a new one.
                .limit(bindparam("c_limit", type_=Integer))
            )
            self._stmts[key] = stmt
        return stmt

    def _claim_select(self, group: str, limit: int, now: float) -> Select[Any]:
        return self._pick_stmt().params(c_group=group, c_now=now, c_limit=limit)  # type: ignore[no-any-return]

    def explain_claim(self, limit: int = 4) -> dict[str, list[str]]:
        """The database's plans for the claim's two reads, one line per plan row (for tests and tuning).

        ``groups``: which groups have runnable work; ``claim``: one group's best
        rows; ``lease``: the UPDATE that leases them (not run: only explained).
        """
        now = time.time()
        values = {"c_group": schema.DEFAULT_GROUP, "c_now": now, "c_owner": "explain", "c_expires": now, "c_limit": limit}
        if self.engine.dialect.update_returning:
            lease = self._lease_stmt(False, values)
        else:
            lease = self._lease_stmt(True, {**values, "c_ids": list(range(1, limit + 1))})

        def work(conn: Connection) -> dict[str, list[str]]:
            return {
                "groups": self.dialect.explain(conn, self._groups_select(now)),
                "claim": self.dialect.explain(conn, self._claim_select(schema.DEFAULT_GROUP, limit, now)),
                "lease": self.dialect.explain(conn, lease),
            }

        return self._txn(work)

    def _claim(self, conn: Connection, owner: str, limit: int, ttl: float, now: float) -> list[Claimed]:
        """Weighted fair share by stride scheduling, with per-group limits, shared by every process.

        The rows of the groups that have runnable work are locked (in name
        order), so claims that could touch the same groups take turns: the
        limits and virtual times they read stay true until they commit. Each
        group's virtual time is the number of jobs it has started divided by
        its weight; slots go, one at a time, to the group furthest behind. A
        group that comes back after idling starts at the global virtual time
        (the lowest among the groups still busy), so it cannot claim a backlog
        of turns. With a single runnable group the order is just priority,
        then age, and no virtual time moves.
        """
        g, j = self.tables.groups, self.tables.jobs
        rows = conn.execute(self._groups_stmt(True), {"c_now": now}).all()
        if not rows:
            return []
        # Taken after the locks and the running counts below: a job claimed here
        # starts after every job whose end these counts saw (the rows prove limits).
        limited = [r.name for r in rows if r.max_running is not None]
        running: dict[str, int] = {}
        if limited:
            count = select(j.c.group_key, func.count()).where(self._active, j.c.group_key.in_(limited))
            running = {name: int(n) for name, n in conn.execute(count.group_by(j.c.group_key)).all()}
        now = max(now, time.time())
        caps = {
            r.name: limit if r.max_running is None else min(limit, max(0, r.max_running - running.get(r.name, 0)))
            for r in rows
        }
        groups = [r for r in rows if caps[r.name] > 0]
        if not groups:
            return []
        if len(rows) == 1:
            return self._claim_rows(conn, groups[0].name, caps[groups[0].name], owner, ttl, now)

        meta = self.tables.meta
        vtime_stmt = select(meta.c.value).where(meta.c.name == "vtime")
        vtime = float(conn.execute(self.dialect.for_update(vtime_stmt)).scalar() or 0.0)
        vt = {r.name: max(float(r.vtime), vtime) for r in groups}
        weight = {r.name: max(1, r.weight) for r in groups}
        got = {r.name: 0 for r in groups}
        exhausted: set[str] = set()
        picked: dict[str, list[Claimed]] = {}
        order: list[str] = []
        free = limit
        while free > 0:
            # Hand out the free slots one by one to the group furthest behind.
            heap = [(vt[n], n) for n in got if n not in exhausted and got[n] < caps[n]]
            if not heap:
                break
            heapq.heapify(heap)
            want: dict[str, int] = {}
            sim = dict(vt)
            for _ in range(free):
                if not heap:
                    break
                _, n = heapq.heappop(heap)
                order.append(n)
                want[n] = want.get(n, 0) + 1
                sim[n] += 1.0 / weight[n]
                if got[n] + want[n] < caps[n]:
                    heapq.heappush(heap, (sim[n], n))
            for n, k in want.items():
                claimed = self._claim_rows(conn, n, k, owner, ttl, now)
                picked.setdefault(n, []).extend(claimed)
                got[n] += len(claimed)
                vt[n] += len(claimed) / weight[n]
                free -= len(claimed)
                if len(claimed) < k:
                    exhausted.add(n)  # nothing more runnable there (or locked by another claim)
        stored = {r.name: float(r.vtime) for r in rows}
        served = [{"b_name": n, "b_vtime": vt[n]} for n in got if vt[n] != stored[n]]
        if served:
            conn.execute(update(g).where(g.c.name == bindparam("b_name")).values(vtime=bindparam("b_vtime")), served)
        busy = [vt[n] for n in got if n not in exhausted]
        new_vtime = max(vtime, min(busy)) if busy else vtime
        if new_vtime != vtime:
            conn.execute(update(meta).where(meta.c.name == "vtime").values(value=repr(new_vtime)))
        # Dispatch in the order the slots were handed out (interleaved), so that
        # the jobs a child holds queued start fairly too; a slot whose group
        # came back with fewer rows than asked is skipped.
        out: list[Claimed] = []
        cursor = {n: 0 for n in picked}
        for n in order:
            if cursor.get(n, 0) < len(picked.get(n, ())):
                out.append(picked[n][cursor[n]])
                cursor[n] += 1
        return out

    def _claim_rows(self, conn: Connection, group: str, limit: int, owner: str, ttl: float, now: float) -> list[Claimed]:
        """Lease the ``limit`` best runnable rows of one group (skipping rows another claim holds)."""
        values = {"c_group": group, "c_now": now, "c_owner": owner, "c_expires": now + ttl, "c_limit": limit}
        if self.engine.dialect.update_returning:
            # One statement (PostgreSQL, SQLite): lease the rows the claim's
            # select picks and read them back. RETURNING has no order: sort
            # as the select did.
            got = sorted(conn.execute(self._lease_stmt(False), values).all(), key=lambda r: (-r.priority, r.id))
            return [Claimed(int(r.id), r.attempt, r.payload, r.fn_name, r.timeout) for r in got]
        rows = conn.execute(self._pick_stmt(), values).all()
        if not rows:
            return []
        conn.execute(self._lease_stmt(True), {**values, "c_ids": [int(r.id) for r in rows]})
        return [Claimed(int(r.id), r.attempt + 1, r.payload, r.fn_name, r.timeout) for r in rows]

    def _lease_stmt(self, by_ids: bool, literal: dict[str, Any] | None = None) -> Any:
        """The UPDATE that leases rows: the ids a select picked (``c_ids``), or with RETURNING the select itself.

        Built once with bound values; with ``literal`` (for EXPLAIN) built
        with those values in it.
        """
        key = ("lease", by_ids)
        stmt = self._stmts.get(key) if literal is None else None
        if stmt is None:
            j = self.tables.jobs
            v: dict[str, Any] = literal or {n: bindparam(n) for n in ("c_owner", "c_expires", "c_now")}
            stmt = update(j).values(
                state=schema.LEASED,
                attempt=j.c.attempt + 1,
                lease_owner=v["c_owner"],
                lease_expires=v["c_expires"],
                started_at=v["c_now"],
            )
            if by_ids:
                ids = literal["c_ids"] if literal else bindparam("c_ids", expanding=True)
                stmt = stmt.where(j.c.id.in_(ids))
            else:
                picks = self._pick_stmt()
                if literal:
                    picks = picks.params(c_group=literal["c_group"], c_now=literal["c_now"], c_limit=literal["c_limit"])
                stmt = stmt.where(self.dialect.id_in(j.c.id, picks.with_only_columns(j.c.id))).returning(
                    j.c.id, j.c.attempt, j.c.payload, j.c.fn_name, j.c.timeout, j.c.priority
                )
            if literal is None:
                self._stmts[key] = stmt
        return stmt

    def heartbeat(self, job_id: int, attempt: int, ttl: float, now: float) -> bool:
        """Renew the lease of ``(job_id, attempt)`` and mark it running; False if the lease is gone."""
        j = self.tables.jobs

        def work(conn: Connection) -> bool:
            res = conn.execute(
                update(j)
                .where(j.c.id == job_id, j.c.attempt == attempt, self._active)
                .values(state=schema.RUNNING, lease_expires=now + ttl)
            )
            return res.rowcount == 1

        return self._txn(work, tries=3)

    def renew(self, held: Sequence[tuple[int, int]], ttl: float, now: float) -> None:
        """Extend the leases of claimed jobs that no child has started yet (state ``leased``)."""
        j = self.tables.jobs
        stmt = (
            update(j)
            .where(j.c.id == bindparam("b_id"), j.c.attempt == bindparam("b_attempt"), j.c.state == schema.LEASED)
            .values(lease_expires=now + ttl)
        )
        self._txn(lambda conn: conn.execute(stmt, [{"b_id": i, "b_attempt": a} for i, a in held]))

    def release(self, job_id: int, attempt: int) -> bool:
        """Give back a claimed job that never started (its child could not start); False if not held."""
        j = self.tables.jobs

        def work(conn: Connection) -> bool:
            res = conn.execute(
                update(j)
                .where(j.c.id == job_id, j.c.attempt == attempt, self._active)
                .values(state=schema.READY, lease_owner=None, lease_expires=None)
            )
            self._notify(conn, ready=res.rowcount == 1)
            return res.rowcount == 1

        return self._txn(work)

    def reclaim_expired(self, now: float) -> list[int]:
        """Put jobs whose lease expired (their executor or child died) back to ``ready``."""
        j = self.tables.jobs

        def work(conn: Connection) -> list[int]:
            stmt = select(j.c.id, j.c.attempt, j.c.lease_owner, j.c.started_at).where(
                self._active, j.c.lease_expires < now
            )
            rows = conn.execute(self.dialect.for_claim(stmt)).all()
            if not rows:
                return []
            ids = [r.id for r in rows]
            conn.execute(
                update(j)
                .where(j.c.id.in_(ids), self._active, j.c.lease_expires < now)
                .values(state=schema.READY, lease_owner=None, lease_expires=None)
            )
            conn.execute(
                insert(self.tables.attempts),
                [
                    {
                        "job_id": r.id,
                        "attempt": r.attempt,
                        "worker": r.lease_owner,
                        "started_at": r.started_at,
                        "ended_at": now,
                        "outcome": "lease expired",
                        "detail": "no heartbeat before the lease expired; the job was put back to ready",
                    }
                    for r in rows
                ],
            )
            self._notify(conn, ready=True)
            return [int(i) for i in ids]

        return self._txn(work)

    # -- finalize -------------------------------------------------------------

    def _finish(self, conn: Connection, reports: Sequence[Report], now: float) -> Finished:
        """Record how a batch of attempts ended, in the caller's transaction.

        Per report: the result (or exception) and the final state are written
        together, guarded by the attempt token; a failure with retries left goes
        back to ``ready`` after a backoff. Dependents of jobs that finished are
        released, failed or cancelled in the same transaction.
        """
        j = self.tables.jobs
        out = Finished([], [], [])
        reports = sorted(reports, key=lambda r: r.job_id)  # one lock order for every writer
        ok = [r for r in reports if r.ok]
        won = self._finish_ok(conn, ok, now)
        for rep in ok:
            if rep.job_id in won:
                out.finals.append(Final(rep.job_id, schema.DONE, rep.blob))
        out.released, rolled = self._release_dependents(conn, sorted(won), now)
        out.finals += rolled
        lost = {r.job_id for r in ok} - won
        for rep in reports:
            if rep.ok:
                continue
            guard = (j.c.id == rep.job_id, j.c.attempt == rep.attempt, self._active)
            cleared = {"lease_owner": None, "lease_expires": None}
            retry_at = now + rep.retry_delay * (2 ** max(rep.attempt - 1, 0)) * (0.75 + random.random() / 2)
            res = conn.execute(
                update(j)
                .where(*guard, j.c.retries >= rep.attempt)
                .values(state=schema.READY, error=rep.error, run_after=retry_at, **cleared)
            )
            if res.rowcount == 1:
                out.retried.append(rep.job_id)
                continue
            res = conn.execute(
                update(j)
                .where(*guard)
                .values(state=schema.FAILED, result=rep.blob, error=rep.error, finished_at=now, **cleared)
            )
            if res.rowcount == 1:
                out.finals.append(Final(rep.job_id, schema.FAILED, rep.blob))
                out.finals.extend(self._fail_dependents(conn, rep.job_id, rep.blob, now))
            else:
                lost.add(rep.job_id)
        out.lost = sorted(lost)
        attempts = [
            {
                "job_id": rep.job_id,
                "attempt": rep.attempt,
                "worker": rep.worker,
                "started_at": rep.started_at,
                "ended_at": rep.ended_at or now,
                "outcome": (f"lease lost ({rep.outcome})" if rep.job_id in lost else rep.outcome)[:64],
                "detail": rep.error,
            }
            for rep in reports
        ]
        self._insert_rows(conn, self.tables.attempts, attempts)
        return out

    def _finish_ok(self, conn: Connection, reports: Sequence[Report], now: float) -> set[int]:
        """Mark the successful attempts done; return the ids whose token still held.

        Every row is guarded by ``(id, attempt)`` and an active state. Where the
        dialect has a set-based form (PostgreSQL, MySQL) it is one statement per
        chunk; otherwise an executemany.
        """
        if not reports:
            return set()
        j = self.tables.jobs
        won = self.dialect.finish_many(conn, j, [(r.job_id, r.attempt, r.blob) for r in reports], now)
        if won is None:
            stmt = (
                update(j)
                .where(j.c.id == bindparam("b_id"), j.c.attempt == bindparam("b_attempt"), self._active)
                .values(
                    state=schema.DONE,
                    result=bindparam("b_result"),
                    error=None,
                    finished_at=now,
                    lease_owner=None,
                    lease_expires=None,
                )
            )
            params = [{"b_id": r.job_id, "b_attempt": r.attempt, "b_result": r.blob} for r in reports]
            res = conn.execute(stmt, params) if len(params) > 1 else conn.execute(stmt, params[0])
            counted = res.rowcount == len(reports) and (len(params) == 1 or self.engine.dialect.supports_sane_multi_rowcount)
            won = {r.job_id for r in reports} if counted else set()
        unsure = [r for r in reports if r.job_id not in won]
        if unsure:
            # Some lease was lost, or the statement only gave a count that fell
            # short: the token tells which rows this transaction finalized.
            mine = {(r.job_id, r.attempt) for r in unsure}
            found = conn.execute(
                select(j.c.id, j.c.attempt).where(
                    self.dialect.in_ids(j.c.id, [r.job_id for r in unsure]), j.c.state == schema.DONE
                )
            ).all()
            won |= {int(r.id) for r in found if (int(r.id), r.attempt) in mine}
        return won

    def _dependents(self, conn: Connection, upstream: Sequence[int]) -> list[tuple[int, int, bool]]:
        """``(dependent, upstream, dependent is a batch)`` for every edge out of ``upstream``."""
        pairs: list[Any] = []
        for chunk in _chunks(list(upstream)):
            pairs += conn.execute(self.dialect.edges_out(self.tables.deps, self.tables.jobs, chunk)).all()
        return [(int(a), int(b), bool(c)) for a, b, c in pairs]

    def _release_dependents(self, conn: Connection, done_ids: Sequence[int], now: float) -> tuple[int, list[Final]]:
        """Count down the open dependencies of the jobs waiting on ``done_ids``.

        A job reaching zero becomes ready; a batch reaching zero is rolled up
        to done at once, and its own dependents are counted down in turn.
        Returns how many jobs became ready and the batches that finished.
        """
        j = self.tables.jobs
        released = 0
        finals: list[Final] = []
        while done_ids:
            finished_upstreams: dict[int, int] = {}
            batches: set[int] = set()
            for dep, _, is_batch in self._dependents(conn, done_ids):
                finished_upstreams[dep] = finished_upstreams.get(dep, 0) + 1
                if is_batch:
                    batches.add(dep)
            by_count: dict[tuple[int, bool], list[int]] = {}
            for dep, k in finished_upstreams.items():
                by_count.setdefault((k, dep in batches), []).append(dep)
            for (k, is_batch), ids in sorted(by_count.items()):
                for chunk in _chunks(sorted(ids)):
                    # state is assigned before open_deps: MySQL evaluates SET items left
                    # to right with the new values, PostgreSQL and SQLite with the old.
                    values: dict[str, Any] = {"open_deps": j.c.open_deps - k}
                    if not is_batch:  # a batch stays waiting; it is rolled up below
                        values = {"state": case((j.c.open_deps <= k, schema.READY), else_=j.c.state), **values}
                    stmt = update(j).where(self.dialect.in_ids(j.c.id, chunk), j.c.state == schema.WAITING)
                    res = conn.execute(stmt.values(**values))
                    if not is_batch:
                        released += max(res.rowcount, 0)
            done_ids = []
            if batches:
                full = select(j.c.id).where(j.c.id.in_(sorted(batches)), j.c.state == schema.WAITING, j.c.open_deps <= 0)
                rolled = self._roll_up(conn, [int(i) for i in conn.execute(full).scalars()], now)
                finals += rolled
                done_ids = [f.job_id for f in rolled if f.state == schema.DONE]
        return released, finals

    def _roll_up(self, conn: Connection, batch_ids: Sequence[int], now: float) -> list[Final]:
        """Mark finished batches done, with their children's results in order (a list)."""
        j, d = self.tables.jobs, self.tables.deps
        finals: list[Final] = []
        for batch_id in batch_ids:
            stmt = (
                select(j.c.id, j.c.result)
                .select_from(d.join(j, j.c.id == d.c.depends_on_id))
                .where(d.c.job_id == batch_id)
                .order_by(d.c.position)
            )
            state, error = schema.DONE, None
            try:
                # Each child's signature is checked here and the whole list is signed
                # as the batch's own result, so readers check one signature.
                inner = [
                    self.signer.open(r.result, serialization.result_context(r.id), f"the result of job {r.id}")
                    for r in conn.execute(stmt).all()
                ]
                blob = self.signer.sign(serialization.batch_result(inner), serialization.result_context(batch_id))
            except PayloadRejected as rejected:
                state, error = schema.FAILED, f"{type(rejected).__name__}: {rejected}"
                blob = serialization.dump_exception(rejected, signer=self.signer)
            res = conn.execute(
                update(j)
                .where(j.c.id == batch_id, j.c.state == schema.WAITING)
                .values(state=state, result=blob, error=error, finished_at=now, open_deps=0)
            )
            if res.rowcount == 1:
                finals.append(Final(batch_id, state, blob))
                if state == schema.FAILED:
                    finals += self._fail_dependents(conn, batch_id, blob, now)
        return finals

    def _fail_dependents(self, conn: Connection, job_id: int, blob: bytes, now: float) -> list[Final]:
        """Fail every job downstream of ``job_id``: ``DependencyFailed``, or for a batch its child's own error."""
        j = self.tables.jobs
        finals: list[Final] = []
        frontier: dict[int, bytes] = {job_id: blob}
        while frontier:
            by_upstream: dict[tuple[int, bool], list[int]] = {}
            for dep, up, is_batch in self._dependents(conn, list(frontier)):
                by_upstream.setdefault((up, is_batch), []).append(dep)
            nxt: dict[int, bytes] = {}
            for (up, is_batch), deps in sorted(by_upstream.items()):
                if is_batch:
                    error_blob, error = frontier[up], f"batch child job {up} failed"
                else:
                    error_blob = serialization.dependency_failure(up, frontier[up], self.signer)
                    error = f"DependencyFailed: upstream job {up} failed"
                for chunk in _chunks(sorted(deps)):
                    pending = select(j.c.id).where(j.c.id.in_(chunk), j.c.state.in_(schema.PENDING_STATES))
                    hit = [int(i) for i in conn.execute(self.dialect.for_update(pending)).scalars()]
                    if not hit:
                        continue
                    conn.execute(
                        update(j)
                        .where(j.c.id.in_(hit), j.c.state.in_(schema.PENDING_STATES))
                        .values(state=schema.FAILED, result=error_blob, error=error, finished_at=now)
                    )
                    for i in hit:
                        finals.append(Final(i, schema.FAILED, error_blob))
                        nxt[i] = error_blob
            frontier = nxt
        return finals

    # -- cancel ---------------------------------------------------------------

    def cancel(self, job_ids: Sequence[int], now: float) -> list[Final]:
        """Cancel the given jobs that have not started, and everything downstream of them.

        Cancelling a batch also cancels its children that have not started.
        """
        j, d = self.tables.jobs, self.tables.deps

        def work(conn: Connection) -> list[Final]:
            finals: list[Final] = []
            frontier = sorted(set(job_ids))
            batch_children = [
                int(i)
                for chunk in _chunks(frontier)
                for i in conn.execute(
                    select(d.c.depends_on_id)
                    .join(j, j.c.id == d.c.job_id)
                    .where(d.c.job_id.in_(chunk), j.c.batch == 1, j.c.state.in_(schema.PENDING_STATES))
                ).scalars()
            ]
            frontier = sorted(set(frontier) | set(batch_children))
            while frontier:
                hit: list[int] = []
                for chunk in _chunks(frontier):
                    pending = select(j.c.id).where(j.c.id.in_(chunk), j.c.state.in_(schema.PENDING_STATES))
                    hit += [int(i) for i in conn.execute(self.dialect.for_update(pending)).scalars()]
                for chunk in _chunks(hit):
                    conn.execute(
                        update(j)
                        .where(j.c.id.in_(chunk), j.c.state.in_(schema.PENDING_STATES))
                        .values(state=schema.CANCELLED, finished_at=now)
                    )
                finals += [Final(i, schema.CANCELLED, None) for i in hit]
                frontier = sorted({dep for dep, _, _ in self._dependents(conn, hit)})
            self._notify(conn, finished=[f.job_id for f in finals])
            return finals

        return self._txn(work)

    # -- reads ----------------------------------------------------------------

    def finals(self, job_ids: Sequence[int]) -> list[Final]:
        """The given jobs that are in a final state, with their result or exception."""
        j = self.tables.jobs

        def work(conn: Connection) -> list[Final]:
            out: list[Final] = []
            for chunk in _chunks(list(job_ids)):
                rows = conn.execute(
                    select(j.c.id, j.c.state, j.c.result).where(self.dialect.in_ids(j.c.id, chunk), self._final)
                ).all()
                out += [Final(int(r.id), r.state, r.result) for r in rows]
            return out

        return self._txn(work, read_only=True)

    def results(self, job_ids: Sequence[int]) -> dict[int, bytes]:
        """Result pickles of done jobs (a child swaps them in for its ``JobRef`` arguments)."""
        j = self.tables.jobs

        def work(conn: Connection) -> dict[int, bytes]:
            rows = conn.execute(
                select(j.c.id, j.c.result).where(self.dialect.in_ids(j.c.id, job_ids), j.c.state == schema.DONE)
            ).all()
            return {int(r.id): r.result for r in rows}

        return self._txn(work, read_only=True)

    def job(self, job_id: int) -> Final | None:
        """One job's state (with its result or exception if final), or None if there is no such job."""
        j = self.tables.jobs

        def work(conn: Connection) -> Final | None:
            row = conn.execute(select(j.c.state, j.c.result).where(j.c.id == job_id)).first()
            if row is None:
                return None
            return Final(job_id, row.state, row.result if row.state in schema.FINAL_STATES else None)

        return self._txn(work, read_only=True)

    def job_id_for_key(self, key: str) -> int | None:
        """The id of the job with ``key``, or None."""
        j = self.tables.jobs
        found = self._txn(lambda c: c.execute(select(j.c.id).where(j.c.job_key == key)).scalar(), read_only=True)
        return None if found is None else int(found)

    def count_states(self) -> dict[str, int]:
        """Number of jobs per state."""
        j = self.tables.jobs

        def work(conn: Connection) -> dict[str, int]:
            rows = conn.execute(select(j.c.state, func.count()).group_by(j.c.state)).all()
            return {state: int(n) for state, n in rows}

        return self._txn(work, read_only=True)

    def unfinished(self) -> list[int]:
        """Ids of every job that is not in a final state, oldest first."""
        j = self.tables.jobs
        return self._txn(
            lambda c: [int(i) for i in c.execute(select(j.c.id).where(j.c.state.not_in(schema.FINAL_STATES)).order_by(j.c.id)).scalars()],
            read_only=True,
        )

    # -- operations (CLI, retention) -------------------------------------------

    def schema_present(self) -> bool:
        """Whether this prefix's tables exist (read-only commands refuse to run without them)."""
        return bool(inspect(self.engine).has_table(self.tables.jobs.name))

    def migrate(self) -> list[str]:
        """Create missing tables and indexes and record the schema version; names of what was created.

        ``ensure_schema`` only creates missing tables; an index added to an
        existing table in a later release is created here.
        """
        self.ensure_schema()
        created: list[str] = []
        with self.engine.begin() as conn:
            insp = inspect(conn)
            for table in self.tables.metadata.sorted_tables:
                have = {ix["name"] for ix in insp.get_indexes(table.name)}
                for index in sorted(table.indexes, key=lambda ix: str(ix.name)):
                    if index.name not in have:
                        index.create(conn)
                        created.append(str(index.name))
        return created

    def status(self, now: float, running_limit: int = 50) -> dict[str, Any]:
        """Counts per state and per group, the running jobs, and the oldest ready job."""
        j = self.tables.jobs

        def work(conn: Connection) -> dict[str, Any]:
            states = {s: int(n) for s, n in conn.execute(select(j.c.state, func.count()).group_by(j.c.state))}
            groups: dict[str, dict[str, int]] = {}
            for g, st, n in conn.execute(select(j.c.group_key, j.c.state, func.count()).group_by(j.c.group_key, j.c.state)):
                groups.setdefault(g, {})[st] = int(n)
            running = conn.execute(
                select(j.c.id, j.c.fn_name, j.c.state, j.c.group_key, j.c.lease_owner, j.c.attempt, j.c.started_at)
                .where(self._active)
                .order_by(j.c.started_at, j.c.id)
                .limit(running_limit)
            ).all()
            oldest = conn.execute(
                select(j.c.id, j.c.fn_name, j.c.group_key, j.c.created_at, j.c.run_after)
                .where(self._ready)
                .order_by(j.c.created_at, j.c.id)
                .limit(1)
            ).first()
            return {
                "states": {s: states.get(s, 0) for s in schema.ALL_STATES},
                "total": sum(states.values()),
                "groups": {g: {s: c.get(s, 0) for s in schema.ALL_STATES} for g, c in sorted(groups.items())},
                "running": [
                    {
                        "id": int(r.id),
                        "function": r.fn_name,
                        "state": r.state,
                        "group": r.group_key,
                        "worker": r.lease_owner,
                        "attempt": int(r.attempt),
                        "age": None if r.started_at is None else max(0.0, now - r.started_at),
                    }
                    for r in running
                ],
                "oldest_ready": None
                if oldest is None
                else {
                    "id": int(oldest.id),
                    "function": oldest.fn_name,
                    "group": oldest.group_key,
                    "age": max(0.0, now - oldest.created_at),
                    "run_after": oldest.run_after,
                },
            }

        return self._txn(work, read_only=True)

    def list_jobs(
        self,
        *,
        states: Sequence[str] = (),
        group: str | None = None,
        function: str | None = None,
        key: str | None = None,
        created_before: float | None = None,
        created_after: float | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Jobs matching every given filter, newest first (``function``: a substring of the name)."""
        j = self.tables.jobs
        stmt = select(
            j.c.id, j.c.state, j.c.group_key, j.c.fn_name, j.c.job_key, j.c.attempt, j.c.retries,
            j.c.created_at, j.c.finished_at, j.c.lease_owner, j.c.error,
        )
        if states:
            stmt = stmt.where(j.c.state.in_(list(states)))
        if group is not None:
            stmt = stmt.where(j.c.group_key == group)
        if function is not None:
            stmt = stmt.where(j.c.fn_name.contains(function, autoescape=True))
        if key is not None:
            stmt = stmt.where(j.c.job_key == key)
        if created_before is not None:
            stmt = stmt.where(j.c.created_at < created_before)
        if created_after is not None:
            stmt = stmt.where(j.c.created_at >= created_after)
        stmt = stmt.order_by(j.c.id.desc()).limit(limit)
        rows = self._txn(lambda conn: conn.execute(stmt).all(), read_only=True)
        return [
            {
                "id": int(r.id),
                "state": r.state,
                "group": r.group_key,
                "function": r.fn_name,
                "key": r.job_key,
                "attempt": int(r.attempt),
                "retries": int(r.retries),
                "created_at": r.created_at,
                "finished_at": r.finished_at,
                "worker": r.lease_owner,
                "error": r.error,
            }
            for r in rows
        ]

    def job_detail(self, job_id: int) -> dict[str, Any] | None:
        """Everything about one job: its columns (blobs included), its edges both ways, and its attempts."""
        j, d, a = self.tables.jobs, self.tables.deps, self.tables.attempts

        def work(conn: Connection) -> dict[str, Any] | None:
            row = conn.execute(select(j).where(j.c.id == job_id)).first()
            if row is None:
                return None
            up = conn.execute(
                select(j.c.id, j.c.state).join(d, d.c.depends_on_id == j.c.id).where(d.c.job_id == job_id).order_by(j.c.id)
            ).all()
            down = conn.execute(
                select(j.c.id, j.c.state).join(d, d.c.job_id == j.c.id).where(d.c.depends_on_id == job_id).order_by(j.c.id)
            ).all()
            tries = conn.execute(select(a).where(a.c.job_id == job_id).order_by(a.c.id)).all()
            return {
                "job": dict(row._mapping),
                "depends_on": [{"id": int(r.id), "state": r.state} for r in up],
                "dependents": [{"id": int(r.id), "state": r.state} for r in down],
                "attempts": [
                    {k: v for k, v in r._mapping.items() if k not in ("id", "job_id")} for r in tries
                ],
            }

        return self._txn(work, read_only=True)

    def ids_in_state(self, state: str) -> list[int]:
        """Ids of every job in ``state``, oldest first."""
        j = self.tables.jobs
        return self._txn(
            lambda c: [int(i) for i in c.execute(select(j.c.id).where(j.c.state == state).order_by(j.c.id)).scalars()],
            read_only=True,
        )

    def retry(self, job_ids: Sequence[int], retries: int, now: float) -> tuple[dict[int, str], dict[int, str]]:
        """Put failed or cancelled jobs back to ``ready`` (or ``waiting``), with their dependents.

        Each job gets ``retries`` further retries after the next attempt: its
        ``retries`` column becomes ``attempt + retries``, because the budget is
        counted against the attempt token, which keeps growing (it is the
        fencing token, so it is never reset). A dependent that failed with
        ``DependencyFailed`` because of a revived job is revived too, as
        ``waiting``, transitively. A job whose upstream is failed or cancelled
        (and not revived in the same call) is refused: it could never run.

        Every change is an ``UPDATE`` guarded by the state and attempt read
        under a row lock, in one transaction. Returns (revived id -> new state,
        refused id -> reason) for the requested ids.
        """
        targets = sorted(set(job_ids))
        j = self.tables.jobs

        def work(conn: Connection) -> tuple[dict[int, str], dict[int, str]]:
            revived: dict[int, str] = {}
            reasons: dict[int, str] = {}
            candidates: dict[int, bool] = {i: True for i in targets}  # id -> asked for (else: a dependent)
            progress = True
            while progress:  # until nothing more can be revived (an upstream revived late unblocks others)
                progress = False
                for jid in sorted(candidates):
                    if jid in revived:
                        continue
                    why = self._revive(conn, jid, candidates[jid], revived, retries)
                    if why is None:
                        progress = True
                        reasons.pop(jid, None)
                        for dep, _, _ in self._dependents(conn, [jid]):
                            candidates.setdefault(dep, False)
                    else:
                        reasons[jid] = why
            refused = {i: why for i, why in reasons.items() if candidates.get(i)}
            # A revived batch whose children are all done again rolls up now.
            batches = [i for i, st in revived.items() if st == schema.WAITING]
            if batches:
                full = select(j.c.id).where(j.c.id.in_(batches), j.c.batch == 1, j.c.open_deps <= 0)
                for final in self._roll_up(conn, [int(i) for i in conn.execute(full).scalars()], now):
                    revived[final.job_id] = final.state
            self._notify(conn, ready=any(st == schema.READY for st in revived.values()))
            return revived, refused

        return self._txn(work)

    def _revive(self, conn: Connection, job_id: int, asked: bool, revived: dict[int, str], retries: int) -> str | None:
        """Revive one job in the caller's transaction; None if done, else why not."""
        j, d = self.tables.jobs, self.tables.deps
        row = conn.execute(
            self.dialect.for_update(select(j.c.id, j.c.state, j.c.attempt, j.c.error, j.c.batch).where(j.c.id == job_id))
        ).first()
        if row is None:
            return "no such job"
        if asked:
            if row.state not in (schema.FAILED, schema.CANCELLED):
                return f"job {job_id} is {row.state}; only failed or cancelled jobs can be retried"
        else:
            found = _DEPENDENCY_ERROR.match(row.error or "")
            if row.state != schema.FAILED or found is None or int(found.group(1)) not in revived:
                return "did not fail because of a revived job"
        ups = [int(i) for i in conn.execute(select(d.c.depends_on_id).where(d.c.job_id == job_id)).scalars()]
        open_deps = 0
        if ups:
            rows = conn.execute(
                self.dialect.for_update(select(j.c.id, j.c.state).where(j.c.id.in_(ups)).order_by(j.c.id))
            ).all()
            for r in rows:
                if r.id in revived or r.state not in schema.FINAL_STATES:
                    open_deps += 1
                elif r.state != schema.DONE:
                    return f"upstream job {r.id} is {r.state}; retry it first, or together with this one"
        # A batch never becomes ready: it waits for its children and is rolled up.
        state = schema.WAITING if open_deps or row.batch else schema.READY
        res = conn.execute(
            update(j)
            .where(j.c.id == job_id, j.c.state == row.state, j.c.attempt == row.attempt)
            .values(
                state=state,
                open_deps=open_deps,
                retries=row.attempt + retries,
                result=None,
                error=None,
                finished_at=None,
                run_after=None,
                lease_owner=None,
                lease_expires=None,
            )
        )
        if res.rowcount != 1:
            return f"job {job_id} changed meanwhile; try again"
        revived[job_id] = state
        return None

    def purge_batch(self, cutoff: float, limit: int = _IN_CHUNK) -> int:
        """Delete up to ``limit`` finished jobs that finished before ``cutoff``, with their edges and attempts.

        A job is kept while any job depending on it is unfinished or finished
        at or after ``cutoff`` (an unfinished dependent still needs its
        result). Rows another transaction holds are skipped, not waited for.
        Returns how many jobs were deleted.
        """
        j, d, a = self.tables.jobs, self.tables.deps, self.tables.attempts
        dj = j.alias("downstream")
        final = j.c.state.in_(schema.FINAL_STATES)
        old = j.c.finished_at < cutoff
        keeps = or_(dj.c.state.not_in(schema.FINAL_STATES), dj.c.finished_at.is_(None), dj.c.finished_at >= cutoff)

        def work(conn: Connection) -> int:
            needed = select(d.c.job_id).join(dj, dj.c.id == d.c.job_id).where(d.c.depends_on_id == j.c.id, keeps)
            ids = list(
                conn.execute(select(j.c.id).where(final, old, ~needed.exists()).order_by(j.c.id).limit(limit)).scalars()
            )
            if not ids:
                return 0
            locked = list(conn.execute(self.dialect.for_claim(select(j.c.id).where(j.c.id.in_(ids), final, old))).scalars())
            # Checked again after the lock, in a new statement (a fresh snapshot at READ
            # COMMITTED): a submit that made one of these an upstream meanwhile has committed.
            blocked = set(
                conn.execute(
                    select(d.c.depends_on_id).join(dj, dj.c.id == d.c.job_id).where(d.c.depends_on_id.in_(locked), keeps)
                ).scalars()
            ) if locked else set()
            gone = sorted(set(locked) - blocked)
            if not gone:
                return 0
            conn.execute(delete(a).where(a.c.job_id.in_(gone)))
            conn.execute(delete(d).where(or_(d.c.job_id.in_(gone), d.c.depends_on_id.in_(gone))))
            return int(conn.execute(delete(j).where(j.c.id.in_(gone), final)).rowcount)

        return self._txn(work)

    def purge(self, cutoff: float, batch: int = _IN_CHUNK) -> int:
        """:meth:`purge_batch` until nothing more goes; one transaction per batch. Returns the total."""
        total = 0
        while True:
            n = self.purge_batch(cutoff, batch)
            total += n
            if n == 0:
                return total

    def release_running(self, held: Sequence[tuple[int, int, float | None]], worker: str, now: float, why: str) -> list[int]:
        """Put jobs a stopping worker still holds back to ``ready``; ids released.

        ``held`` is ``(job_id, attempt, started_at)``. Guarded by the attempt
        token: a job whose lease was already lost (reclaimed, finished
        elsewhere) is left alone. Each release is recorded as an attempt.
        """
        j = self.tables.jobs

        def work(conn: Connection) -> list[int]:
            released: list[int] = []
            for job_id, attempt, started in sorted(held):
                res = conn.execute(
                    update(j)
                    .where(j.c.id == job_id, j.c.attempt == attempt, self._active)
                    .values(state=schema.READY, lease_owner=None, lease_expires=None)
                )
                if res.rowcount != 1:
                    continue
                released.append(job_id)
                conn.execute(
                    insert(self.tables.attempts).values(
                        job_id=job_id, attempt=attempt, worker=worker, started_at=started,
                        ended_at=now, outcome="released", detail=why,
                    )
                )
            self._notify(conn, ready=bool(released))
            return released

        return self._txn(work)


def worker_name(pid: int) -> str:
    """``host:pid``, how attempts and leases name the process that holds them."""
    return f"{socket.gethostname()}:{pid}"
