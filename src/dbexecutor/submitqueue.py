"""Submits not yet written, and the one writer of them at a time.

::

    submit() ──put()──► queue ──take()──► the loop's next tick: one transaction
        │                 │                 inserts them, records results, claims
        │                 └──flush()──────► the caller's thread, now (flush(),
        └── JobFuture (no id yet)           job_id, durable_submit=True)

One writer at a time, so ids follow submission order. A burst of submits
costs one commit, and a job submitted to an idle executor starts after a
single commit. Until it is written a job exists only in this process. On a
server, a thread that has queued :data:`BACKLOG` jobs or more writes them
itself when no one else is writing (:meth:`SubmitQueue.write_backlog`).

A job may depend on one queued before it (a chain: each submit takes the
previous future). Its row then names that upstream as :class:`Unwritten`;
the writer turns it into the upstream's id if that was written by an
earlier commit, or into :class:`Earlier` (its position in the same write),
so the whole chain goes in with one commit instead of one per link.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from sqlalchemy.exc import DBAPIError

from .flags import ExecutorFlags
from .future import JobFuture
from .lending import Lease, Lending
from .registry import Registry
from .records import Claimed, Dep, Earlier, NewJob, Submitted, Unwritten
from .store import Store
from .store.database import Hold

__all__ = ["SubmitQueue", "Item", "BACKLOG", "NotWritten", "resolve_deps", "short_error"]

log = logging.getLogger("dbexecutor")

#: A queued job and the future ``submit`` returned for it.
Item = tuple[NewJob, JobFuture[Any]]

#: Queued jobs from which a submitting thread writes them itself (where the driver
#: says so): enough that one INSERT carries many rows, few enough that the loop's
#: ticks still find most bursts whole (measured alike from 200 to 1,000 rows).
BACKLOG = 256


class NotWritten(ValueError):
    """A queued job's upstream was never written (the database refused its row, or it was dropped)."""


def resolve_deps(job: NewJob, positions: dict[Any, int]) -> NewJob:
    """``job`` with each :class:`Unwritten` upstream named by its id, or as :class:`Earlier` (``positions``:
    the futures of the jobs ahead of it in the same write, by index). Raises :class:`NotWritten`."""
    named: dict[Dep, Dep] = {}
    for dep in job.deps:
        if type(dep) is not Unwritten:
            continue
        fut = dep.future
        if fut.stored:
            named[dep] = fut.job_id
        elif fut in positions:
            named[dep] = Earlier(positions[fut])
        else:
            error = fut.exception(timeout=0) if fut.done() and not fut.cancelled() else None
            why = f": {error}" if error is not None else (" (cancelled)" if fut.cancelled() else "")
            raise NotWritten(f"upstream {fut!r} of this {job.fn_name} job was never stored{why}")
    return job.renamed(named)


