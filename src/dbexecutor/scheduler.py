"""The tick loop: reclaim → claim → dispatch → collect → finalize → resolve.

One thread per executor runs it. It holds no reference to the executor (as
CPython's management thread holds only a weakref), so dropping the executor
shuts it down::

    submit() ──insert row──► DB ◄──claim── scheduler thread ──(id, attempt, payload)──► child
       │                      ▲                  │  ▲                                   │
       └─ JobFuture ◄─resolve─┼──── finish ──────┘  └──────── ("result", ...) ──────────┘
                              └──── poll: futures whose jobs another process finished

The in-memory state here (futures, which child runs what) is a cache: the
rows are the truth, and every write is guarded by the attempt token.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import wait as mp_wait
from multiprocessing.context import BaseContext
from typing import Any

from sqlalchemy.exc import DBAPIError

from . import schema, serialization
from .errors import JobTimeoutError, PayloadRejected, WorkerDied
from .future import JobFuture
from .pool import Assignment, Child, describe_exit, kill_tree, start_child
from .records import Claimed, Final, NewJob, Report, Submitted
from .store import Store, worker_name

log = logging.getLogger("dbexecutor")

_IN_POLL = 500  # ids checked per remote poll
_PREFETCH_BELOW = 0.05  # seconds: average run time under which a child gets more jobs queued
_PREFETCH_WORK = 0.05  # seconds of (short) work a child may hold queued behind its running job
_PREFETCH_MAX = 128  # at most this many jobs per child
_PENDING_PER_TICK = 2000  # queued submits written per scheduler tick
_LINGER_MAX = 0.02  # seconds a tick that would only record results may wait for the children to finish theirs
_RETENTION_BATCH = 500  # jobs deleted per retention transaction


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


# Interpreter shutdown, as in concurrent.futures.process: stop taking work and
# let every loop finish what it has before the interpreter tears down.
_global_shutdown = False
_live: weakref.WeakSet[Scheduler] = weakref.WeakSet()


def _python_exit() -> None:
    global _global_shutdown
    _global_shutdown = True
    for sched in list(_live):
        sched.request_shutdown()
    for sched in list(_live):
        sched.join()


threading._register_atexit(_python_exit)  # type: ignore[attr-defined]


def interpreter_shutting_down() -> bool:
    """True once the interpreter has started to exit."""
    return _global_shutdown


class Scheduler:
    """Runs the jobs of one database in child processes and resolves this process's futures."""

    def __init__(self, store: Store, child_url: str, settings: Settings) -> None:
        self.store = store
        self.s = settings
        self._child_url = child_url  # with the password: children connect on their own
        self.owner = worker_name(os.getpid())
        self.lock = threading.RLock()
        self._futures: weakref.WeakValueDictionary[int, JobFuture[Any]] = weakref.WeakValueDictionary()
        self._outstanding: set[int] = set()  # jobs shutdown(wait=True) waits for
        self._children: list[Child] = []
        self._retired: list[Child] = []
        self._reports: list[Report] = []  # collected but not yet written (kept across a database outage)
        self._shutdown = False
        self.broken: str | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._wake_lock = threading.Lock()
        self._wake_closed = False
        self._wake_pending = False  # a byte is in the wake pipe that the loop has not read
        self._poll_cursor = -1
        self._avg_run = 1.0  # seconds, moving average of recent run times
        self._results_seen = 0
        self._tick_cost = 0.0  # seconds, moving average of transactions that recorded results
        self._next_renew = 0.0
        self._next_poll = 0.0
        self._next_reclaim = 0.0
        self._dues: list[float] = []  # heap: wall-clock times delayed jobs of ours become runnable
        self._poll_all = False  # a notification asked for a full poll of our futures
        self._poll_ids: set[int] = set()  # ... or for these jobs, which finished elsewhere
        self._stop_listening = threading.Event()
        self._work_hint = False  # a submit or a notification says ready work is there: claim without probing
        self._next_retention = 0.0
        self._abandon = False  # stop_now(): kill the children and give their jobs back
        # Submits not yet written: the next tick inserts them in its own
        # transaction (one commit for a burst, and the claim can take them at
        # once); a reader of a pending future's job_id writes them earlier.
        self._pending: list[tuple[NewJob, JobFuture[Any]]] = []
        self._flush_lock = threading.RLock()  # one writer of pending rows at a time, so ids follow submission order
        self._thread = threading.Thread(target=self._run, name="dbexecutor-scheduler", daemon=True)
        _live.add(self)
        self._thread.start()
        # PostgreSQL: LISTEN/NOTIFY wakes us when other processes make work
        # ready or finish our jobs; polling stays as the backstop.
        self._listener = store.listen(self._on_notify, self._stop_listening)

    # -- called from user threads --------------------------------------------

    @property
    def shutting_down(self) -> bool:
        return self._shutdown

    def wake(self, work: bool = False) -> None:
        """Make the loop run a tick now (a submit, a cancel, a shutdown); ``work``: jobs became ready."""
        if work:
            self._work_hint = True
        with self._wake_lock:
            # Once the loop has ended its pipe is closed, and the descriptor
            # number may already belong to a file or socket opened since.
            # A wake-up the loop has not consumed yet covers this one too: no
            # system call per submit in a burst.
            if self._wake_closed or self._wake_pending:
                return
            self._wake_pending = True
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:
                pass  # pipe full: a wake-up is pending anyway

    def due(self, when: float) -> None:
        """A job of ours becomes runnable at ``when`` (epoch seconds): look for work then."""
        with self.lock:
            heapq.heappush(self._dues, when)
        self.wake()

    def enqueue(self, job: NewJob) -> JobFuture[Any]:
        """Queue a submitted job for the next commit of submits; its future gets the id then."""
        return self.enqueue_many([job])[0]

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[JobFuture[Any]]:
        """Queue several jobs at once: one wake-up, so the next tick sees them all.

        A tick woken by the first of a few jobs would write that one alone and
        make the rest wait for its commit.
        """
        if not jobs:
            return []
        futures: list[JobFuture[Any]] = []
        for _ in jobs:
            fut: JobFuture[Any] = JobFuture(None, self.cancel_job, self.store.identity)  # type: ignore[arg-type]
            fut._flusher = self.flush
            futures.append(fut)
        with self.lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._pending.extend(zip(jobs, futures))
        self.wake(work=True)
        return futures

    def flush(self) -> None:
        """Write every queued submit now, in the caller's thread (one transaction).

        Raises what the database raised if it cannot be reached (the jobs stay
        queued); a row the database refuses fails that job's future instead.
        """
        with self._flush_lock:
            with self.lock:
                items, self._pending = self._pending, []
            if not items:
                return
            # Under the loop's lock from insert to tracking: the loop may claim
            # and finish a job at once, and must find its future.
            with self.lock:
                try:
                    rows = self.store.insert_jobs([job for job, _ in items], time.time())
                except (DBAPIError, ValueError) as error:
                    if not self._refused(error):
                        self._requeue(items)
                        raise
                    rows = None
                if rows is not None:
                    self._stored(items, rows)
            if rows is None:
                self._insert_one_by_one(items)
            else:
                self.settle(rows)
        self.wake(work=True)

    def _refused(self, error: Exception) -> bool:
        """Whether the database refused these rows (so retrying them as they are cannot help)."""
        # ValueError: a dependency that no longer exists (purged since it was submitted).
        return isinstance(error, ValueError) or (isinstance(error, DBAPIError) and not self.store.retry_later(error))

    def _requeue(self, items: list[tuple[NewJob, JobFuture[Any]]]) -> None:
        with self.lock:
            self._pending[:0] = items

    def _stored(self, items: Sequence[tuple[NewJob, JobFuture[Any]]], rows: Sequence[Submitted]) -> None:
        """Give written jobs their ids and track their futures. Hold ``lock``."""
        for (_, fut), row in zip(items, rows):
            fut.job_id = row.job_id
            self.track(row.job_id, outstanding=row.state not in schema.FINAL_STATES, future=fut)

    def settle(self, rows: Sequence[Submitted]) -> None:
        """Resolve the futures of rows that were final on arrival (a failed or cancelled upstream, a done key)."""
        for row in rows:
            if row.state in schema.FINAL_STATES:
                self.resolve(Final(row.job_id, row.state, row.result))

    def _insert_one_by_one(self, items: list[tuple[NewJob, JobFuture[Any]]]) -> None:
        """The database refused a group of rows: write them singly, and fail the futures of those it refuses."""
        for n, (job, fut) in enumerate(items):
            with self.lock:
                try:
                    rows = self.store.insert_jobs([job], time.time())
                except (DBAPIError, ValueError) as error:
                    if not self._refused(error):
                        self._requeue(items[n:])
                        raise
                    log.error("a %s job could not be stored: %s", job.fn_name, error if isinstance(error, ValueError) else _short(error))
                    fut._flusher = None
                    fut._set_exception_quietly(error)
                    continue
                self._stored([(job, fut)], rows)
            self.settle(rows)

    def _drop_pending(self, error: BaseException | None) -> None:
        """Never write the queued submits: cancel their futures (``error``: fail them with it)."""
        with self.lock:
            items, self._pending = self._pending, []
        for _, fut in items:
            fut._flusher = None
            if error is None:
                fut._cancel_local()
            else:
                fut._set_exception_quietly(error)

    def _on_notify(self, payload: str | None) -> None:
        """Called by the LISTEN thread: ``sender \t flags \t ids`` (None: anything may have happened)."""
        if payload is None:
            self._poll_all = True
            self.wake()
            return
        sender, _, rest = payload.partition("\t")
        if sender == self.store.sender:
            return  # our own change: this loop already knows
        flags, _, ids = rest.partition("\t")
        if "f" in flags:
            if ids == "*":
                self._poll_all = True
            else:
                with self.lock:
                    mine = {int(i) for i in ids.split(",") if i} & (self._outstanding | set(self._futures.keys()))
                    self._poll_ids |= mine
                if not mine and "r" not in flags:
                    return
        self.wake(work="r" in flags)

    def track(self, job_id: int, outstanding: bool = True, future: JobFuture[Any] | None = None) -> JobFuture[Any]:
        """The future of ``job_id`` (one per job per process), resolved when the job ends. Hold ``lock``."""
        fut = self._futures.get(job_id)
        if fut is None:
            fut = future if future is not None else JobFuture(job_id, self.cancel_job, self.store.identity)
            self._futures[job_id] = fut
        if outstanding:
            self._outstanding.add(job_id)
        return fut

    def resolve(self, final: Final) -> None:
        """Apply a final row to this process's future of that job, if it has one."""
        with self.lock:
            fut = self._futures.pop(final.job_id, None)
            self._outstanding.discard(final.job_id)
        if fut is not None:
            try:
                blob = final.result
                if blob is not None and final.state in (schema.DONE, schema.FAILED):
                    # Checked before the future unpickles it: a tampered result never loads.
                    blob = self.store.signer.open(
                        blob, serialization.blob_context(final.job_id, final.state), f"the result of job {final.job_id}"
                    )
                fut._apply(final.state, blob)
            except PayloadRejected as rejected:
                log.error("job %d: %s", final.job_id, rejected)
                fut._set_exception_quietly(rejected)
            except Exception:  # never let one future take the loop down
                log.exception("could not resolve the future of job %d", final.job_id)

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
        finals = self.store.cancel(job_ids, time.time())
        for final in finals:
            self.resolve(final)
        return {f.job_id for f in finals}

    def request_shutdown(self, cancel_futures: bool = False) -> None:
        """Stop taking new work; the loop ends once this process's jobs are finished."""
        with self.lock:
            self._shutdown = True
        if cancel_futures:
            # Queued submits are written first, so that every cancelled job
            # has its row (state cancelled) like the ones already stored.
            try:
                self.flush()
            except DBAPIError as error:
                log.warning("could not store the queued jobs before cancelling them (%s)", _short(error))
            self._drop_pending(None)
            with self.lock:
                pending = sorted(self._outstanding)
            if pending:
                self.cancel_jobs(pending)
        self.wake()

    def stop_now(self) -> None:
        """End the loop at its next tick: kill the children and put the jobs they hold back to ready.

        For a standalone worker whose shutdown grace ran out. Reports already
        received are still written; every release is guarded by the attempt token.
        """
        with self.lock:
            self._shutdown = True
            self._abandon = True
        self.wake()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the loop to end."""
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- the loop -------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.0
        try:
            while not self._finished():
                try:
                    self._tick(backoff)
                    if backoff:
                        log.warning("database reachable again; carrying on")
                    backoff = 0.0
                except DBAPIError as error:
                    # The server restarting or a dropped connection: nothing in
                    # memory is lost (unwritten reports are kept), so wait and retry.
                    backoff = min(max(backoff * 2, 0.1), 5.0)
                    log.warning("database error in the scheduler (%s); retrying in %.1f s", _short(error), backoff)
        except BaseException:
            log.exception("the dbexecutor scheduler stopped on an unexpected error")
            self._break("the scheduler thread stopped on an unexpected error; see the log")
        finally:
            self._stop_listening.set()
            self._stop_children()
            with self._wake_lock:
                self._wake_closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _finished(self) -> bool:
        with self.lock:
            if not self._shutdown and self.broken is None:
                return False
            if self.broken is None and (self._outstanding or self._pending):
                return False
        return not self._reports and not any(c.busy for c in self._children)

    def _tick(self, backoff: float) -> None:
        self._wait(backoff)
        if self._abandon and self._children:
            self._abandon_children()
        if self._retired:  # reap children that exited after max_tasks_per_child
            for c in [c for c in self._retired if not c.process.is_alive()]:
                self._retired.remove(c)
                _close(c)
        self._check_timeouts()
        self._linger()
        now = time.monotonic()
        if now >= self._next_reclaim:
            self._next_reclaim = now + min(self.s.lease_ttl / 2, 5.0)
            reclaimed = self.store.reclaim_expired(time.time())
            if reclaimed:
                log.warning("reclaimed %d job(s) whose lease expired: %s", len(reclaimed), reclaimed[:20])
        self._finish_and_claim()
        if now >= self._next_renew:
            self._next_renew = now + self.s.heartbeat_interval
            self._renew_held()
        if self._poll_all or now >= self._next_poll:
            self._poll_all = False
            self._next_poll = now + self.s.poll_interval
            self._poll_remote()
        elif self._poll_ids:
            with self.lock:
                ids, self._poll_ids = sorted(self._poll_ids), set()
            for final in self.store.finals(ids):
                self.resolve(final)
        if self.s.retention is not None and now >= self._next_retention:
            self._apply_retention(now)

    def _apply_retention(self, now: float) -> None:
        """Delete one bounded batch of jobs finished longer than ``retention`` ago.

        One batch per interval keeps each transaction small and the cost per
        tick flat; a full batch means more are due, so the next comes soon.
        """
        assert self.s.retention is not None
        deleted = self.store.purge_batch(time.time() - self.s.retention, _RETENTION_BATCH)
        if deleted:
            log.debug("retention: deleted %d finished job(s) older than %g s", deleted, self.s.retention)
        pause = 0.0 if deleted >= _RETENTION_BATCH else min(60.0, max(1.0, self.s.retention / 10))
        self._next_retention = now + pause

    def _abandon_children(self) -> None:
        """Kill every child's process tree and release the jobs they held (stop_now)."""
        for c in list(self._children):
            if c.conn in mp_wait([c.conn], 0):
                self._receive(c)  # results that already arrived are written, not re-run
        held: list[tuple[int, int, float | None]] = []
        for c in list(self._children):
            for i, a in enumerate(c.queue):
                held.append((a.job_id, a.attempt, c.started_at if i == 0 and c.ready else None))
            if c.queue:
                log.warning("killing child %d, which still runs job %d attempt %d", c.pid, c.queue[0].job_id, c.queue[0].attempt)
            kill_tree(c.pid, self.s.kill_grace)
            c.queue.clear()
            self._remove(c)
            _close(c)
        if held:
            released = self.store.release_running(
                held, self.owner, time.time(), "the worker stopped before the job ended; the job was put back to ready"
            )
            log.warning("released %d job(s) for other workers: %s", len(released), released[:20])

    def _wait(self, backoff: float) -> None:
        now = time.monotonic()
        timeout = min(self.s.poll_interval, max(0.0, self._next_reclaim - now))
        if self._dues:
            wall = time.time()
            with self.lock:
                while self._dues and self._dues[0] <= wall:
                    heapq.heappop(self._dues)
                    timeout = 0.0  # it is runnable now: this tick's claim finds it
                if self._dues:
                    timeout = min(timeout, self._dues[0] - wall)
        for c in self._children:
            deadline = c.deadline
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - now))
        if backoff:
            timeout = backoff
        objs: list[Any] = [self._wake_r]
        for c in self._children:
            objs += [c.conn, c.process.sentinel]
        ready = set(mp_wait(objs, timeout))
        if self._wake_r in ready:
            with self._wake_lock:
                # Cleared before the read: a wake() from now on writes again.
                self._wake_pending = False
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
        self._handle(ready)

    def _handle(self, ready: set[Any]) -> None:
        """Read the children's messages and notice their deaths among ``ready``."""
        for c in list(self._children):
            if c.conn in ready:
                self._receive(c)
            elif c.process.sentinel in ready:
                self._child_died(c)

    def _linger(self) -> None:
        """Before a tick that would only record results, let the children finish what they hold.

        When the jobs still queued in the children will be done in less than
        a tick's transaction takes, one transaction later records them all:
        the last result is written sooner than by a tick now and another
        after. The first results wait at most that long (``_LINGER_MAX``). A
        submit, a cancel or a shutdown (any wake-up) ends the wait at once.
        """
        if not self._reports or self._tick_cost <= 0.0:
            return
        busy = [c for c in self._children if c.queue]
        if not busy:
            return
        budget = min(self._tick_cost, _LINGER_MAX)
        if max(len(c.queue) for c in busy) * self._avg_run > budget:
            return  # longer than a tick: record what is there now
        deadline = time.monotonic() + budget
        while True:
            with self.lock:
                if self._pending or self._shutdown:
                    return
            busy = [c for c in self._children if c.queue]
            left = deadline - time.monotonic()
            if not busy or left <= 0.0:
                return
            objs: list[Any] = [self._wake_r]
            for c in busy:
                objs += [c.conn, c.process.sentinel]
            ready = set(mp_wait(objs, left))
            if self._wake_r in ready:
                return  # left unread: the next tick's wait consumes it
            self._handle(ready)

    def _receive(self, c: Child) -> None:
        while True:
            try:
                if not c.conn.poll():
                    return
                msg = c.conn.recv()
            except (EOFError, OSError):
                self._child_died(c)
                return
            if msg[0] == "ready":
                c.ready = True
                if c.queue:
                    c.head_started()  # it starts on the job waiting in its pipe now
            elif msg[0] == "result":
                _, job_id, attempt, ok, blob, error, started, ended = msg
                head = c.queue.popleft()
                assert (head.job_id, head.attempt) == (job_id, attempt), "a child answered out of order"
                if c.queue:
                    c.head_started()  # the child goes straight on to the next job it holds
                self._reports.append(
                    Report(job_id, attempt, ok, blob, "ok" if ok else "exception", error,
                           worker_name(c.pid), started, ended, head.retry_delay)
                )
                # Recent run times decide whether children get a second job queued behind
                # the running one: worth it for short jobs, head-of-line blocking for long ones.
                self._avg_run = 0.8 * self._avg_run + 0.2 * max(0.0, ended - started)
                self._results_seen += 1
                log.debug("job %d attempt %d ended (%s) in child %d", job_id, attempt, "ok" if ok else error, c.pid)
                c.tasks += 1
                if self.s.max_tasks_per_child and c.tasks >= self.s.max_tasks_per_child:
                    self._retire(c)
                    return
            elif msg[0] == "init_error":
                _, text, tb = msg
                log.error("a child process failed to initialize: %s%s", text, tb)
                self._break(f"A child process terminated abruptly: its initializer raised {text}")
                self._remove(c)
                self._release_queue(c, list(c.queue))
                return

    def _release_queue(self, c: Child, never_started: list[Assignment]) -> None:
        """Give back jobs a child held but never started, so any executor can run them."""
        for a in never_started:
            self.store.release(a.job_id, a.attempt)
        c.queue.clear()

    def _retire(self, c: Child) -> None:
        try:
            c.conn.send(None)
        except OSError:
            pass
        self._remove(c)
        self._retired.append(c)

    def _remove(self, c: Child) -> None:
        if c in self._children:
            self._children.remove(c)

    def _child_died(self, c: Child) -> None:
        c.process.join(1.0)
        how = describe_exit(c.process.exitcode)
        self._remove(c)
        _close(c)
        head = c.job
        if head is None:
            log.warning("idle child %d exited (%s); a new one starts when needed", c.pid, how)
            return
        log.warning("child %d died (%s) while running job %d attempt %d", c.pid, how, head.job_id, head.attempt)
        error = WorkerDied(f"the child process (pid {c.pid}) running job {head.job_id} died with {how}")
        self._reports.append(self._failure(c, error, how))
        self._release_queue(c, list(c.queue)[1:])

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for c in list(self._children):
            head, deadline = c.job, c.deadline
            if head is None or deadline is None or deadline > now:
                continue
            log.warning(
                "job %d attempt %d passed its timeout; killing child %d and its subprocesses",
                head.job_id, head.attempt, c.pid,
            )
            kill_tree(c.pid, self.s.kill_grace)
            self._remove(c)
            _close(c)
            error = JobTimeoutError(
                f"job {head.job_id} ran past its timeout of {head.timeout:g} s; its process tree was killed"
            )
            self._reports.append(self._failure(c, error, "timeout"))
            self._release_queue(c, list(c.queue)[1:])

    def _failure(self, c: Child, error: BaseException, outcome: str) -> Report:
        head = c.job
        assert head is not None
        return Report(
            head.job_id,
            head.attempt,
            False,
            serialization.dump_exception(error, signer=self.store.signer),
            outcome,
            f"{type(error).__name__}: {error}",
            worker_name(c.pid),
            c.started_at,
            time.time(),
            head.retry_delay,
        )

    def _capacity(self, c: Child | None) -> int:
        """How many jobs a child (or a child yet to start) may hold: one, or two for short jobs."""
        depth = 1
        if self._results_seen >= 4 and self._avg_run < _PREFETCH_BELOW:
            # Short jobs: queue a few (up to ~_PREFETCH_WORK seconds of them)
            # so the child never waits for a round trip, and one transaction
            # finishes and claims many.
            depth = max(2, min(_PREFETCH_MAX, int(_PREFETCH_WORK / max(self._avg_run, 1e-6))))
        if self.s.max_tasks_per_child:
            done = c.tasks if c is not None else 0
            depth = min(depth, self.s.max_tasks_per_child - done)
        return depth

    def _free_slots(self) -> int:
        if not self.s.run_jobs:
            return 0
        with self.lock:
            if self.broken is not None or (self._shutdown and not self._outstanding):
                return 0
        free = sum(max(0, self._capacity(c) - len(c.queue)) for c in self._children)
        return free + (self.s.max_workers - len(self._children)) * self._capacity(None)

    def _finish_and_claim(self) -> None:
        """Write queued submits and collected reports, and claim work for free slots: one transaction."""
        with self._flush_lock:
            limit = self._free_slots()
            now = time.time()
            with self.lock:
                # A bounded share per tick, so that a burst of thousands does
                # not hold the claim back until all of them are written.
                items, self._pending = self._pending[:_PENDING_PER_TICK], self._pending[_PENDING_PER_TICK:]
                if self._pending:
                    self.wake(work=True)  # the rest in the next tick, at once
            if not (items or self._reports or limit > 0):
                return
            if not items and not self._reports:
                hint, self._work_hint = self._work_hint, False
                inserted: list[Submitted] = []
                claimed = self.store.claim(self.owner, limit, self.s.lease_ttl, now, probe=not hint)
                done = None
            else:
                try:
                    started = time.monotonic()
                    inserted, done, claimed = self.store.finish_and_claim(
                        self._reports, self.owner, limit, self.s.lease_ttl, now, [job for job, _ in items]
                    )
                    if self._reports:
                        took = time.monotonic() - started
                        self._tick_cost = took if not self._tick_cost else 0.8 * self._tick_cost + 0.2 * took
                except (DBAPIError, ValueError) as error:
                    self._requeue(items)
                    if not items or not self._refused(error):
                        raise
                    # A row the database refuses must not hold up the rest: write them singly.
                    with self.lock:
                        items, self._pending = self._pending, []
                    self._insert_one_by_one(items)
                    return
                self._reports = []
                with self.lock:
                    self._stored(items, inserted)
        self.settle(inserted)
        if done is not None:
            for jid in done.lost:
                log.warning("job %d: this attempt lost its lease (reclaimed elsewhere); its outcome was discarded", jid)
            for jid in done.retried:
                log.info("job %d failed and will be retried", jid)
            for final in done.finals:
                self.resolve(final)
        for job in claimed:
            self._dispatch(self._pick_child(), job)

    def _pick_child(self) -> Child:
        """An idle child, else a new one (up to max_workers), else the least loaded with room."""
        idle = [c for c in self._children if not c.queue]
        if idle:
            return idle[0]
        if len(self._children) < self.s.max_workers:
            return self._spawn()
        return min(
            (c for c in self._children if len(c.queue) < self._capacity(c)),
            key=lambda c: len(c.queue),
        )

    def _renew_held(self) -> None:
        """Keep alive the leases of jobs our children hold but have not started (still ``leased``).

        Once a job runs, only its child's heartbeat renews it, so a frozen child
        loses its lease; until then (its child still starting, or the job queued
        behind another) the parent vouches for it.
        """
        pairs = [(a.job_id, a.attempt) for c in self._children for a in list(c.queue)[1 if c.ready else 0 :]]
        if pairs:
            self.store.renew(pairs, self.s.lease_ttl, time.time())

    def _spawn(self) -> Child:
        c = start_child(
            self.s.mp_context,
            self._child_url,
            self.store.prefix,
            self.s.heartbeat_interval,
            self.s.lease_ttl,
            self.s.initializer,
            self.s.initargs,
            self.store.signer,
        )
        self._children.append(c)
        log.debug("started child %d", c.pid)
        return c

    def _dispatch(self, c: Child, job: Claimed) -> None:
        with self.lock:
            fut = self._futures.get(job.job_id)
        if fut is not None and not fut.running():
            try:
                fut.set_running_or_notify_cancel()
            except RuntimeError:
                pass  # already resolved by another path; the row decides
        c.queue.append(
            Assignment(
                job.job_id,
                job.attempt,
                job.timeout if job.timeout is not None else self.s.timeout,
                job.retry_delay if job.retry_delay is not None else self.s.retry_delay,
            )
        )
        if len(c.queue) == 1:
            c.head_started()
        log.debug("job %d (%s) attempt %d -> child %d", job.job_id, job.fn_name, job.attempt, c.pid)
        try:
            c.conn.send((job.job_id, job.attempt, job.payload))
        except OSError:
            pass  # the child is dead: its sentinel fires next tick and the job is reported there

    def _poll_remote(self) -> None:
        """Resolve futures whose jobs another process finished, ``_IN_POLL`` ids per tick, round robin."""
        # Jobs held by our own children are polled too: if a child froze and lost
        # its lease, another process may finish the job, and the future must follow the row.
        with self.lock:
            watched = self._outstanding | set(self._futures.keys())
        if not watched:
            return
        ids = sorted(i for i in watched if i > self._poll_cursor)[:_IN_POLL]
        if len(ids) < _IN_POLL:
            ids += sorted(watched)[: _IN_POLL - len(ids)]
            self._poll_cursor = -1
        else:
            self._poll_cursor = ids[-1]
        for final in self.store.finals(sorted(set(ids))):
            self.resolve(final)

    def _break(self, reason: str) -> None:
        """An initializer failed: fail this process's futures (the rows stay for other executors)."""
        with self.lock:
            self.broken = reason
            futures = [self._futures.pop(i, None) for i in list(self._futures.keys())]
            self._outstanding.clear()
        for fut in futures:
            if fut is not None:
                fut._set_exception_quietly(BrokenProcessPool(reason))
        self._drop_pending(BrokenProcessPool(reason))

    def _stop_children(self) -> None:
        for c in self._children:
            if not c.busy:
                try:
                    c.conn.send(None)
                except OSError:
                    pass
        for c in self._children + self._retired:
            c.process.join(2.0)
            if c.process.is_alive():
                kill_tree(c.pid, self.s.kill_grace)
            _close(c)
        self._children, self._retired = [], []


def _close(c: Child) -> None:
    for conn in (c.conn, c.lifeline):
        try:
            conn.close()
        except OSError:
            pass


def _short(error: DBAPIError) -> str:
    text = str(error.orig) if error.orig is not None else str(error)
    return text.strip().splitlines()[0][:200] if text.strip() else type(error).__name__
