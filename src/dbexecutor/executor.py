"""``DBExecutor``: the public executor. No SQL here and no process handling.

``submit`` pickles the call, turns futures among the arguments into
dependency edges, and inserts the row; the scheduler thread does the rest.
The executor keeps what every way of submitting shares (checking it is open,
what may be a dependency, writing rows: queued, keyed, or through the
caller's transaction); each operation with more to it has its own module:

- :mod:`dbexecutor.options`: ``JobOptions`` and the checks of an option's value;
- :mod:`dbexecutor.calls`: one call to one row (dependencies, payload, options);
- :mod:`dbexecutor.mapping`: ``map``, its slices and the iterator of its results;
- :mod:`dbexecutor.batch`: ``Batch``, jobs submitted as one unit;
- :mod:`dbexecutor.submitter`: ``Submitter``, what ``options()`` returns.

Their public names are importable from here too, as they always were.
"""

from __future__ import annotations

import math
import os
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.context import BaseContext
from typing import Any, TypeVar

from sqlalchemy.engine import URL

from . import intransaction, schema, serialization
from .batch import Batch
from .calls import prepare
from .durations import Duration, seconds
from .child import run_chunk as _run_chunk  # unused here: chunked rows written before it moved to child.py name it
from .future import JobFuture
from .mapping import submit_map
from .options import JobOptions, required_seconds, with_options
from .queues import EVERY, program_queue, serving
from .pool import IMPORTING_MAIN, default_context, default_workers, importing_main
from .scheduler import Scheduler, Settings, interpreter_shutting_down
from .readmodels import GroupInfo
from .records import Final, NewJob
from .store import Store
from .submitter import Submitter
from .submitting import SubmitsJobs

__all__ = ["DBExecutor", "JobOptions", "Submitter", "Batch"]

T = TypeVar("T")


def _url_needed(url: object) -> str:
    hint = ""
    if isinstance(url, os.PathLike):
        hint = f" (for an SQLite file: 'sqlite:///{os.fspath(url)}')"
    return (
        "DBExecutor needs a database URL string, e.g. 'sqlite:///jobs.db', 'postgresql://user@host/db' "
        f"or 'mysql://user@host/db'; got {url!r}{hint}"
    )


def _ended_badly(fut: Future[Any]) -> bool:
    """Whether ``fut`` is already cancelled or failed (without waiting)."""
    return fut.done() and (fut.cancelled() or fut.exception(0) is not None)