class SubmitQueue:
    """The jobs submitted since the last commit of submits, in order."""

    def __init__(self, store: Store, registry: Registry, flags: ExecutorFlags, wake: Callable[..., None]) -> None:
        self._store = store
        self._registry = registry
        self._flags = flags
        self._wake = wake
        self._lock = threading.Lock()  # guards the list
        self._items: list[Item] = []
        # How many queued jobs have upstreams or children (edges to write, upstream rows to lock).
        self._linked = 0
        self._writer = threading.RLock()  # one writer of queued rows at a time
        self._holding = threading.local()  # depth: this thread is inside writing() (keeps the queue as it is)
        # Whether a submitting thread writes a backlog itself (see write_backlog).
        self._backlogs = store.driver.submitters_write_backlog
        #: Slots the loop lends, so that a durable submit goes in leased (None: this executor runs no jobs).
        self.lending: Lending | None = None
        # The writer's connection, kept from one flush to the next (a durable submit
        # costs its INSERT and COMMIT, not a trip through the pool too), whichever
        # thread holds the writer. In autocommit where the driver gains from it.
        self._hold: Hold | None = store.new_hold(autocommit=True)
        # Jobs put back after a write whose COMMIT failed, with that write's time: the
        # commit may have been made all the same, its answer lost (see confirm).
        self._unsure: list[tuple[float, list[Item]]] = []
        #: A durable submit's leased insert failed: its COMMIT may have been made, with a
        #: lease nobody knows of (the loop gives such leases back, and clears this).
        self.lease_unsure = False

    def __len__(self) -> int:
        return len(self._items)

    def holds(self, fut: JobFuture[Any]) -> bool:
        """Whether ``fut``'s job waits here to be written."""
        return fut.awaits(self.flush)

    def put(self, jobs: Sequence[NewJob], wake: bool = True) -> list[JobFuture[Any]]:
        """Queue jobs for the next commit of submits (one wake-up for all); their futures get ids then.

        ``wake=False``: the caller flushes at once (a durable submit), and
        the flush wakes the loop once the rows are committed.
        """
        futures = [self._registry.new_future(self.flush) for _ in jobs]
        with self._flags.admitting(), self._lock:
            self._items.extend(zip(jobs, futures))
            self._linked += _linked(jobs)
        if wake:
            self._wake(work=True)
        return futures

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the writer: queued jobs stay queued (another thread's submits too) until the block ends."""
        with self._writer:
            self._holding.depth = getattr(self._holding, "depth", 0) + 1
            try:
                yield
            finally:
                self._holding.depth -= 1

    def take(self, limit: int | None = None) -> tuple[list[Item], bool]:
        """Up to ``limit`` (None: all) queued jobs, oldest first, for the caller to write; and whether more are left."""
        with self._lock:
            if limit is None:
                items, self._items = self._items, []
            else:
                items, self._items = self._items[:limit], self._items[limit:]
            if self._linked:
                self._linked -= _linked([job for job, _ in items])
            return items, bool(self._items)

    def resolve(self, items: Sequence[Item]) -> tuple[list[Item], list[NewJob]]:
        """The rows to write for ``items`` (taken, in order): upstreams not written yet named (see :func:`resolve_deps`).

        A job whose upstream was never stored fails (its future raises
        :class:`NotWritten`) and is left out: returns the items kept and their rows.
        """
        wanted = {d.future for job, _ in items for d in job.deps if type(d) is Unwritten}
        if not wanted:  # the common case: nothing to name
            return list(items), [job for job, _ in items]
        positions: dict[Any, int] = {}
        kept: list[Item] = []
        rows: list[NewJob] = []
        for job, fut in items:
            try:
                row = resolve_deps(job, positions)
            except NotWritten as error:
                log.error("a %s job could not be stored: %s", job.fn_name, error)
                fut._set_exception_quietly(error)
                continue
            if fut in wanted:
                positions[fut] = len(kept)
            kept.append((job, fut))
            rows.append(row)
        return kept, rows

    def requeue(self, items: Sequence[Item], written_at: float | None = None, written: Sequence[Item] | None = None) -> None:
        """Put jobs that could not be written back at the front (the database is unreachable).

        ``written_at``: the time the failed write gave the rows of
        ``written`` (default: all of ``items``); its ``COMMIT`` may have
        been made (see :meth:`confirm`).
        """
        unsure = list(items if written is None else written)
        with self._lock:
            self._items[:0] = items
            self._linked += _linked([job for job, _ in items])
            if written_at is not None and unsure:
                self._unsure.append((written_at, unsure))

    def unsure(self) -> bool:
        """Whether jobs put back after a failed write wait for :meth:`confirm`."""
        return bool(self._unsure)

    def confirm(self) -> None:
        """Take out the jobs put back after a failed write that was committed all the same, with the ids it gave them.

        A connection can drop after the server committed and before its
        answer arrived; the store's own retries read whether a try landed
        (``store.landed``), but once they are spent the jobs come back here,
        and writing them again would store them twice. Their rows are found
        by submitter and creation time (``Store.rows_created``), all of one
        write or none. Jobs with keys stay queued (a key is found again).
        Call it holding the writer, before :meth:`take`; raises what the
        database raised if it cannot be read (the jobs stay unsure).
        """
        while self._unsure:
            at, items = self._unsure[0]
            plain = [(job, fut) for job, fut in items if job.key is None]
            rows = self._store.rows_created(at, [job for job, _ in plain]) if plain else None
            self._unsure.pop(0)
            if not rows:
                continue  # not committed: they are written as any queued job
            log.warning("%d submitted job(s) were stored by a write whose commit did not answer; not written again", len(rows))
            written = {id(fut) for _, fut in plain}
            with self._lock:
                self._items = [item for item in self._items if id(item[1]) not in written]
                self._linked -= _linked([job for job, _ in plain])
            self.stored(plain, rows)
            self._registry.settle(rows)

    def stored(self, items: Sequence[Item], rows: Sequence[Submitted]) -> None:
        """Written ``items`` became ``rows``: give their futures ids and track them (the caller settles final rows)."""
        self._registry.adopt(rows, [fut for _, fut in items])

    def flush(self) -> None:
        """Write every queued job now, in the caller's thread (one transaction).

        Raises what the database raised if it cannot be reached (the jobs stay
        queued); a row the database refuses fails that job's future instead.
        """
        with self._writer, self._store.holding_connection(self._hold):
            if self._unsure:
                self.confirm()
            items, jobs = self.resolve(self.take()[0])
            if not items:
                return
            lease = self.lending.lend() if self.lending is not None and len(jobs) == 1 else None
            claimed: list[Claimed] = []
            now = self._store.now()  # the rows' creation time (they are found by it if the COMMIT does not answer)
            try:
                try:
                    if lease is not None:
                        write = partial(self._insert_leasing, jobs[0], lease, claimed, now)
                    else:
                        write = partial(self._store.insert_jobs, jobs, now)
                    rows, _ = self._registry.write_and_track(write, [fut for _, fut in items])
                finally:
                    if lease is not None:
                        self._landed(claimed)  # after the future is tracked: the loop may finish the job at once
            except (DBAPIError, ValueError) as error:
                if not self.refused(error):
                    self.lease_unsure = self.lease_unsure or (lease is not None and isinstance(error, DBAPIError))
                    self.requeue(items, written_at=now)
                    self._wake(work=True)  # the loop retries them
                    raise
                self.write_one_by_one(items)
            else:
                self._registry.settle(rows)
        # A job that went in leased needs no look for work: the loop only hands it to a child.
        self._wake(work=not claimed)

    def write_backlog(self) -> bool:
        """Write the queued jobs now, in the caller's thread, if they are a backlog and no one else is writing; whether it wrote.

        For a thread that has just queued jobs, where the driver says so
        (``Driver.submitters_write_backlog``) and :data:`BACKLOG` or more
        wait: the rows go in while the loop's tick records results and
        claims, rather than after. Only jobs without upstreams or children: while
        one with them is queued, the loop writes them all. It never waits
        for the writer, and never raises for the database: rows it could
        not write stay queued and the loop, woken, writes them (or finds the
        database down, as it would have).
        """
        if not self._backlogs or len(self._items) < BACKLOG:
            return False
        if getattr(self._holding, "depth", 0):
            return False  # this thread holds the writer to keep the queue as it is
        if self._linked:
            # Their transaction locks upstream rows that the loop's finishes count down
            # (or the other way round): on two connections the two deadlocked, and a
            # random DAG of 10,000 took 8 s instead of 2.5. The loop writes them as before.
            return False
        if not self._writer.acquire(blocking=False):
            return False  # the loop's tick (or a flush) is writing: the rows go in with the next one
        try:
            self.flush()
        except DBAPIError as error:
            log.debug("a backlog of submits was left to the loop: %s", short_error(error))
            return False
        finally:
            self._writer.release()
        return True

    def _insert_leasing(self, job: NewJob, lease: Lease, claimed: list[Claimed], now: float) -> list[Submitted]:
        """Insert ``job`` leased in a slot the loop lent, if a claim could pick nothing else; its claim goes in ``claimed``."""
        row, got = self._store.insert_leasing(job, now, lease.owner, lease.ttl, lease.scope)
        claimed += got
        return [row]

    def _landed(self, claimed: list[Claimed]) -> None:
        """The insert a slot was lent for has ended: give the loop its claim (or the slot back)."""
        job = claimed[0] if claimed else None
        if self.lending is not None and not self.lending.land(job) and job is not None:
            # The loop stopped meanwhile: it will not run the job, so the lease goes back at once.
            self._store.release(job.job_id, job.attempt)

    def refused(self, error: Exception) -> bool:
        """Whether the database refused these rows (so retrying them as they are cannot help)."""
        # ValueError: a dependency that no longer exists (purged since it was submitted).
        return isinstance(error, ValueError) or (isinstance(error, DBAPIError) and not self._store.retry_later(error))

    def write_one_by_one(self, items: Sequence[Item]) -> None:
        """The database refused a group of rows: write them singly, and fail the futures of those it refuses."""
        for n, item in enumerate(items):
            kept, rows_of = self.resolve([item])
            if not kept:
                continue  # its upstream was refused before it: failed already
            (job, fut), row = item, rows_of[0]
            now = self._store.now()
            try:
                rows, _ = self._registry.write_and_track(lambda: self._store.insert_jobs([row], now), [fut])
            except (DBAPIError, ValueError) as error:
                if not self.refused(error):
                    self.requeue(items[n:], written_at=now, written=[item])
                    raise
                log.error(
                    "a %s job could not be stored: %s",
                    job.fn_name, error if isinstance(error, ValueError) else short_error(error),
                )
                fut._set_exception_quietly(error)
                continue
            self._registry.settle(rows)

    def close(self) -> None:
        """Give the writer's connection back to the pool; later flushes (if any) take theirs from it."""
        with self._writer:
            hold, self._hold = self._hold, None
            if hold is not None:
                self._store.release_hold(hold)

    def drop(self, error: BaseException | None) -> None:
        """Never write the queued jobs: cancel their futures (``error``: fail them with it)."""
        items, _ = self.take()
        for _, fut in items:
            if error is None:
                fut._cancel_local()
            else:
                fut._set_exception_quietly(error)


def _linked(jobs: Sequence[NewJob]) -> int:
    """How many of ``jobs`` have upstreams or children: rows whose insert writes edges."""
    return sum(1 for job in jobs if job.deps or job.batch)


def short_error(error: DBAPIError) -> str:
    """The first line of a database error, for a log line."""
    text = str(error.orig) if error.orig is not None else str(error)
    return text.strip().splitlines()[0][:200] if text.strip() else type(error).__name__
