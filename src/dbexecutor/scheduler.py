"""The scheduler thread: one loop per executor that turns rows into runs and runs into rows.

::

    submit() ──► SubmitQueue ──┐                                    ┌──► Supervisor ──Call──► child
                               ▼                                    │        ▲   ◄─Result/Beat─┘
    DB ◄── one transaction per tick: insert queued rows, record ────┤        │
     │     results, claim jobs for free slots                       │   kill thread (timeouts)
     │                                                              │
     ├──► upstream results of the claimed jobs ─────────────────────┘
     ├◄── renew the leases of every held job (one statement)
     └──► finals of jobs other processes finished ──► Registry ──► JobFuture

The loop (:meth:`Scheduler._tick`) reads like the algorithm: wait for a
wake-up, a child's message or a deadline; take in what the children said;
write and claim in one transaction; hand out the work; keep the leases;
follow what other processes did. The parts it drives live beside it:
:mod:`~dbexecutor.tickcommit` (the tick's transaction and the hand-out of
what it claimed), :mod:`~dbexecutor.upkeep` (what is done on a schedule:
reclaims, rescues, the beat and the leases, polls, retention),
:mod:`~dbexecutor.submitqueue`, :mod:`~dbexecutor.registry`,
:mod:`~dbexecutor.supervisor`, :mod:`~dbexecutor.wakeup`,
:mod:`~dbexecutor.flags` and :mod:`~dbexecutor.pace`.

The loop holds no reference to the executor (as CPython's management thread
holds only a weakref), so dropping the executor shuts it down. Its in-memory
state is a cache of rows: the rows are the truth, and every write is guarded
by the attempt token.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait as mp_wait
from multiprocessing.context import BaseContext
from typing import Any

from sqlalchemy.exc import DBAPIError

from . import __version__, hosts, schema
from .doorbell import Doorbell
from .flags import ExecutorFlags
from .intransaction import CallerTransaction, never_stored
from .messages import DatabaseAddress
from .future import JobFuture
from .pace import HOLD_MAX_ONE_WRITER, Pace
from .pool import warm_up
from .registry import Registry
from .readmodels import JobProgress
from .records import Final, NewJob, Registration
from .states import DEFAULT_QUEUE
from .stats import SchedulerStats
from .store import Store
from .submitqueue import SubmitQueue, resolve_deps, short_error
from .supervisor import Supervisor
from .tickcommit import TickCommit
from .upkeep import Upkeep
from .wakeup import DueTimes, Wakeup

__all__ = ["Scheduler", "Settings", "interpreter_shutting_down"]

log = logging.getLogger("dbexecutor")

_MAX_BACKOFF = 5.0  # seconds between tries while the database is unreachable


@dataclass(frozen=True)
class Settings:
    """Executor-wide settings the loop needs."""

    max_workers: int
    mp_context: BaseContext
    initializer: Callable[..., Any] | None
    initargs: tuple[Any, ...]
    max_tasks_per_child: int | None
    lease_ttl: float
    heartbeat_interval: float
    timeout: float | None
    retry_delay: float
    poll_interval: float
    kill_grace: float = 1.0
    retention: float | None = None  # seconds finished jobs are kept (None: forever)
    run_jobs: bool = True  # False: submit only, never claim (workers elsewhere run the jobs)
    kind: str = "executor"  # how the registry names it: executor, worker (submitter when run_jobs is False)
    queues: tuple[str, ...] | None = (DEFAULT_QUEUE,)  # the queues it claims from (None: every queue)
    start_children: bool = False  # True: every child starts with the loop, not with the first jobs (a worker)
    # Where other processes reach this one's doorbell (databases without NOTIFY); None: no doorbell.
    # Loopback by default: executors on other machines then find work by polling (README, "Running a fleet").
    wake_host: str | None = field(default_factory=lambda: _wake_host_from_env())


def _wake_host_from_env() -> str | None:
    """``$DBEXECUTOR_WAKE_HOST`` (an address of this machine that other executors can reach; ``none``: no doorbell)."""
    value = os.environ.get("DBEXECUTOR_WAKE_HOST", "127.0.0.1").strip()
    return None if value.lower() in ("", "none", "off") else value


# Interpreter shutdown, as in concurrent.futures.process: stop taking work and
# let every loop finish what it has before the interpreter tears down.
_global_shutdown = False
_live: weakref.WeakSet[Scheduler] = weakref.WeakSet()


def _python_exit() -> None:
    global _global_shutdown
    _global_shutdown = True
    for sched in list(_live):
        # A submit-only executor's jobs run elsewhere: once its rows are written the
        # process may end (a cron job, a request handler); its futures end with it.
        sched.request_shutdown(wait=sched.s.run_jobs)
    for sched in list(_live):
        sched.join()


threading._register_atexit(_python_exit)  # type: ignore[attr-defined]


def interpreter_shutting_down() -> bool:
    """True once the interpreter has started to exit."""
    return _global_shutdown


class Scheduler:
    """Runs the jobs of one database in child processes and resolves this process's futures."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.s = settings
        # Databases without NOTIFY: other processes wake this one with a datagram.
        self._doorbell: Doorbell | None = None
        if not store.driver.supports_notify and settings.wake_host:
            self._doorbell = Doorbell(settings.wake_host, store.wake_addresses)
        #: How this process registers, and names itself in the leases it holds.
        self.registration = Registration(
            name=hosts.owner_name(),
            kind=settings.kind if settings.run_jobs else "submitter",
            host=hosts.hostname(),
            pid=os.getpid(),
            pid_started=hosts.process_started(),
            version=__version__,
            slots=settings.max_workers if settings.run_jobs else 0,
            wake=None if self._doorbell is None else self._doorbell.address,
            queues=settings.queues if settings.run_jobs else (),
        )
        self.owner = self.registration.name
        store.register(self.registration, settings.lease_ttl)
        if self._doorbell is not None:
            doorbell = self._doorbell
            store.after_commit = lambda payloads: doorbell.ring(payloads, exclude=self.owner)
            doorbell.hello(store.sender, exclude=self.owner)  # registered: the others ring us from their next change
        #: Shutdown and broken flags.
        self.flags = ExecutorFlags()
        #: Run-time and transaction-time averages (public so tests can pin them). Where one
        #: writer holds the whole database back, a transaction waits less for its jobs.
        self.pace = Pace(hold_max=HOLD_MAX_ONE_WRITER) if store.driver.single_writer else Pace()
        #: Jobs started, attempts ended, claim latency, rescues (exported by ``worker --metrics-port``).
        self.stats = SchedulerStats()
        self._wakeup = Wakeup()
        self._dues = DueTimes()
        self._registry = Registry(self, store.identity, store.signer)
        self._queue = SubmitQueue(store, self._registry, self.flags, self._wakeup.wake)
        # A job's transaction (dbexecutor.transaction()) connects where this store does.
        address = DatabaseAddress(store.url.render_as_string(hide_password=False), store.prefix)
        self._supervisor = Supervisor(
            settings, store.signer, self.pace, self._wakeup.wake, address, store.clock, store.functions.cached
        )
        # The tick's transaction (write, record, claim, hand out) and the periodic tasks around it.
        self._commit = TickCommit(
            store, settings, self.owner, self.flags, self.pace, self.stats,
            self._wakeup, self._queue, self._registry, self._supervisor,
        )
        if settings.run_jobs:
            self._queue.lending = self._commit.lending  # a durable submit goes in leased when a slot is free
        self._upkeep = Upkeep(
            store, settings, self.registration, self.stats, self._supervisor, self._registry, self._commit,
        )
        # Kept across a database outage until written:
        self._releases: list[tuple[int, int]] = []  # held jobs no child will start
        self._committing: list[CallerTransaction] = []  # callers' transactions with jobs, committing now
        self._committing_lock = threading.Lock()
        self._stop_listening = threading.Event()
        if settings.run_jobs and settings.max_workers > 0:
            # The fork server (and the children's preload) starts while the loop makes its first
            # claim. Before this executor's threads start: for a script, the server learns its
            # path from an environment variable set meanwhile (pool.warm_up), which the LISTEN
            # thread's driver, reading the environment as it connects, must not race with.
            warm_up(settings.mp_context)
        self._thread = threading.Thread(target=self._run, name="dbexecutor-scheduler", daemon=True)
        _live.add(self)
        self._thread.start()
        # PostgreSQL: LISTEN/NOTIFY wakes us when other processes make work
        # ready or finish our jobs; polling stays as the backstop.
        self._listener = store.listen(self._on_notify, self._stop_listening)

    # -- called from user threads ----------------------------------------------------------

    @property
    def shutting_down(self) -> bool:
        """Whether shutdown was requested."""
        return self.flags.shutdown

    @property
    def broken(self) -> str | None:
        """Why this executor cannot run jobs any more, or None."""
        return self.flags.broken

    def wake(self, work: bool = False) -> None:
        """Make the loop run a tick now (a submit, a cancel, a shutdown); ``work``: jobs became ready."""
        self._wakeup.wake(work)

    def due(self, when: float) -> None:
        """A job of ours becomes runnable at ``when`` (epoch seconds): look for work then."""
        self._dues.add(when)
        self.wake()

    def enqueue(self, job: NewJob, write: bool = False) -> JobFuture[Any]:
        """Queue a submitted job for the next commit of submits; its future gets the id then.

        ``write=True``: write it now, in the caller's thread, with whatever
        was queued before it (a durable submit). It is queued while the
        caller holds the queue's writer, so the loop cannot take it into a
        tick of its own and make the caller wait for that whole tick (its
        claim and its dispatch) instead of its own write.
        """
        if not write:
            return self.enqueue_many([job])[0]
        with self._queue.writing():
            fut = self._queue.put([job], wake=False)[0]
            self._queue.flush()  # wakes the loop once the row is committed
        return fut

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[JobFuture[Any]]:
        """Queue several jobs at once: one wake-up, so the next tick sees them all.

        A tick woken by the first of a few jobs would write that one alone and
        make the rest wait for its commit.
        """
        if not jobs:
            return []
        futures = self._queue.put(jobs)
        if threading.current_thread() is not self._thread:
            # A backlog: the server inserts it while the loop records and claims on its own connection.
            self._queue.write_backlog()
        return futures

    def queued_here(self, fut: JobFuture[Any]) -> bool:
        """Whether ``fut``'s job waits in this executor's submit queue (it can be named as :class:`Unwritten`)."""
        return self._queue.holds(fut)

    def flush(self) -> None:
        """Write every queued submit now, in the caller's thread (one transaction).

        Raises what the database raised if it cannot be reached (the jobs stay
        queued); a row the database refuses fails that job's future instead.
        """
        self._queue.flush()

    def write(
        self, jobs: Sequence[NewJob], now: float, futures: Sequence[JobFuture[Any]] | None = None
    ) -> list[JobFuture[Any]]:
        """Insert ``jobs`` now, in the caller's thread, after every submit queued before them.

        For what must be written before the caller goes on: a keyed job (it
        may name an existing job, whose future this returns), a sealed batch,
        ``Batch.map``. One job goes in with its key and edges; several in one
        transaction. ``futures``, if given, receive the ids (one per job).
        Returns the jobs' futures, resolved already if a row was final on arrival.
        """
        self.flush()  # ids follow submission order
        # Every upstream queued before these is written now: name them by id.
        jobs = [resolve_deps(job, {}) for job in jobs]
        if len(jobs) == 1:
            rows, futs = self._registry.write_and_track(lambda: [self.store.insert_job(jobs[0], now)], futures)
        else:
            rows, futs = self._registry.write_and_track(lambda: self.store.insert_jobs(jobs, now), futures)
        delays = [job.run_after for job in jobs if job.run_after is not None]
        if delays:
            self.due(min(delays))
        self._registry.settle(rows)
        unfinished = {row.state for row in rows if row.state not in schema.FINAL_STATES}
        if unfinished:
            self.wake(work=schema.READY in unfinished)
        return futs

    def committing(self, txn: CallerTransaction) -> None:
        """A caller's transaction that wrote jobs is committing (its "commit" event, on the caller's thread).

        The loop tracks its jobs once the commit has returned (see :meth:`_adopt_committed`).
        """
        with self._committing_lock:
            self._committing.append(txn)
        self.wake(work=True)

    def future_of(self, row: Final) -> JobFuture[Any]:
        """This process's future of a job read from the database (resolved at once if ``row`` is final)."""
        final = row.state in schema.FINAL_STATES
        fut = self._registry.track(row.job_id, outstanding=not final)
        if final:
            self._registry.resolve(row)
        else:
            self.wake()
        return fut

    def cancel_job(self, job_id: int) -> bool:
        """Cancel one job in the database (and its dependents); True if it was cancelled."""
        return job_id in self.cancel_jobs([job_id])

    def cancel_jobs(self, job_ids: Sequence[int]) -> set[int]:
        """Cancel the jobs that have not started, with everything downstream; return the ids cancelled."""
        if not job_ids:
            return set()
        # Queued submits may depend on these jobs: store them first, so the
        # cancellation reaches them now rather than when they are written.
        self.flush()
        finals = self.store.cancel(job_ids, self.store.now())
        for final in finals:
            self._registry.resolve(final)
        return {f.job_id for f in finals}

    def terminate_job(self, job_id: int) -> bool:
        """Stop one job wherever it runs (cancelled if it has not started); False if it had finished already."""
        self.flush()
        request = self.store.request_stop([job_id])
        if request.cancelled:
            for final in self.store.finals(request.cancelled):
                self._registry.resolve(final)
        return job_id in request.cancelled or job_id in request.terminating

    def job_progress(self, job_id: int) -> JobProgress | None:
        """What job ``job_id`` last reported about its progress (read from its row)."""
        return self.store.progress(job_id)

    def request_shutdown(self, cancel_futures: bool = False, *, wait: bool = True) -> None:
        """Stop taking new work; the loop ends once this process's jobs are finished.

        A submit-only executor (``run_jobs=False``) told not to ``wait`` ends
        its loop as soon as its queued submits are written: the jobs are in
        the database for others to run, and its futures stay unresolved.
        """
        self.flags.request_shutdown(detach=not wait and not self.s.run_jobs)
        if cancel_futures:
            # Queued submits are written first, so that every cancelled job
            # has its row (state cancelled) like the ones already stored.
            try:
                self.flush()
            except DBAPIError as error:
                log.warning("could not store the queued jobs before cancelling them (%s)", short_error(error))
            self._queue.drop(None)
            self.cancel_jobs(self._registry.outstanding())
        self.wake()

    def stop_now(self) -> None:
        """End the loop at its next tick: kill the children and put the jobs they hold back to ready.

        For a standalone worker whose shutdown grace ran out. Reports already
        received are still written; every release is guarded by the attempt token.
        """
        self.flags.stop_now()
        self.wake()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the loop to end."""
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        """Whether the loop is still running."""
        return self._thread.is_alive()

    @contextmanager
    def hold_writes(self) -> Iterator[None]:
        """Keep queued submits unwritten until the block ends: then they go in together (a test seam).

        The calling thread may still write them itself (``flush()``, reading
        a ``job_id``); other threads and the loop wait.
        """
        with self._queue.writing():
            yield

    # -- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.0
        try:
            self._start_children()
            # One connection for the loop's transactions, not one from the pool per tick.
            with self.store.holding_connection():
                while not self._finished():
                    try:
                        self._tick(backoff)
                        if backoff:
                            log.warning("database reachable again; carrying on")
                        backoff = 0.0
                    except DBAPIError as error:
                        # The server restarting or a dropped connection: nothing in
                        # memory is lost (unwritten reports are kept), so wait and retry.
                        backoff = min(max(backoff * 2, 0.1), _MAX_BACKOFF)
                        log.warning("database error in the scheduler (%s); retrying in %.1f s", short_error(error), backoff)
        except BaseException:
            log.exception("the dbexecutor scheduler stopped on an unexpected error")
            self._break("the scheduler thread stopped on an unexpected error; see the log")
        finally:
            self._stop_listening.set()
            self._supervisor.stop()
            self._commit.give_back_claimed()
            self._queue.close()
            self._wakeup.close()
            self._unregister()
            if self._doorbell is not None:
                self.store.after_commit = None
                self._doorbell.close()

    def _start_children(self) -> None:
        """A worker's children start while the first claim is made (an executor's start with its first jobs)."""
        if self.s.run_jobs and self.s.max_workers > 0 and self.s.start_children:
            self._supervisor.start_all()

    def _tick(self, backoff: float) -> None:
        """One turn: wait for something to happen, take in what the children said, write and
        claim in one transaction, hand out the work, keep the leases, follow other processes."""
        self._wait(backoff)
        self._supervise()
        self._commit.hand_out_lent()  # a durable submit leased on insert starts now, not after a linger
        self._linger()
        self._upkeep.keep_time()
        self._upkeep.reclaim_expired()
        self._upkeep.rescue_dead_executors()
        self._adopt_committed()
        self._commit.write_and_claim()
        self._commit.dispatch_claimed()
        self._upkeep.renew_leases()
        self._upkeep.follow_other_processes()
        self._upkeep.apply_retention()

    def _finished(self) -> bool:
        with self.flags.deciding():
            if not self.flags.shutdown and self.flags.broken is None:
                return False
            if self.flags.broken is None and (len(self._queue) or self._committing):
                return False  # queued submits are written (committed ones tracked) first, whatever else happens
            if self.flags.broken is None and not self.flags.detached and self._registry.has_outstanding():
                return False
        return not (self._commit.holds_work() or self._releases or self._supervisor.busy())

    def _wait(self, backoff: float) -> None:
        """Until a wake-up, a child's message or death, a due time or deadline, or the poll interval."""
        now = time.monotonic()
        timeout = min(self.s.poll_interval, max(0.0, self._upkeep.next_due() - now))  # a reclaim or the beat
        due = self._dues.until_next(self.store.now())
        if due is not None:
            timeout = min(timeout, due)
            if due == 0.0:
                self._commit.forget_drained()  # a delayed job became runnable
        deadline = self._supervisor.next_deadline()
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - now))
        if self._supervisor.has_news():
            timeout = 0.0  # a result read outside this wait (the lease renewal drains the pipes) is written now
        if backoff:
            timeout = backoff
        bell = [] if self._doorbell is None else [self._doorbell.fileno()]
        ready = set(mp_wait([self._wakeup.reader, *bell, *self._supervisor.waitables()], timeout))
        if self._wakeup.reader in ready:
            self._wakeup.consume()
        if self._doorbell is not None and bell[0] in ready:
            for payload in self._doorbell.read():
                self._on_notify(payload)
        self._supervisor.handle(ready)

    def _supervise(self) -> None:
        """Timeouts, retired and abandoned children; then take in what the children reported."""
        if self.flags.abandon:
            self._abandon_children()
        self._supervisor.reap_retired()
        self._supervisor.check_timeouts(time.monotonic())
        self._collect()

    def _collect(self) -> None:
        """Take the children's reports and releases, and break if an initializer failed."""
        reason = self._supervisor.take_init_failure()
        if reason is not None:
            self._break(reason)
        self._commit.add_reports(self._supervisor.take_reports())
        self._releases += self._supervisor.take_releases()
        if self._releases:
            self._commit.forget_drained()  # released jobs are ready again
        while self._releases:
            job_id, attempt = self._releases[0]
            self.store.release(job_id, attempt)  # so any executor can run it
            self._releases.pop(0)

    def _linger(self) -> None:
        """Before a tick that would only record results, let the children finish what they hold.

        When the jobs still queued in the children will be done in less than
        a tick's transaction takes, one transaction later records them all
        (see :meth:`Pace.linger_budget`). A submit, a cancel or a shutdown
        (any wake-up) ends the wait at once.
        """
        if not self._commit.has_reports():
            return
        budget = self.pace.linger_budget(self._supervisor.longest_queue())
        if budget <= 0.0:
            return
        deadline = time.monotonic() + budget
        while True:
            with self.flags.deciding():
                if len(self._queue) or self.flags.shutdown:
                    break
            objs = self._supervisor.waitables(busy_only=True)
            left = deadline - time.monotonic()
            if not objs or left <= 0.0:
                break
            ready = set(mp_wait([self._wakeup.reader, *objs], left))
            if self._wakeup.reader in ready:
                break  # left unread: the next tick's wait consumes it
            self._supervisor.handle(ready)
        self._collect()

    def _adopt_committed(self) -> None:
        """Track the jobs of callers' transactions whose commit has returned; those whose rows are missing never existed."""
        with self._committing_lock:
            if not self._committing:
                return
            over = [t for t in self._committing if not t.trans.is_active]
            self._committing = [t for t in self._committing if t.trans.is_active]
            if self._committing:  # a commit still under way: look again in a moment
                self._dues.add(self.store.now() + 0.005)
        woken = False
        for txn in over:
            found = self.store.existing([row.job_id for row in txn.rows])
            kept = [(row, fut) for row, fut in zip(txn.rows, txn.futures) if row.job_id in found]
            # Missing: written inside a savepoint that rolled back, or the commit itself failed.
            never_stored([f for r, f in zip(txn.rows, txn.futures) if r.job_id not in found])
            if not kept:
                continue
            rows = [row for row, _ in kept]
            self._registry.adopt(rows, [fut for _, fut in kept])
            self._registry.settle(rows)
            self.store.groups_written(txn.groups)
            if txn.notices and self.store.after_commit is not None:
                self.store.after_commit(txn.notices)  # other executors (no NOTIFY here)
            delays = [job.run_after for job, row in zip(txn.jobs, txn.rows) if job.run_after is not None and row.job_id in found]
            if delays:
                self._dues.add(min(delays))
            woken = True
        if woken:
            self._wakeup.wake(work=True)  # the claim of this tick and the next look at them

    def _abandon_children(self) -> None:
        """Kill every child's process tree and put the jobs they held back to ready (stop_now)."""
        held = self._supervisor.abandon()
        if held:
            released = self.store.release_running(
                held, self.owner, self.store.now(), "the worker stopped before the job ended; the job was put back to ready"
            )
            log.warning("released %d job(s) for other workers: %s", len(released), released[:20])

    def _on_notify(self, payload: str | None) -> None:
        """Called by the LISTEN thread: ``sender \\t flags \\t ids`` (None: anything may have happened)."""
        if payload is None:
            self.store.forget_peers()
            self._registry.finished_elsewhere(None)
            self.wake()
            return
        sender, _, rest = payload.partition("\t")
        if sender == self.store.sender:
            return  # our own change: this loop already knows
        flags, _, ids = rest.partition("\t")
        if "h" in flags:  # a new executor registered: notify it (ring its doorbell) too from now on
            self.store.forget_peers()
            if self._doorbell is not None:
                self._doorbell.forget_peers()
            return
        if "f" in flags:
            named = None if ids == "*" else [int(i) for i in ids.split(",") if i]
            if not self._registry.finished_elsewhere(named) and "r" not in flags:
                return
        self.wake(work="r" in flags)

    def _break(self, reason: str) -> None:
        """An initializer failed or the loop crashed: fail this process's futures (the rows stay for other executors)."""
        self.flags.set_broken(reason)
        self._registry.fail_all(BrokenProcessPool(reason))
        self._queue.drop(BrokenProcessPool(reason))

    def _unregister(self) -> None:
        """The loop has ended: say so in the registry (a process that dies instead is found dead)."""
        try:
            self.store.unregister(self.owner)
        except Exception:  # noqa: BLE001 - its registration lapses anyway
            log.info("could not mark executor %s stopped; its registration will lapse", self.owner)
