"""``DBExecutor``: the public executor. No SQL here and no process handling.

``submit`` pickles the call, turns futures among the arguments into
dependency edges, and inserts the row; the scheduler thread does the rest.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, fields, replace
from multiprocessing.context import BaseContext
from typing import Any, ParamSpec, TypeVar, overload

from sqlalchemy.engine import URL

from . import intransaction, schema, serialization
from .durations import Duration, seconds
from .child import run_chunk as _run_chunk  # also the name rows written before it moved refer to
from .future import JobFuture
from .queues import EVERY, check_name, program_queue, serving
from .pool import default_context, default_workers
from .scheduler import Scheduler, Settings, interpreter_shutting_down
from .records import Dep, Final, GroupInfo, NewJob, Unwritten
from .store import Store

__all__ = ["DBExecutor", "JobOptions", "Submitter", "Batch"]

P = ParamSpec("P")
T = TypeVar("T")

_MAP_BATCH = 500  # rows per insert transaction in Batch.map()
_MAP_SLICE = 256  # jobs map() hands to the scheduler at a time


def _url_needed(url: object) -> str:
    hint = ""
    if isinstance(url, os.PathLike):
        hint = f" (for an SQLite file: 'sqlite:///{os.fspath(url)}')"
    return (
        "DBExecutor needs a database URL string, e.g. 'sqlite:///jobs.db', 'postgresql://user@host/db' "
        f"or 'mysql://user@host/db'; got {url!r}{hint}"
    )


def _required_seconds(value: Duration, name: str) -> float:
    """A duration option that may not be None, in seconds (ranges are the caller's to check)."""
    found = seconds(value, name)
    if found is None:
        raise TypeError(f"{name} must be a duration (seconds, a timedelta or e.g. '30s'), not None")
    return found


def _ended_badly(fut: Future[Any]) -> bool:
    """Whether ``fut`` is already cancelled or failed (without waiting)."""
    return fut.done() and (fut.cancelled() or fut.exception(0) is not None)


@dataclass(frozen=True)
class JobOptions:
    """Per-job options, stored on the row; :meth:`DBExecutor.options` takes the same names.

    ``key``: unique per database; submitting an existing key returns that job's
    future instead of a new job. ``group``: the fair-share group (see
    :meth:`DBExecutor.configure_group`); ``weight``: sets that group's weight
    (``None``: leave it as configured). ``priority``: higher runs first within
    its group. ``timeout``: seconds per attempt before the child's process
    tree is killed (``None``: the executor default). ``retries``: further
    attempts after a failure; ``retry_delay``: seconds before the first retry
    (doubled for each further one, with jitter). ``delay`` or ``run_after``
    (epoch seconds): not ready before then.

    ``timeout``, ``retry_delay`` and ``delay`` take a number of seconds, a
    ``timedelta`` or a duration string such as ``"90s"``, ``"30m"`` or
    ``"1h30m"``; they are stored as seconds (floats).

    ``connection``: a SQLAlchemy ``Connection`` or ORM ``Session`` on the
    executor's database: the jobs are written through it, inside its open
    transaction, and exist only if it commits (README, "Submitting inside
    your transaction"). Not stored.
    """

    key: str | None = None
    group: str = schema.DEFAULT_GROUP
    queue: str | None = None
    weight: int | None = None
    priority: int = 0
    timeout: float | None = None
    retries: int | None = None
    delay: float | None = None
    run_after: float | None = None
    retry_delay: float | None = None
    connection: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in _DURATIONS:
            # Frozen: normalizing "30m" or a timedelta to seconds goes around __setattr__.
            object.__setattr__(self, name, seconds(getattr(self, name), name))
        if self.key is not None and (not isinstance(self.key, str) or not 0 < len(self.key) <= 255):
            raise ValueError("key must be a non-empty string of at most 255 characters")
        if not isinstance(self.group, str) or not 0 < len(self.group) <= 255:
            raise ValueError("group must be a non-empty string of at most 255 characters")
        if self.queue is not None:
            check_name(self.queue)
        if self.weight is not None and (not isinstance(self.weight, int) or self.weight < 1):
            raise ValueError("weight must be an integer >= 1")
        if not isinstance(self.priority, int):
            raise ValueError("priority must be an integer")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError("timeout must be > 0 seconds (or None for no limit)")
        if self.retries is not None and (not isinstance(self.retries, int) or self.retries < 0):
            raise ValueError("retries must be an integer >= 0")
        if self.retry_delay is not None and not (self.retry_delay >= 0 and math.isfinite(self.retry_delay)):
            raise ValueError("retry_delay must be a finite number of seconds >= 0")
        if self.delay is not None and not (self.delay >= 0 and math.isfinite(self.delay)):
            raise ValueError("delay must be a finite number of seconds >= 0")
        if self.delay is not None and self.run_after is not None:
            raise ValueError("give delay or run_after, not both")


#: The options that are durations (seconds, a timedelta or "1h30m").
_DURATIONS = ("timeout", "retry_delay", "delay")
#: Every option name, in the order the error for an unknown name lists them.
_OPTION_NAMES = tuple(f.name for f in fields(JobOptions))


def _with_options(base: JobOptions, options: dict[str, Any]) -> JobOptions:
    """``base`` with ``options`` over it; a ``TypeError`` that lists the valid names for an unknown one."""
    unknown = [name for name in options if name not in _OPTION_NAMES]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise TypeError(
            f"unknown job option{plural} {', '.join(map(repr, unknown))}; "
            f"the options are {', '.join(_OPTION_NAMES)}"
        )
    return replace(base, **options)


@dataclass(frozen=True)
class _MapPlan:
    """The jobs of one ``map``: each runs ``fn(*args)`` for the next ``args``; ``name`` is the row's function name."""

    fn: Callable[..., Any]
    opts: JobOptions
    name: str | None
    args: Iterator[tuple[Any, ...]]


def _result_or_cancel(fut: JobFuture[T], end_time: float | None) -> T:
    """``fut``'s result, waiting until ``end_time`` at most; a job whose wait ends without one is cancelled."""
    try:
        try:
            return fut.result(None if end_time is None else end_time - time.monotonic())
        finally:
            fut.cancel()  # a no-op once the future is done
    finally:
        # A raised exception's traceback holds this frame: without this, the
        # frame, the future and the exception would keep each other alive.
        del fut


def _results(
    fs: collections.deque[JobFuture[Any]],
    end_time: float | None,
    chunked: bool,
    scheduler: Scheduler,
    executor: weakref.ref[DBExecutor],
    plan: _MapPlan | None,
) -> Iterator[Any]:
    """The iterator ``map`` returns: each job's result (or each item of its chunk), in order.

    While suspended at ``yield`` it holds no future and no result it has
    handed out (CPython's ``test_free_reference``), and only a weak
    reference to the executor: the caller decides what stays alive. With a
    ``plan`` (``buffersize``), one more job is queued per job consumed.
    """
    try:
        fs.reverse()  # oldest on the right: pop() it, new jobs go in on the left
        while fs:
            if plan is not None:
                _queue_next(fs, executor, plan)
            if not chunked:
                yield _result_or_cancel(fs.pop(), end_time)
                continue
            chunk = _result_or_cancel(fs.pop(), end_time)
            chunk.reverse()
            while chunk:
                yield chunk.pop()  # popped: an item the caller has dropped is freed
    finally:
        scheduler.cancel_jobs([f.job_id for f in fs if not f.done() and f.job_id is not None])


def _queue_next(fs: collections.deque[JobFuture[Any]], executor: weakref.ref[DBExecutor], plan: _MapPlan) -> None:
    """Queue the next job of a buffered ``map`` on the left of ``fs``."""
    # A function of its own, so that no local of the suspended iterator holds the executor.
    ex = executor()
    if ex is not None:
        fs.extendleft(ex._queue(plan, 1))


class Submitter:
    """``submit`` and ``map`` with per-job options; made by :meth:`DBExecutor.options`."""

    def __init__(self, executor: DBExecutor, options: JobOptions) -> None:
        self._executor = executor
        self._options = options

    def options(self, **options: Any) -> Submitter:
        """These options plus or over the given ones (names as in :class:`JobOptions`)."""
        return Submitter(self._executor, _with_options(self._options, options))

    # Typed as DBExecutor.submit: see there for why there are two signatures.
    @overload
    def submit(
        self, fn: Callable[..., T], /, *args: Any, after: Iterable[Future[Any]], **kwargs: Any
    ) -> JobFuture[T]: ...

    @overload
    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> JobFuture[T]: ...

    def submit(self, fn: Callable[..., T], /, *args: Any, after: Any = (), **kwargs: Any) -> JobFuture[T]:
        """As :meth:`DBExecutor.submit`, with these options."""
        return self._executor._submit(fn, args, kwargs, after, self._options)

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[T]:
        """As :meth:`DBExecutor.map`, with these options."""
        return self._executor._map(fn, iterables, timeout, chunksize, self._options, buffersize)

    def batch(self) -> Batch:
        """As :meth:`DBExecutor.batch`; the children get these options."""
        return Batch(self._executor, self._options)


class Batch(JobFuture[list[Any]]):
    """A set of jobs submitted as one unit, with a future of its own.

    Use it as a context manager; leaving the block seals it::

        with ex.batch() as batch:
            for path in paths:
                batch.submit(load, path)
        ex.submit(report, after=[batch])   # runs when every child is done
        batch.result()                     # the children's results, in submission order

    The children run as ordinary jobs as soon as they are submitted; the
    batch itself never runs. It is done when its last child is done, and fails
    as soon as a child fails, with that child's exception (the other children
    go on; :attr:`children` shows their states). Cancelling the batch cancels
    the children that have not started. Sealing stores the batch row; until
    then it has no ``job_id`` and cannot be a dependency.
    """

    def __init__(self, executor: DBExecutor, options: JobOptions) -> None:
        super().__init__(None, executor._scheduler, executor._store.identity)  # type: ignore[arg-type]
        self._executor = executor
        self._options = options
        #: The children's futures, in submission order.
        self.children: list[JobFuture[Any]] = []
        self._sealed = False

    def __repr__(self) -> str:
        sealed = "" if self._sealed else " unsealed"
        return f"<Batch job_id={self.job_id}{sealed} children={len(self.children)} state={self._state.lower()}>"

    def _check_unsealed(self) -> None:
        if self._sealed:
            raise RuntimeError("this batch is sealed; start a new one to submit more jobs")

    # Typed as DBExecutor.submit: see there for why there are two signatures.
    @overload
    def submit(
        self, fn: Callable[..., T], /, *args: Any, after: Iterable[Future[Any]], **kwargs: Any
    ) -> JobFuture[T]: ...

    @overload
    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> JobFuture[T]: ...

    def submit(self, fn: Callable[..., T], /, *args: Any, after: Any = (), **kwargs: Any) -> JobFuture[T]:
        """Submit a child (as :meth:`DBExecutor.submit`); a call that cannot be pickled raises here."""
        self._check_unsealed()
        fut = self._executor._submit(fn, args, kwargs, after, self._options)
        if fut.job_id is None:  # not stored: a batch holds only stored jobs
            fut.result()
        self._add([fut])
        return fut

    def map(self, fn: Callable[..., T], *iterables: Iterable[Any]) -> list[JobFuture[T]]:
        """Submit one child per item (as :meth:`DBExecutor.map` with chunksize 1); their futures, in order."""
        self._check_unsealed()
        ex = self._executor
        ex._check_open()
        now = ex._store.now()
        futures: list[JobFuture[Any]] = []
        calls = (ex._prepare(fn, args, {}, (), self._options, now) for args in zip(*iterables))
        while chunk := list(itertools.islice(calls, _MAP_BATCH)):
            for call in chunk:
                if isinstance(call, JobFuture):
                    call.result()  # raises the pickling error
            futures += ex._submit_many(chunk, now, self._options.connection)
        self._add(futures)
        return futures

    def _add(self, futures: list[JobFuture[Any]]) -> None:
        known = {f.job_id for f in self.children}
        for fut in futures:
            if fut.job_id in known:
                raise ValueError(f"job {fut.job_id} is already in this batch (a key submitted twice?)")
            known.add(fut.job_id)
        self.children += futures

    def seal(self) -> Batch:
        """Store the batch; from now on it resolves from its row and can be a dependency. Returns itself."""
        self._check_unsealed()
        self._executor._seal(self)
        self._sealed = True
        return self

    def cancel(self) -> bool:
        """Cancel the batch and its children that have not started."""
        if not self._sealed:
            for child in self.children:
                child.cancel()
            self._sealed = True
            self._cancel_local()  # never stored: nothing in the database to cancel
            return True
        return super().cancel()

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._sealed:
            return
        if exc_type is None:
            self.seal()
        else:  # the block failed: the batch never forms, its children do not run
            self.cancel()


class _Upstreams:
    """The dependencies of one call being prepared: ids, or :class:`Unwritten` for jobs still queued here.

    An upstream submitted by this executor and not written yet stays
    unwritten (its row and the new one go in with the same commit, or in
    order) rather than being written now to learn its id: a chain of submits
    would otherwise cost a commit per link. In the payload it is an
    ``ArgRef``, its position among the results the call takes.
    """

    def __init__(self, executor: DBExecutor, in_transaction: bool, defer: bool) -> None:
        self._executor = executor
        self._in_transaction = in_transaction
        self._defer = defer
        self.deps: dict[Dep, None] = {}  # ordered, without repeats
        self.refs: dict[Dep, int] = {}  # the deps whose results are arguments (after= only orders), by position
        self.futures: list[Future[Any]] = []  # each upstream future once
        self._seen: dict[Future[Any], Dep] = {}  # one decision per future, written or not

    def _dep(self, f: Future[Any]) -> Dep:
        dep = self._seen.get(f)
        if dep is None:
            ex = self._executor
            if self._defer and isinstance(f, JobFuture) and ex._scheduler.queued_here(f):
                dep = Unwritten(f)
            else:
                dep = ex._dependency(f, self._in_transaction)
            self._seen[f] = dep
            self.futures.append(f)
        return dep

    def argument(self, x: Any) -> Any:
        """``x``, or the placeholder the payload holds for it if it is a future (a dependency whose result it takes)."""
        if not isinstance(x, Future):
            return x
        dep = self._dep(x)
        self.deps[dep] = None
        position = self.refs.setdefault(dep, len(self.refs))
        return serialization.JobRef(dep) if isinstance(dep, int) else serialization.ArgRef(position)

    def order_after(self, f: Future[Any]) -> None:
        """``after=``: a dependency for ordering only."""
        self.deps[self._dep(f)] = None


class DBExecutor(Executor):
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
        ttl = _required_seconds(lease_ttl, "lease_ttl")
        if not ttl > 0:
            raise ValueError("lease_ttl must be > 0 seconds")
        beat = ttl / 6 if heartbeat_interval is None else _required_seconds(heartbeat_interval, "heartbeat_interval")
        if not 0 < beat < ttl:
            raise ValueError("heartbeat_interval must be > 0 and shorter than lease_ttl")
        poll = _required_seconds(poll_interval, "poll_interval")
        if not poll > 0:
            raise ValueError("poll_interval must be > 0")
        keep = seconds(retention, "retention")
        if keep is not None and not (keep > 0 and math.isfinite(keep)):
            raise ValueError("retention must be a positive duration, e.g. 604800, '7d' or a timedelta (or None to keep jobs)")
        # timeout, retries and retry_delay are every job's defaults, checked as per-job options are.
        backoff = _required_seconds(retry_delay, "retry_delay")
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

    def _seal(self, batch: Batch) -> None:
        self._check_open()
        now = self._store.now()
        job = NewJob(
            fn_name="dbexecutor.batch",
            payload=b"",
            deps=tuple(f.job_id for f in batch.children),
            group=batch._options.group,
            submitted_by=self._submitter_id,
            batch=True,
        )
        if batch._options.connection is not None:
            self._write_in(batch._options.connection, [job], futures=[batch])
        else:
            self._scheduler.write([job], now, futures=[batch])

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
        return Submitter(self, _with_options(self._defaults, options))

    # Two signatures because a ParamSpec cannot have a keyword (``after``)
    # beside it: with ``after``, the result type is still known but the
    # arguments are not checked against ``fn``; without it, they are.
    @overload
    def submit(
        self, fn: Callable[..., T], /, *args: Any, after: Iterable[Future[Any]], **kwargs: Any
    ) -> JobFuture[T]: ...

    @overload
    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> JobFuture[T]: ...

    def submit(self, fn: Callable[..., T], /, *args: Any, after: Any = (), **kwargs: Any) -> JobFuture[T]:
        """Persist ``fn(*args, **kwargs)`` as a job and return its future.

        ``after``: futures this job waits for (ordering only). A ``JobFuture``
        among the arguments (or one level inside a list, tuple or dict
        argument) is a dependency too, and is replaced by its result when the
        job runs.
        """
        return self._submit(fn, args, kwargs, after, self._defaults)

    def _dependency(self, fut: Any, in_transaction: bool = False) -> int:
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

    def _prepare(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        after: Iterable[Future[Any]],
        opts: JobOptions,
        now: float,
        fn_name: str | None = None,
        upstream: list[Future[Any]] | None = None,
    ) -> NewJob | JobFuture[Any]:
        """The row for one call, or a future already failed with the pickling error.

        ``upstream`` (if given) collects the dependency futures.
        """
        if not callable(fn):
            raise TypeError(f"{fn!r} is not callable")
        # Not for a keyed job or a caller's transaction: those are written at
        # once, below their upstreams' rows.
        named = _Upstreams(self, opts.connection is not None, defer=opts.connection is None and opts.key is None)
        args, kwargs = serialization.map_arguments(args, kwargs, named.argument)
        for f in after:
            named.order_after(f)
        if upstream is not None:
            upstream += named.futures
        try:
            payload = serialization.dump_payload(fn, args, kwargs, self._store.signer)
            limit = self._store.driver.max_payload
            if limit is not None and len(payload) > limit:
                raise ValueError(
                    f"the pickled call is {len(payload):,} bytes; this {self._store.driver.label} server takes "
                    f"at most {limit:,} in a row (max_allowed_packet): pass a path or a key instead of the data"
                )
        except Exception as error:
            # As ProcessPoolExecutor: the future fails with the pickling error; nothing is stored.
            failed: JobFuture[Any] = JobFuture(None)  # type: ignore[arg-type]
            error.__cause__ = serialization.RemoteTraceback(serialization.format_remote_traceback(error))
            failed.set_exception(error)
            return failed
        return NewJob(
            fn_name=fn_name or serialization.qualified_name(fn),
            payload=payload,
            deps=tuple(named.deps),
            refs=tuple(named.refs),
            key=opts.key,
            group=opts.group,
            queue=opts.queue if opts.queue is not None else self.queue,
            weight=opts.weight,
            priority=opts.priority,
            timeout=opts.timeout,
            retries=opts.retries or 0,
            run_after=self._run_after(opts, now),
            submitted_by=self._submitter_id,
            retry_delay=opts.retry_delay,
        )

    def _run_after(self, opts: JobOptions, now: float) -> float | None:
        """When the job may start, on the server's clock (``run_after`` is given on this machine's)."""
        if opts.delay is not None:
            return now + opts.delay
        return None if opts.run_after is None else self._store.clock.to_server(opts.run_after)

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
        job = self._prepare(fn, args, kwargs, after, opts, now, upstream=upstream)
        if isinstance(job, JobFuture):
            return job
        if opts.connection is not None:
            return self._write_in(opts.connection, [job])[0]
        if job.key is None:
            # The next scheduler tick writes it, with every other submit since
            # the last commit, in the transaction that also claims work.
            fut = self._scheduler.enqueue(job)
            if job.run_after is not None:
                self._scheduler.due(job.run_after)
            # Below a job known to have failed or been cancelled, the new job
            # is final on arrival: write it now, so its future says so at once.
            if self._durable_submit or (upstream and any(_ended_badly(f) for f in upstream)):
                self._scheduler.flush()
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
        return self._map(fn, iterables, timeout, chunksize, self._defaults, buffersize)

    def _map(
        self,
        fn: Callable[..., Any],
        iterables: tuple[Iterable[Any], ...],
        timeout: float | None,
        chunksize: int,
        opts: JobOptions,
        buffersize: int | None = None,
    ) -> Iterator[Any]:
        # The checks and messages of CPython 3.14's Executor.map.
        if buffersize is not None and not isinstance(buffersize, int):
            raise TypeError("buffersize must be an integer or None")
        if buffersize is not None and buffersize < 1:
            raise ValueError("buffersize must be None or > 0")
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if opts.key is not None:
            raise ValueError("a key names one job; map submits many (use submit for keyed jobs)")
        if opts.connection is not None and buffersize is not None:
            raise ValueError("buffersize submits as results are consumed, after the transaction: give one or the other")
        self._check_open()
        end_time = None if timeout is None else timeout + time.monotonic()
        items = zip(*iterables)
        plan = _MapPlan(fn, opts, None, items)
        if chunksize > 1:
            chunks = iter(lambda: list(itertools.islice(items, chunksize)), [])
            plan = _MapPlan(_run_chunk, opts, serialization.qualified_name(fn), ((fn, chunk) for chunk in chunks))
        fs = collections.deque(self._queue(plan, buffersize))
        return _results(fs, end_time, chunksize > 1, self._scheduler, weakref.ref(self), plan if buffersize else None)

    def _queue(self, plan: _MapPlan, limit: int | None) -> list[JobFuture[Any]]:
        """Queue the next ``limit`` jobs of a ``map`` (all of them for None); their futures, in order."""
        now = self._store.now()
        calls = (self._prepare(plan.fn, args, {}, (), plan.opts, now, plan.name) for args in itertools.islice(plan.args, limit))
        if plan.opts.connection is not None:
            return self._submit_many(list(calls), now, plan.opts.connection)
        # Queued like submits: the scheduler writes them with its ticks, in
        # the transactions that also claim them. Handed over in slices: a
        # short map reaches the scheduler whole (one tick writes and claims
        # it all), a long one starts being written while the rest is pickled.
        fs: list[JobFuture[Any]] = []
        delays: list[float] = []
        for part in iter(lambda: list(itertools.islice(calls, _MAP_SLICE)), []):
            # A JobFuture in the slice could not be pickled: failed already, nothing to store.
            queued = [c for c in part if not isinstance(c, JobFuture)]
            futures = iter(self._scheduler.enqueue_many(queued))
            fs.extend(c if isinstance(c, JobFuture) else next(futures) for c in part)
            delays.extend(c.run_after for c in queued if c.run_after is not None)
        if delays:
            self._scheduler.due(min(delays))
        if self._durable_submit:
            self._scheduler.flush()
        return fs

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
