"""The children of one executor: start, dispatch, receive, deaths, timeouts, and what their leases need.

::

                  dispatch(Call) ──► child ──► Result / Beat / Ready / InitFailed
                                       │              │
    scheduler thread ◄── reports ──────┼──────────────┘  (outcomes to write)
          │          ◄── releases ─────┤  (jobs a dead child held but never started)
          │          ◄── leases() ─────┤  (which leases to renew, which jobs run)
          │          ◄── progress ─────┘  (the latest each running job reported)
          ├─ terminate(leases) ─ jobs someone asked to stop (a renewal said so)
          └─ check_timeouts() ──► kill thread: process tree ──► report "timeout"
                                                                or "terminated"

Everything here runs in the scheduler thread, except the kill of a child
whose job passed its timeout or was asked to stop, or whose lease never
committed: terminating a process tree waits up to a grace period, so it runs
in a thread of its own while the loop goes on dispatching (:mod:`.kills`),
and its report joins the others when the tree is gone.

No database access here: the loop writes what this collects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import wait as mp_wait
from typing import TYPE_CHECKING, Any, Callable

from . import byvalue, serialization
from .errors import JobTimeoutError, WorkerDied
from .kills import Kills
from .messages import AwaitCommit, Beat, Call, Calls, ChildConfig, Committed, DatabaseAddress, InitFailed, Progress, Ready, Result, Stop
from .pace import Pace
from .pool import Assignment, Child, describe_exit, kill_trees, start_child
from .records import Claimed, Report
from .store import worker_name
from .store.clock import Clock

if TYPE_CHECKING:
    from .scheduler import Settings

__all__ = ["Supervisor"]

log = logging.getLogger("dbexecutor")
# How each attempt that failed ended, one line each: a logger of its own, so
# that an application that handles failures through its futures can quiet it.
jobs_log = logging.getLogger("dbexecutor.jobs")

_STOP_WAIT = 2.0  # seconds stopped children get to exit before their trees are killed
# A running job's lease is renewed while its child was heard from within this
# many heartbeat intervals: one missed beat is jitter, two mean it is stuck.
_FRESH_BEATS = 2.0
_SUMMARY = 300  # characters of an exception's message in a log line


class Supervisor:
    """The child processes of one executor and the jobs each one holds."""

    def __init__(
        self,
        settings: Settings,
        signer: serialization.Signer,
        pace: Pace,
        wake: Callable[[], None],
        database: DatabaseAddress | None = None,
        clock: Clock | None = None,
        functions: Callable[[str], bytes | None] | None = None,
    ) -> None:
        self.s = settings
        # The stored by-value functions' pickles by digest, as this process has them (no read):
        # each child is sent those its jobs' payloads name, once.
        self._functions = functions
        # Reports carry times on the database server's clock (``clock``); the
        # children's are read from this machine's wall clock and converted.
        self._clock = clock or Clock()
        # ``database``: where a job's transaction connects (a child opens it only if a job asks).
        self._config = ChildConfig(settings.heartbeat_interval, settings.initializer, settings.initargs, signer, database)
        self._signer = signer
        self._pace = pace
        self._children: list[Child] = []
        self._retired: list[Child] = []  # sent Stop after max_tasks_per_child; reaped once they exit
        self._lock = threading.Lock()  # the reports and an initializer's failure, shared with the kill threads
        self._reports: list[Report] = []
        self._kills = Kills(settings.kill_grace, wake, self._report)  # trees being killed beside the loop
        self._releases: list[tuple[int, int]] = []
        self._init_failure: str | None = None
        self._new_starts = False  # a job's first beat arrived: its row should say running soon
        self._progress: dict[tuple[int, int], tuple[float | None, str | None]] = {}  # latest per running attempt
        self._stopping: set[tuple[int, int]] = set()  # leases whose jobs someone asked to stop

    # -- what the loop waits on ---------------------------------------------------

    def waitables(self, busy_only: bool = False) -> list[Any]:
        """The children's pipes and process sentinels (only of those holding jobs, if ``busy_only``)."""
        objs: list[Any] = []
        for c in self._children:
            if c.queue or not busy_only:
                objs += [c.conn, c.process.sentinel]
        return objs

    def next_deadline(self) -> float | None:
        """The monotonic time at which the next running job passes its timeout, if any has one."""
        deadlines = [d for d in (c.deadline for c in self._children) if d is not None]
        return min(deadlines) if deadlines else None

    def longest_queue(self) -> int:
        """The most jobs any child holds."""
        return max((len(c.queue) for c in self._children), default=0)

    def busy(self) -> bool:
        """Whether a child holds a job, or a timed-out one is still being killed."""
        return self._kills.in_flight() or any(c.busy for c in self._children)

    def holds_leases(self) -> bool:
        """Whether any job is held (its lease needs renewing)."""
        return self._kills.holds_jobs() or any(c.busy for c in self._children)

    # -- receiving ------------------------------------------------------------------

    def handle(self, ready: set[Any]) -> None:
        """Read the messages of the children whose pipes are among ``ready``; notice deaths."""
        for c in list(self._children):
            if c.conn in ready:
                self._receive(c)
            elif c.process.sentinel in ready:
                self._died(c)

    def drain(self) -> None:
        """Read whatever the children have sent, without waiting."""
        conns = [c.conn for c in self._children]
        if conns:
            self.handle(set(mp_wait(conns, 0)))

    def _receive(self, c: Child) -> None:
        try:
            messages = c.inbox.read()
        except (EOFError, OSError):
            self._died(c)
            return
        if messages:
            c.heard = time.monotonic()
        for msg in messages:
            if isinstance(msg, Beat):
                self._beat(c, msg)
            elif isinstance(msg, Progress):
                running = c.running
                if running is not None and running.lease == (msg.job_id, msg.attempt):
                    self._progress[running.lease] = (msg.fraction, msg.message)
            elif isinstance(msg, Result):
                if not self._result(c, msg):
                    return
            elif isinstance(msg, AwaitCommit):
                self._await_commit(c, msg)
            elif isinstance(msg, Ready):
                c.ready = True
                if c.queue:
                    c.head_started()  # it starts on the job waiting in its pipe now
            elif isinstance(msg, InitFailed):
                log.error("a child process failed to initialize: %s%s", msg.error, msg.traceback)
                with self._lock:
                    if self._init_failure is None:
                        self._init_failure = f"A child process terminated abruptly: its initializer raised {msg.error}"
                self._remove(c)
                c.close()
                self._release(list(c.queue))
                return

    def _beat(self, c: Child, beat: Beat) -> None:
        running = c.running
        # A beat can cross the Result of the job it was for: only the running job's counts.
        if running is not None and running.lease == (beat.job_id, beat.attempt) and c.beat != running.lease:
            c.beat = running.lease
            self._new_starts = True

    def _result(self, c: Child, msg: Result) -> bool:
        """Record a job's outcome; False if the child was retired by it (stop reading it)."""
        head = c.queue.popleft()
        assert head.lease == (msg.job_id, msg.attempt), "a child answered out of order"
        if c.queue:
            c.head_started()  # the child goes straight on to the next job it holds
        outcome = "ok" if msg.ok else ("refused" if msg.refused else "exception")
        if not msg.ok and not msg.refused:
            self._log_failure(c, head, msg)
        self._report(Report(
            msg.job_id, msg.attempt, msg.ok, msg.blob, outcome, msg.refused or msg.error,
            worker_name(c.pid), self._clock.to_server(msg.started), self._clock.to_server(msg.ended), head.retry_delay,
            head.function, msg.refused is not None, finalized=msg.finalized,
        ))
        self._pace.job_ended(msg.ended - msg.started)
        log.debug("job %d attempt %d ended (%s) in child %d", msg.job_id, msg.attempt, msg.error or outcome, c.pid)
        c.tasks += 1
        if self.s.max_tasks_per_child and c.tasks >= self.s.max_tasks_per_child:
            self._retire(c)
            return False
        return True

    def _died(self, c: Child) -> None:
        c.process.join(1.0)
        how = describe_exit(c.process.exitcode)
        self._remove(c)
        c.close()
        head = c.job
        if head is None:
            log.warning("idle child %d exited (%s); a new one starts when needed", c.pid, how)
            return
        jobs_log.warning("child %d died (%s) while running job %d (%s) attempt %d", c.pid, how, head.job_id, head.function, head.attempt)
        failed_start = not c.ready and (c.process.exitcode or 0) > 0  # it exited with an error before it was ready
        if not failed_start:
            error = WorkerDied(f"the child process (pid {c.pid}) running job {head.job_id} died with {how}")
        else:
            error = WorkerDied(
                f"the child process (pid {c.pid}) for job {head.job_id} exited with {how} before it could run a job "
                "(its traceback is on its stderr); if the script starts executors when imported, put that under "
                '`if __name__ == "__main__":` (children import the script first)'
            )
        self._report(self._failure(c, head, error, how))
        self._release(list(c.queue)[1:])

    def _log_failure(self, c: Child, head: Assignment, msg: Result) -> None:
        # One line whatever the exception's message holds: a log line per attempt.
        error = " ".join((msg.error or "").split())
        error = error if len(error) <= _SUMMARY else error[: _SUMMARY - 1] + "…"
        if msg.loaded:
            jobs_log.warning("job %d (%s) attempt %d failed: %s", msg.job_id, head.function, msg.attempt, error)
        else:
            jobs_log.error(
                "job %d (%s) attempt %d could not be loaded in child %d: %s; is the same code importable here, "
                "with the same secret?", msg.job_id, head.function, msg.attempt, c.pid, error,
            )

    # -- timeouts and stop requests -------------------------------------------------------

    def terminate(self, leases: set[tuple[int, int]]) -> None:
        """Someone asked for these attempts to stop: each is killed (with its process tree) once it runs."""
        self._stopping |= leases

    def check_timeouts(self, now: float) -> None:
        """Kill, beside the loop, the children whose running job passed its timeout (monotonic ``now``) or was asked to stop."""
        for c in list(self._children):
            deadline, head = c.deadline, c.running
            if head is None:
                continue
            if head.lease in self._stopping:
                self._stopping.discard(head.lease)
                log.warning(
                    "job %d (%s) attempt %d was asked to stop; killing child %d and its subprocesses",
                    head.job_id, head.function, head.attempt, c.pid,
                )
                self._start_kill(c, head, stopped=True)
            elif deadline is not None and deadline <= now:
                jobs_log.warning(
                    "job %d (%s) attempt %d passed its timeout; killing child %d and its subprocesses",
                    head.job_id, head.function, head.attempt, c.pid,
                )
                self._start_kill(c, head, stopped=False)
        if self._stopping:  # forget requests for attempts no child holds any more
            held = {a.lease for c in self._children for a in c.queue}
            self._stopping &= held

    def _start_kill(self, c: Child, head: Assignment, *, stopped: bool) -> None:
        """Kill ``c``'s tree beside the loop; its job ``head`` is reported once the tree is gone."""
        self._remove(c)
        self._release(list(c.queue)[1:])

        def report() -> Report:
            if stopped:
                return Report(
                    head.job_id, head.attempt, False, b"", "terminated",
                    "asked to stop while it ran; its process tree was killed",
                    worker_name(c.pid), self._started_at(c), self._clock.now(), head.retry_delay,
                    stopped=True,
                )
            error = JobTimeoutError(f"job {head.job_id} ran past its timeout of {head.timeout:g} s; its process tree was killed")
            return self._failure(c, head, error, "timeout")

        self._kills.kill(c, head, report)

    # -- dispatch ---------------------------------------------------------------------------

    def free_slots(self) -> int:
        """How many more jobs the children (and children yet to start) can take now."""
        free = sum(max(0, self._depth(c) - len(c.queue)) for c in self._children)
        return free + (self.s.max_workers - len(self._children)) * self._depth(None)

    def _depth(self, c: Child | None) -> int:
        return self._pace.depth(c.tasks if c is not None else 0, self.s.max_tasks_per_child)

    def dispatch(self, jobs: Sequence[tuple[Claimed, dict[int, bytes]]]) -> None:
        """Hand claimed jobs, each with the upstream results it takes, to children: one message per child."""
        calls: dict[Child, list[Call]] = {}
        for job, inputs in jobs:
            # Picked once the job before is queued: the next goes to another idle child, or a new one.
            c = self._pick()
            calls.setdefault(c, []).append(self._assign(c, job, inputs, early=False))
        self._send(calls)

    def _assign(self, c: Child, job: Claimed, inputs: dict[int, bytes], early: bool) -> Call:
        """Queue ``job`` on ``c``; the call to send it (``early``: its lease is not committed yet)."""
        c.queue.append(Assignment(
            job.job_id,
            job.attempt,
            job.timeout if job.timeout is not None else self.s.timeout,
            job.retry_delay if job.retry_delay is not None else self.s.retry_delay,
            job.fn_name,
            uncommitted=early,
        ))
        if len(c.queue) == 1:
            c.head_started()
        log.debug("job %d (%s) attempt %d -> child %d", job.job_id, job.fn_name, job.attempt, c.pid)
        sent = self._functions_for(c, job.payload)
        return Call(job.job_id, job.attempt, job.payload, inputs, job.refs or (), early, sent)

    @staticmethod
    def _send(calls: dict[Child, list[Call]]) -> None:
        """One message per child."""
        for c, batch in calls.items():
            try:
                c.conn.send(batch[0] if len(batch) == 1 else Calls(tuple(batch)))
            except OSError:
                pass  # the child is dead: its sentinel fires next tick and its jobs are reported there

    def _functions_for(self, c: Child, payload: bytes) -> tuple[tuple[str, bytes], ...]:
        """The stored functions ``payload`` names that ``c`` has not been sent, with their pickles (marked sent)."""
        if self._functions is None:
            return ()
        out = []
        for digest in byvalue.stored_in(payload):
            if digest not in c.functions and (data := self._functions(digest)) is not None:
                c.functions.add(digest)
                out.append((digest, data))
        return tuple(out)

    def early_room(self) -> int:
        """How many jobs a dispatch before the commit may hand out: as many as the idle children may hold."""
        return sum(self._depth(c) for c in self._children if not c.queue)

    def dispatch_early(self, jobs: Sequence[tuple[Claimed, dict[int, bytes]]]) -> None:
        """Hand jobs to idle children while the transaction that leased them is still committing.

        Only to children that hold nothing else, each at most as many as it
        may hold (:meth:`early_room`), in turn so that they start on the
        first jobs together: a failed commit (:meth:`void`) then kills
        children that hold only jobs whose leases never existed.
        """
        idle = [c for c in self._children if not c.queue]
        room = {c: self._depth(c) for c in idle}
        assert len(jobs) <= sum(room.values()), "an early dispatch goes to idle children only"
        calls: dict[Child, list[Call]] = {}
        turn = 0
        for job, inputs in jobs:
            while not room[idle[turn % len(idle)]]:
                turn += 1
            c = idle[turn % len(idle)]
            room[c] -= 1
            calls.setdefault(c, []).append(self._assign(c, job, inputs, early=True))
            turn += 1
        self._send(calls)

    def await_early(self, leases: set[tuple[int, int]], until: float) -> list[Report]:
        """Wait, until the monotonic time ``until``, for the children running these early calls to end them; their reports.

        Called inside the transaction that leased them, before its
        ``COMMIT``. The wait ends as soon as every one has reported, a child
        died, or one of their jobs asks whether its lease committed
        (``AwaitCommit``: it waits for this very commit). Other children's
        messages that arrive meanwhile are read as the loop reads them;
        their reports stay for the loop.
        """
        def running() -> list[Child]:
            return [c for c in self._children if c.queue and c.queue[0].lease in leases]

        children = running()
        while children and not any(a.awaits_commit for c in children for a in c.queue):
            left = until - time.monotonic()
            if left <= 0.0:
                break
            ready = set(mp_wait([w for c in children for w in (c.conn, c.process.sentinel)], left))
            if not ready:
                break
            self.handle(ready)
            children = running()
        with self._lock:
            mine = [r for r in self._reports if (r.job_id, r.attempt) in leases]
            if mine:
                self._reports = [r for r in self._reports if (r.job_id, r.attempt) not in leases]
        return mine

    def committed(self, leases: set[tuple[int, int]]) -> None:
        """The transaction that leased these early calls committed: tell the children that asked (``AwaitCommit``).

        The others are told when they ask: only a job that opened a
        transaction waits for its lease, and most ask nothing.
        """
        for c in self._children:
            for a in c.queue:
                if a.lease in leases:
                    a.uncommitted = False
                    if a.awaits_commit:
                        self._send_committed(c, a.lease)

    def _await_commit(self, c: Child, msg: AwaitCommit) -> None:
        """``c``'s job asks whether its early lease committed: answer now if it has, else once it has (:meth:`committed`)."""
        for a in c.queue:
            if a.lease == (msg.job_id, msg.attempt):
                if a.uncommitted:
                    a.awaits_commit = True  # answered by committed()
                else:
                    self._send_committed(c, a.lease)
                return
        # Not held (its assignment goes only with the job's Result, so this should not happen):
        # answer all the same. The completion is fenced by the lease in the database; what
        # the wait spares is only a lease not committed yet being taken for a lost one.
        log.warning("child %d asked about lease %s, which it does not hold", c.pid, (msg.job_id, msg.attempt))
        self._send_committed(c, (msg.job_id, msg.attempt))

    @staticmethod
    def _send_committed(c: Child, lease: tuple[int, int]) -> None:
        try:
            c.conn.send(Committed(*lease))
        except OSError:
            pass  # the child is dead: its sentinel fires next tick

    def void(self, leases: set[tuple[int, int]]) -> None:
        """The transaction that leased these attempts did not commit: kill the children running them, beside the loop.

        Nothing is reported for them: the database never saw these leases, and
        the rows went back to what they were (or were never inserted). The
        kill makes sure an attempt whose token the next claim may hand out
        again does not finish under it; for the same reason, what a child
        already reported for them, or what a dead child's queue gave back,
        is dropped (read while the transaction waited for other jobs of it,
        it would be written by the next tick, where SQLite's next try may
        have taken the same ids and attempts).
        """
        with self._lock:
            self._reports = [r for r in self._reports if (r.job_id, r.attempt) not in leases]
        self._releases = [lease for lease in self._releases if lease not in leases]
        for c in list(self._children):
            if not (c.queue and c.queue[0].lease in leases):
                continue
            head = c.queue[0]
            log.warning(
                "job %d attempt %d was handed to child %d before its lease committed, and the commit failed; "
                "killing the child (the job is claimed again)", head.job_id, head.attempt, c.pid,
            )
            self._remove(c)
            # Its other jobs were handed out by the same transaction: their leases never existed either.
            self._release([a for a in list(c.queue)[1:] if a.lease not in leases])
            self._kills.void(c)

    def _pick(self) -> Child:
        """An idle child, else a new one (up to max_workers), else the least loaded with room."""
        for c in self._children:
            if not c.queue:
                return c
        if len(self._children) < self.s.max_workers:
            return self._spawn()
        roomy = [c for c in self._children if len(c.queue) < self._depth(c)] or self._children
        return min(roomy, key=lambda c: len(c.queue))

    def start_all(self) -> None:
        """Start every child now rather than at the first jobs (a worker: it exists to run them)."""
        while len(self._children) < self.s.max_workers:
            self._spawn()

    def _spawn(self) -> Child:
        c = start_child(self.s.mp_context, self._config)
        self._children.append(c)
        log.debug("started child %d", c.pid)
        return c

    # -- leases -------------------------------------------------------------------------

    def leases(self, now: float) -> tuple[list[tuple[int, int]], set[int]]:
        """The leases to renew now (monotonic ``now``), and the ids of jobs that have started running.

        A running job's lease is renewed only while its child is heard from:
        a child that is frozen, or stuck holding the GIL, stops beating, and
        its lease runs out after ``lease_ttl`` so that any executor can rerun
        the job. Jobs a child holds but has not started yet (queued behind
        the running one, or waiting for the child to start), and jobs of
        children being killed, are vouched for by the parent.
        """
        fresh = _FRESH_BEATS * self.s.heartbeat_interval
        held: list[tuple[int, int]] = []
        started: set[int] = set()
        for c in self._children:
            running = c.running
            for a in c.queue:
                if a is running:
                    if now - c.heard > fresh:
                        continue
                    if c.beat == a.lease:
                        started.add(a.job_id)
                held.append(a.lease)
        return held + self._kills.leases(), started

    def holds(self) -> set[tuple[int, int]]:
        """Every ``(job, attempt)`` lease a child holds or is being killed for, whether its beats are fresh or not."""
        return {a.lease for c in self._children for a in c.queue} | set(self._kills.leases())

    def take_progress(self) -> dict[tuple[int, int], tuple[float | None, str | None]]:
        """The latest ``(fraction, message)`` each running attempt reported since the last call."""
        progress, self._progress = self._progress, {}
        return progress

    @property
    def new_starts(self) -> bool:
        """Whether a job began to beat since the leases were last renewed (its row should say running)."""
        return self._new_starts

    def starts_marked(self) -> None:
        """The leases were renewed and the running jobs marked."""
        self._new_starts = False

    # -- what the loop writes --------------------------------------------------------------

    def has_news(self) -> bool:
        """Whether reports, releases or an initializer's failure wait to be taken.

        A drain outside the loop's wait (the lease renewal's) can read a
        result from a pipe: the pipe is then quiet, and only this says the
        loop has something to write.
        """
        with self._lock:
            if self._reports or self._init_failure is not None:
                return True
        return bool(self._releases)

    def take_reports(self) -> list[Report]:
        """Outcomes collected since the last call (results, deaths, timeouts)."""
        with self._lock:
            reports, self._reports = self._reports, []
        return reports

    def take_releases(self) -> list[tuple[int, int]]:
        """``(job_id, attempt)`` of jobs a child held but never started (it died or was killed)."""
        releases, self._releases = self._releases, []
        return releases

    def take_init_failure(self) -> str | None:
        """Why the executor is broken, if a child's initializer failed since the last call."""
        with self._lock:
            reason, self._init_failure = self._init_failure, None
        return reason

    # -- stopping ------------------------------------------------------------------------

    def reap_retired(self) -> None:
        """Close the pipes of retired children that have exited."""
        for c in [c for c in self._retired if not c.process.is_alive()]:
            self._retired.remove(c)
            c.close()

    def abandon(self) -> list[tuple[int, int, float | None]]:
        """Kill every child's process tree; return what they held: ``(job_id, attempt, started_at or None)``.

        ``started_at`` is on the server's clock.
        """
        self.drain()  # results that already arrived are written, not run again
        held: list[tuple[int, int, float | None]] = []
        for c in self._children:
            for a in c.queue:
                held.append((a.job_id, a.attempt, self._started_at(c) if a is c.running else None))
            if c.queue:
                log.warning("killing child %d, which still runs job %d attempt %d", c.pid, c.queue[0].job_id, c.queue[0].attempt)
        kill_trees([c.pid for c in self._children], self.s.kill_grace)
        for c in self._children:
            c.queue.clear()
            c.close()
        self._children = []
        return held

    def stop(self) -> None:
        """Stop every child: idle ones are asked to exit, any left after a moment are killed."""
        for c in self._children:
            if not c.busy:
                try:
                    c.conn.send(Stop())
                except OSError:
                    pass
        everyone = self._children + self._retired
        end = time.monotonic() + _STOP_WAIT
        alive = [c for c in everyone if c.process.is_alive()]
        while alive and time.monotonic() < end:
            mp_wait([c.process.sentinel for c in alive], end - time.monotonic())
            alive = [c for c in alive if c.process.is_alive()]
        if alive:
            kill_trees([c.pid for c in alive], self.s.kill_grace)
        for c in everyone:
            c.process.join(0)
            c.close()
        self._children, self._retired = [], []
        self._kills.wait()

    # -- helpers ------------------------------------------------------------------------------

    def _report(self, report: Report) -> None:
        with self._lock:
            self._reports.append(report)

    def _release(self, never_started: list[Assignment]) -> None:
        self._releases += [a.lease for a in never_started]

    def _retire(self, c: Child) -> None:
        try:
            c.conn.send(Stop())
        except OSError:
            pass
        self._remove(c)
        self._retired.append(c)

    def _remove(self, c: Child) -> None:
        if c in self._children:
            self._children.remove(c)

    def _failure(self, c: Child, head: Assignment, error: BaseException, outcome: str) -> Report:
        return Report(
            head.job_id,
            head.attempt,
            False,
            serialization.dump_exception(error, signer=self._signer),
            outcome,
            f"{type(error).__name__}: {error}",
            worker_name(c.pid),
            self._started_at(c),
            self._clock.now(),
            head.retry_delay,
        )

    def _started_at(self, c: Child) -> float | None:
        """When ``c``'s current job started, on the server's clock (None: it had not)."""
        return None if c.started_at is None else self._clock.to_server(c.started_at)