class DBExecutor(SubmitsJobs, Executor):
    """A ``concurrent.futures.Executor`` whose only durable state is a database.

    A drop-in for ``ProcessPoolExecutor``: the first argument is a SQLAlchemy
    URL (``sqlite:///jobs.db``, ``postgresql://user@host/db``,
    ``mysql://user@host/db``), the rest mirror ``ProcessPoolExecutor``.
    Keyword-only options set the defaults for every job. Durations
    (``lease_ttl``, ``heartbeat_interval``, ``timeout``, ``retry_delay``,
    ``poll_interval``, ``retention``) take seconds, a ``timedelta`` or a
    string such as ``"90s"``, ``"30m"``, ``"1h30m"`` or ``"7d"``:

    - ``prefix``: table-name prefix, so the tables can share an application's database;
    - ``lease_ttl`` / ``heartbeat_interval``: seconds a claim lives without renewal,
      and how often a running child beats and the executor renews (default ``lease_ttl / 6``);
    - ``timeout``: seconds per attempt before the child's whole process tree is
      killed (``None``: no limit); ``retries`` and ``retry_delay``: further
      attempts after a failure, with exponential backoff and jitter;
    - ``poll_interval``: how often the database is asked for work that other
      processes made ready and for jobs they finished;
    - ``retention``: how long finished jobs are kept; older
      ones are deleted in small batches by this executor's scheduler, never one
      that an unfinished job still depends on (``None``: keep everything);
    - ``secret``: sign payloads and results with HMAC-SHA256 and refuse to
      unpickle anything unsigned or altered (default ``$DBEXECUTOR_SECRET``);
    - ``run_jobs``: ``False`` makes a submit-only executor that never claims a
      job: standalone workers (``dbexecutor worker``) run them, and the futures
      resolve when the rows say the jobs finished;
    - ``listen_url`` (PostgreSQL): the URL of the one connection that LISTENs
      for wake-ups, when ``url`` goes through a transaction pooler such as
      PgBouncer, where LISTEN does not work: the same database, reached
      directly. Without it, an executor whose URL goes through a pooler
      polls every ``poll_interval`` instead (and logs a warning once);
    - ``durable_submit``: ``True`` makes ``submit`` return only once its row is
      committed. By default ``submit`` queues the row and returns at once; the
      scheduler commits everything queued in one transaction, within about one
      commit's time (it also claims in that transaction). If this process
      dies in that window, the jobs it had just submitted are not stored.
      :meth:`flush` (and reading a future's ``job_id``) write the queue now.

    Jobs run at least once: a job whose executor or child died mid-run runs
    again, but its row is finalized exactly once.
    """

    def __init__(
        self,
        url: str | URL,
        max_workers: int | None = None,
        mp_context: BaseContext | None = None,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        *,
        max_tasks_per_child: int | None = None,
        prefix: str = "",
        lease_ttl: Duration = 30.0,
        heartbeat_interval: Duration | None = None,
        timeout: Duration | None = None,
        retries: int = 0,
        retry_delay: Duration = 1.0,
        poll_interval: Duration = 0.2,
        retention: Duration | None = None,
        secret: str | bytes | None = None,
        run_jobs: bool = True,
        durable_submit: bool = False,
        listen_url: str | None = None,
        queues: str | Iterable[str] | None = None,
    ) -> None:
        # Checked before anything is built: DBExecutor(os.environ.get("URL")) should say what is missing.
        if not isinstance(url, (str, URL)):
            raise TypeError(_url_needed(url))
        if importing_main():
            raise RuntimeError(IMPORTING_MAIN)
        if max_workers is None:
            max_workers = default_workers()
        elif max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        if mp_context is None:
            mp_context = default_context()
        if max_tasks_per_child is not None:
            if not isinstance(max_tasks_per_child, int):
                raise TypeError("max_tasks_per_child must be an integer")
            if max_tasks_per_child <= 0:
                raise ValueError("max_tasks_per_child must be >= 1")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        ttl = required_seconds(lease_ttl, "lease_ttl")
        if not ttl > 0:
            raise ValueError("lease_ttl must be > 0 seconds")
        beat = ttl / 6 if heartbeat_interval is None else required_seconds(heartbeat_interval, "heartbeat_interval")
        if not 0 < beat < ttl:
            raise ValueError("heartbeat_interval must be > 0 and shorter than lease_ttl")
        poll = required_seconds(poll_interval, "poll_interval")
        if not poll > 0:
            raise ValueError("poll_interval must be > 0")
        keep = seconds(retention, "retention")
        if keep is not None and not (keep > 0 and math.isfinite(keep)):
            raise ValueError("retention must be a positive duration, e.g. 604800, '7d' or a timedelta (or None to keep jobs)")
        # timeout, retries and retry_delay are every job's defaults, checked as per-job options are.
        backoff = required_seconds(retry_delay, "retry_delay")
        self._defaults = JobOptions(timeout=seconds(timeout, "timeout"), retries=retries, retry_delay=backoff)
        self._store = Store(url, prefix, signer=serialization.Signer.from_env(secret), listen_url=listen_url)
        self._submitter_id = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        settings = Settings(
            max_workers=max_workers,
            mp_context=mp_context,
            initializer=initializer,
            initargs=tuple(initargs),
            max_tasks_per_child=max_tasks_per_child,
            lease_ttl=ttl,
            heartbeat_interval=beat,
            timeout=self._defaults.timeout,
            retry_delay=backoff,
            poll_interval=poll,
            retention=keep,
            run_jobs=run_jobs,
            queues=serving(queues, default=tuple(dict.fromkeys((program_queue(), schema.DEFAULT_QUEUE)))),
        )
        #: Where this executor's jobs go unless ``options(queue=...)`` says otherwise: the first queue
        #: it was given, else the one named after this program (see :mod:`dbexecutor.queues`).
        self.queue = settings.queues[0] if queues is not None and settings.queues else program_queue()
        self._scheduler = Scheduler(self._store, settings)
        self._max_workers = max_workers
        self._durable_submit = durable_submit
        # Dropping the last reference shuts the executor down, as ProcessPoolExecutor does.
        weakref.finalize(self, self._scheduler.request_shutdown)

    def __repr__(self) -> str:
        return f"<DBExecutor {self._store.identity[0]!r} prefix={self._store.prefix!r} max_workers={self._max_workers}>"

    # -- attach ---------------------------------------------------------------

    @classmethod
    def attach(cls, url: str, **options: Any) -> DBExecutor:
        """Open an existing database and resume its unfinished jobs, whatever their queue.

        It serves every queue unless ``queues=`` says otherwise. Expired
        leases, and the jobs of executors on this machine that died, are
        rescued by its first tick; :meth:`futures`, :meth:`future` and
        :meth:`future_for_key` hand back futures.
        """
        options.setdefault("queues", EVERY)
        return cls(url, **options)

    def future(self, job_id: int | None = None, *, key: str | None = None) -> JobFuture[Any]:
        """The future of a job in this database, by id or by key; resolved from the row when it ends.

        Raises ``KeyError`` if there is no such job.
        """
        if (job_id is None) == (key is None):
            raise TypeError("give exactly one of job_id or key")
        self.flush()
        if key is not None:
            job_id = self._store.job_id_for_key(key)
            if job_id is None:
                raise KeyError(f"no job with key {key!r}")
        assert job_id is not None
        row = self._store.job(job_id)
        if row is None:
            raise KeyError(f"no job with id {job_id}")
        return self._scheduler.future_of(row)

    # -- groups and batches -------------------------------------------------------

    def configure_group(self, name: str, *, weight: int | None = None, limit: Any = Store.KEEP) -> GroupInfo:
        """Create or change a fair-share group, for every executor on this database.

        ``weight`` (>= 1): when slots are scarce, groups with ready work start
        jobs in proportion to their weights. ``limit``: at most this many of
        the group's jobs leased or running at once, across every executor and
        worker on the database (``0`` pauses the group, ``None`` removes the
        limit; leave it out to keep the current one). Returns the stored settings.
        """
        if not isinstance(name, str) or not 0 < len(name) <= 255:
            raise ValueError("group must be a non-empty string of at most 255 characters")
        if weight is not None and (not isinstance(weight, int) or weight < 1):
            raise ValueError("weight must be an integer >= 1")
        if limit is not Store.KEEP and limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValueError("limit must be an integer >= 0, or None for no limit")
        info = self._store.configure_group(name, weight=weight, limit=limit)
        self._scheduler.wake()
        return info

    def groups(self) -> list[GroupInfo]:
        """Every group in the database with its weight and limit."""
        return self._store.groups()

    def batch(self) -> Batch:
        """A new :class:`Batch`: jobs submitted through it form one unit with its own future."""
        return Batch(self, self._defaults)

    def futures(self) -> list[JobFuture[Any]]:
        """Futures of every unfinished job in the database, oldest first."""
        self.flush()
        return [self.future(job_id) for job_id in self._store.unfinished()]

    # -- submit ---------------------------------------------------------------

    def flush(self) -> None:
        """Commit every job submitted so far that is not stored yet; return when they are.

        ``submit`` queues its row and returns; the scheduler commits the queue
        within about one commit's time. Call this before telling the outside
        world a job exists (or use ``durable_submit=True``).
        """
        self._scheduler.flush()

    def options(self, **options: Any) -> Submitter:
        """Per-job options for the next ``submit`` / ``map``: ``ex.options(timeout=60, group="io").submit(...)``.

        The names are those of :class:`JobOptions` (an unknown one is a
        ``TypeError`` that lists them); durations take seconds, a
        ``timedelta`` or a string such as ``"90s"`` or ``"1h30m"``.
        """
        return Submitter(self, with_options(self._defaults, options))

    def _submit_call(
        self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], after: Iterable[Future[Any]]
    ) -> JobFuture[T]:
        return self._submit(fn, args, kwargs, after, self._defaults)

    def _dependency(self, fut: Any, in_transaction: bool = False) -> int:
        """The id of ``fut`` as a dependency of a job here; an error that says why it cannot be one."""
        if not isinstance(fut, JobFuture):
            raise TypeError(
                f"a dependency must be a JobFuture from a DBExecutor on the same database, not {type(fut).__name__}"
            )
        if isinstance(fut, Batch) and not fut._sealed:
            raise TypeError("a batch can be a dependency once it is sealed (after its with block, or seal())")
        if in_transaction and not fut.stored and self._store.driver.single_writer:
            # Storing it now needs the write lock, which the caller's transaction may hold: it would wait for itself.
            raise ValueError(
                f"{fut!r} is not stored yet, and this database has one writer at a time: call ex.flush() "
                "before the transaction begins, then submit inside it"
            )
        if fut.job_id is None or fut._identity != self._store.identity:
            raise TypeError(f"{fut!r} belongs to another database or table prefix and cannot be a dependency here")
        return fut.job_id

    def _check_open(self) -> None:
        sched = self._scheduler
        if interpreter_shutting_down():
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        if sched.shutting_down:
            raise RuntimeError("cannot schedule new futures after shutdown")
        if sched.broken is not None:
            raise BrokenProcessPool(sched.broken)

    def _submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        after: Iterable[Future[Any]],
        opts: JobOptions,
    ) -> JobFuture[Any]:
        self._check_open()
        now = self._store.now()
        upstream: list[Future[Any]] = []
        job = prepare(self, fn, args, kwargs, after, opts, now, upstream=upstream)
        if isinstance(job, JobFuture):
            return job
        if opts.connection is not None:
            return self._write_in(opts.connection, [job])[0]
        if job.key is None:
            # The next scheduler tick writes it, with every other submit since
            # the last commit, in the transaction that also claims work. A
            # durable submit is written now, in this thread; so is a job below
            # one known to have failed or been cancelled: it is final on
            # arrival, and its future says so at once.
            write_now = self._durable_submit or bool(upstream and any(_ended_badly(f) for f in upstream))
            fut = self._scheduler.enqueue(job, write=write_now)
            if job.run_after is not None:
                self._scheduler.due(job.run_after)
            return fut
        # A key is looked up first (it may name an existing job, whose future
        # this returns): written now, after the submits queued before it.
        return self._scheduler.write([job], now)[0]

    def _submit_many(
        self, jobs: list[NewJob | JobFuture[Any]], now: float, connection: Any = None
    ) -> list[JobFuture[Any]]:
        """Insert many dependency-free rows with few commits (``map``); futures in input order.

        ``connection``: through the caller's transaction instead (see :meth:`_write_in`).
        """
        rows = [j for j in jobs if isinstance(j, NewJob)]
        written = iter(self._scheduler.write(rows, now) if connection is None else self._write_in(connection, rows))
        return [j if isinstance(j, JobFuture) else next(written) for j in jobs]

    def _write_in(
        self, given: Any, jobs: list[NewJob], futures: list[JobFuture[Any]] | None = None
    ) -> list[JobFuture[Any]]:
        """Write ``jobs`` through the caller's connection (or Session), in its open transaction; their futures.

        Nothing goes through this executor's submit queue or its own
        connections (on SQLite the caller's transaction may hold the one write
        lock). A new job's future knows its id at once and is tracked when the
        transaction commits, or fails with ``SubmitRolledBack`` when it rolls
        back (:mod:`dbexecutor.intransaction`). A key already taken by a
        committed job gives that job's future, as outside a transaction.
        ``futures``, if given, receive the ids (one per job: a sealed batch).
        """
        if not jobs:
            return []
        conn = intransaction.connection_of(given)
        self._store.check_same_database(conn)
        if not conn.in_transaction():
            conn.begin()  # as the caller's next statement would (autobegin): the caller commits it
        txn = intransaction.pending(conn, self._scheduler)
        rows, notices, groups = self._store.insert_through(conn, jobs, self._store.now())
        txn.notices += notices
        txn.groups.update(groups)
        out: list[JobFuture[Any]] = []
        for n, (job, row) in enumerate(zip(jobs, rows)):
            mine = txn.future_of(row.job_id)
            if mine is not None:  # the same key twice in this transaction
                out.append(mine)
            elif row.existing:  # a key a committed job holds: that job's future
                out.append(self._scheduler.future_of(Final(row.job_id, row.state, row.result)))
            else:
                fut = futures[n] if futures is not None else JobFuture(row.job_id, intransaction.NOT_COMMITTED, self._store.identity)
                txn.add(job, row, fut)
                out.append(fut)
        return out

    # -- map ------------------------------------------------------------------

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[T]:
        """As ``ProcessPoolExecutor.map``: results in order; ``chunksize`` items per job.

        The iterator raises ``TimeoutError`` if a result is not there
        ``timeout`` seconds after this call; leaving it early cancels the jobs
        that have not started. ``buffersize`` (as in Python 3.14, on every
        version here): at most this many jobs (of ``chunksize`` items each)
        are submitted ahead of the one the consumer waits for, and the
        iterables are read as results are consumed, so ``map`` works on an
        endless iterator; ``None`` (the default) submits everything at once.
        """
        return submit_map(self, fn, iterables, timeout, chunksize, self._defaults, buffersize)

    # -- shutdown -------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting jobs; with ``wait``, return when this executor's jobs have finished.

        ``cancel_futures`` cancels this executor's jobs that have not started.
        Jobs run by this executor for other processes finish before its
        children stop. A submit-only executor (``run_jobs=False``) asked not
        to wait stops once its submits are stored: its jobs run elsewhere and
        its futures stay pending; the process may exit then (as it may without
        calling ``shutdown`` at all).
        """
        self._scheduler.request_shutdown(cancel_futures=cancel_futures, wait=wait)
        if wait:
            self._scheduler.join()
            self._store.close()
