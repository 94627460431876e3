"""The tick's one transaction: what it writes, what it claims, and handing the claimed jobs out.

::

    SubmitQueue ──take()──┐
    children's reports ───┼──► Store.finish_and_claim / Store.look: one transaction
                          │      │  inserts queued rows, records reports, claims for free slots
                          │      ├─ before its COMMIT: jobs that need no read ──► idle children
                          │      │    (voided: killed, if the COMMIT fails)
                          │      └─ after it: Committed to those children; the futures it made final
                          └──► dispatch_claimed(): the rest, with the upstream results they take

The scheduler's loop calls :meth:`TickCommit.write_and_claim` and then
:meth:`TickCommit.dispatch_claimed` once per tick. What the transaction needs
from one tick to the next lives here: the reports not yet written, the jobs
claimed but not handed out, those handed out before the commit, the results
the last commit recorded, whether the last look left nothing runnable, and
the functions not to claim. Everything here runs in the scheduler thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from .flags import ExecutorFlags
from .lending import Lending
from .pace import Pace
from .records import Claimed, Finished, NewJob, Report, Submitted
from .registry import Registry
from .stats import SchedulerStats
from .store import Store
from .store.sql import Scope
from .submitqueue import Item, SubmitQueue
from .supervisor import Supervisor
from .wakeup import Wakeup

if TYPE_CHECKING:
    from .scheduler import Settings

__all__ = ["TickCommit"]

log = logging.getLogger("dbexecutor")
jobs_log = logging.getLogger("dbexecutor.jobs")

_PENDING_PER_TICK = 2000  # queued submits written per scheduler tick
_SKIP_FOR = 60.0  # seconds this executor stops claiming a function its children could not load


class TickCommit:
    """One executor's tick transaction (write, record, claim) and the hand-out of what it claimed."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        owner: str,
        flags: ExecutorFlags,
        pace: Pace,
        stats: SchedulerStats,
        wakeup: Wakeup,
        queue: SubmitQueue,
        registry: Registry,
        supervisor: Supervisor,
    ) -> None:
        self.store = store
        self.s = settings
        self.owner = owner  # the name the leases it takes carry
        self.flags = flags
        self.pace = pace
        self.stats = stats
        self._wakeup = wakeup
        self._queue = queue
        self._registry = registry
        self._supervisor = supervisor
        #: Free slots lent to submitting threads (a durable submit leased on insert), where the
        #: driver says that pays (None elsewhere: no accounting on every tick for nothing).
        self.lending = Lending(owner, settings.lease_ttl) if store.driver.leases_durable_submits else None
        # Kept across a database outage until written:
        self._reports: list[Report] = []  # outcomes from the children
        # A transaction that sent them failed: its COMMIT may have been made all the same.
        self._reports_unsure = False
        # A transaction that could claim failed: its COMMIT may have been made, with leases nobody knows of.
        self._leases_unsure = False
        self._claimed: list[Claimed] = []  # claimed, not yet handed to a child
        # Handed to children by the transaction committing now, before its COMMIT (see _start_early).
        self._early: list[Claimed] = []
        self._late: list[Report] = []  # what some of them reported before that COMMIT, recorded by it
        # Whether the transaction under way may wait for those jobs and record them (see _start_early),
        # until when at the latest, and how long it waited.
        self._may_hold = False
        self._hold_end: float | None = None
        self._held_for = 0.0
        # The results the last commit recorded, by job id: a dependent it claimed
        # takes them from here (a chain's next link), not from another read.
        self._fresh: dict[int, bytes] = {}
        self._skip: dict[str, float] = {}  # functions not to claim (children could not load them), until a monotonic time
        # (monotonic time, wake-ups then) of the last look for work that left nothing
        # runnable; None once anything since may have made work runnable (see _still_drained).
        self._drained: tuple[float, int] | None = None

    # -- what the loop tells it, and asks ---------------------------------------------------------

    def add_reports(self, reports: Sequence[Report]) -> None:
        """The children's reports, for the next commit; a refused one keeps its function from being claimed here."""
        for report in reports:
            if report.refused:
                self._cannot_run(report)
        self._reports += reports

    def has_reports(self) -> bool:
        """Whether reports wait for the next commit."""
        return bool(self._reports)

    def holds_work(self) -> bool:
        """Whether reports wait to be written or claimed jobs to be handed out (the loop may not end yet)."""
        return bool(self._reports or self._claimed or self._lent())

    def claimed_leases(self) -> list[tuple[int, int]]:
        """The leases of the jobs claimed but not handed to a child yet: renewed with the others."""
        return [(job.job_id, job.attempt) for job in self._claimed]

    def forget_drained(self) -> None:
        """Work may have become runnable (a delayed job due, a release, a reclaim, a rescue): the next commit looks."""
        self._drained = None

    # -- the transaction --------------------------------------------------------------------------

    def write_and_claim(self) -> None:
        """Write queued submits and collected reports, and claim work for free slots: one transaction.

        The queue's writer is held only while queued submits are written (so
        that ids follow submission order). A tick that finds none queued
        records results and claims without it: a caller's ``flush()`` (a
        durable submit, a keyed job) then writes beside it, and the tick does
        not wait for that write either.
        """
        self.hand_out_lent()
        if self._leases_unsure or self._queue.lease_unsure:
            self._release_unknown()
        items: list[Item] = []
        written = None
        # Nothing queued: no wait for the writer, which a durable submit holds through its round trip and commit.
        if len(self._queue):
            with self._queue.writing():
                if self._queue.unsure():
                    self._queue.confirm()  # jobs a tick whose COMMIT failed may have stored
                # A bounded share per tick, so that a burst of thousands does
                # not hold the claim back until all of them are written.
                items, more = self._queue.take(_PENDING_PER_TICK)
                if more:
                    self._wakeup.wake(work=True)  # the rest in the next tick, at once
                items, rows = self._queue.resolve(items)
                written = self._commit(items, rows, self._free_slots()) if items else None
        if items:
            if written is not None:
                self._resolve(*written)
            return
        limit = self._free_slots()
        if self._reports:
            written = self._commit([], [], limit)
            if written is not None:
                self._resolve(*written)
        elif limit > 0:
            self._look(limit)

    def _look(self, limit: int) -> None:
        """An idle tick: claim up to ``limit`` jobs (or probe whether any are runnable), nothing else to write.

        Like a tick's transaction, it may wait for the jobs it hands out
        before its ``COMMIT`` and record those that end in time.
        """
        probe = not self._wakeup.take_work_hint()
        started, wakes = time.monotonic(), self._wakeup.wakes
        self._may_hold, self._held_for = True, 0.0
        try:
            claimed, done = self.store.look(
                self.owner, limit, self.s.lease_ttl, self.store.now(), probe=probe, scope=self._scope(),
                before_commit=self._start_early,
            )
        except BaseException as error:
            self._void_early()
            self._leases_unsure = isinstance(error, DBAPIError)
            raise
        finally:
            self._may_hold = False
        self._looked(started, wakes)
        if claimed:  # an idle probe is not a claim
            self.stats.claimed(time.monotonic() - started)
            self.stats.started(len(claimed))
        late, self._late = self._late, []
        if late:
            self.pace.tick_recorded(time.monotonic() - started - self._held_for)
            self.stats.ended(late)
            if done.released or done.retried or done.refused:
                self._wakeup.wake(work=True)  # made runnable after this look's claim: claimed at once
            self._fresh = done.results()
        self._claimed += self._started_early(claimed)
        self._resolve([], done)

    def _commit(self, items: list[Item], rows: list[NewJob], limit: int) -> tuple[list[Submitted], Finished] | None:
        """Insert ``items`` (as ``rows``), record the reports and claim up to ``limit`` jobs; None if rows were refused."""
        now: float | None = None  # the time the rows are written with (found by it if the COMMIT did not answer)
        try:
            started, wakes = time.monotonic(), self._wakeup.wakes
            # New rows are always looked at by the store; saying so here also
            # renews what _still_drained trusts, from this tick's fresh look.
            look = bool(rows) or not self._still_drained()
            now = self.store.now()
            self._may_hold, self._held_for = True, 0.0
            try:
                inserted, done, claimed = self.store.finish_and_claim(
                    self._reports, self.owner, limit, self.s.lease_ttl, now, rows, self._scope(), look=look,
                    before_commit=self._start_early, unsure=self._reports_unsure,
                )
            finally:
                self._may_hold = False
            if look and limit > 0:
                self._looked(started, wakes)
            elif not self.store.drained:
                self._drained = None  # this commit may have made work runnable
            if self._reports or self._late:
                # Without the wait for late reports: else the budget it is measured against would grow with it.
                self.pace.tick_recorded(time.monotonic() - started - self._held_for)
            if limit > 0 and (look or claimed):  # a skipped claim is not one
                self.stats.claimed(time.monotonic() - started)
        except (DBAPIError, ValueError) as error:
            self._void_early()
            self._reports_unsure = bool(self._reports)
            self._leases_unsure = isinstance(error, DBAPIError)
            self._queue.requeue(items, written_at=now)
            if not items or not self._queue.refused(error):
                raise
            # A row the database refuses must not hold up the rest: write them singly.
            self._queue.write_one_by_one(self._queue.take()[0])
            return None
        except BaseException:
            # Anything else is a bug that ends the loop: the jobs go back to the
            # queue, where breaking the executor fails their futures, rather than
            # into a limbo where reading their ids would wait forever.
            self._void_early()
            self._queue.requeue(items)
            raise
        self.stats.ended(self._reports + self._late)
        self.stats.started(len(claimed))
        if self._late and (done.released or done.retried or done.refused):
            # Made runnable after this transaction's claim: the next tick claims at once, not a poll later.
            self._wakeup.wake(work=True)
        self._late = []
        self._fresh = done.results()
        self._reports, self._reports_unsure = [], False
        self._claimed += self._started_early(claimed)
        self._queue.stored(items, inserted)
        return inserted, done

    def _release_unknown(self) -> None:
        """After a claim or a durable submit's leased insert whose ``COMMIT`` failed: give back the leases it took if it was made all the same.

        The store's own retries find such a commit (``store.landed``); once
        they are spent, the loop does not know what it leased, and those
        jobs would wait for their leases to expire. Everything leased to
        this executor that no child holds, no tick has claimed and no report
        waiting to be written names is given back. Under the submit queue's
        writer, so that no durable submit's leased insert is in flight; what
        those landed is handed out first.
        """
        with self._queue.writing():
            self.hand_out_lent()
            known = self._supervisor.holds() | set(self.claimed_leases())
            known |= {(r.job_id, r.attempt) for r in self._reports}  # ended, not recorded yet: still ours
            released = self.store.release_unknown(self.owner, known, self.store.now())
            self._queue.lease_unsure = False  # under the writer: a leased insert that fails after this sets it again
        self._leases_unsure = False
        if released:
            log.warning("gave back job(s) %s, leased by a claim whose commit did not answer", released)
            self.forget_drained()

    # -- early dispatch: before the COMMIT ----------------------------------------------------------

    def _started_early(self, claimed: list[Claimed]) -> list[Claimed]:
        """After the commit that leased ``claimed``: tell the children running the early ones; the rest, to dispatch."""
        early, self._early = {(job.job_id, job.attempt) for job in self._early}, []
        if not early:
            return claimed
        self._supervisor.committed(early)
        rest = []
        for job in claimed:
            if (job.job_id, job.attempt) in early:
                self._registry.mark_running(job.job_id)
            else:
                rest.append(job)
        return rest

    def _start_early(self, claimed: list[Claimed], done: Finished, again: bool = False) -> list[Report]:
        """In the transaction that claimed them, before its ``COMMIT``: hand jobs to idle children; the reports to record with them.

        The children start on them while the commit is written (a flush to
        disk on every database: 0.2-0.5 ms here), instead of after it. Only
        jobs whose arguments need no read (no upstream results, or results
        this transaction recorded) go early, to idle children only, each as
        many as it may hold (several while jobs are short: a short ``map``
        runs whole before its rows commit); the rest are dispatched after the
        commit. If the commit fails, :meth:`_void_early` kills those
        children: the leases never existed.

        When recent jobs ran in less time than a transaction takes, the
        transaction (a tick's, or an idle tick's look, :meth:`Store.look`)
        then waits for them a moment (:meth:`_hold_until`):
        those that end by then are recorded by this same transaction, so
        their futures resolve at its ``COMMIT`` instead of a transaction
        later, and the jobs they made runnable come back here leased
        (``again``: the same try of the transaction). If the commit fails,
        their reports go with the leases.
        """
        if not again:
            self._void_early()  # an earlier try of this transaction, which did not commit
            self._hold_end = None
        fresh = done.results()
        # Nor a job whose stored function this process has not read yet (a read after the commit).
        have = self.store.functions.has_all
        ready = [
            job for job in claimed if job.refs is not None and all(ref in fresh for ref in job.refs) and have([job.payload])
        ]
        ready = ready[: self._supervisor.early_room()]
        if not ready:
            return []
        self._supervisor.dispatch_early([(job, {ref: fresh[ref] for ref in job.refs or ()}) for job in ready])
        self._early += ready
        until = self._hold_until()
        if until is None:
            return []
        started = time.monotonic()
        late = self._supervisor.await_early({(job.job_id, job.attempt) for job in ready}, until)
        self._held_for += time.monotonic() - started
        for report in late:
            if report.refused:
                self._cannot_run(report)
        self._late += late
        return late

    def _hold_until(self) -> float | None:
        """Until when (monotonic) the transaction under way waits for the jobs it just handed out; None: it does not.

        Each wait lasts at most what a transaction takes (:meth:`Pace.hold_budget`),
        and all of one transaction's together at most :attr:`Pace.hold_max`.
        Never while submits wait.
        """
        if not self._may_hold or len(self._queue):
            return None
        budget = self.pace.hold_budget()
        if budget <= 0.0:
            return None
        now = time.monotonic()
        if self._hold_end is None:
            self._hold_end = now + self.pace.hold_max
        return min(now + budget, self._hold_end) if now < self._hold_end else None

    def _void_early(self) -> None:
        """The transaction that claimed the jobs handed out early did not commit: stop them, report nothing."""
        if self._early:
            self._supervisor.void({(job.job_id, job.attempt) for job in self._early})
            self._early = []
        self._late = []  # what they reported goes with their leases

    # -- whether to look for work -----------------------------------------------------------------

    def _looked(self, started: float, wakes: int) -> None:
        """After a look for work that began at ``started`` with ``wakes`` wake-ups: note whether it left nothing runnable."""
        self._drained = (started, wakes) if self.store.drained else None

    def _still_drained(self) -> bool:
        """Whether a tick that only records results may skip the claim: nothing can have become runnable.

        True when the last look found nothing runnable, less than a poll
        interval ago, and since then: no wake-up (a submit of ours, a
        notification of another process's work or finish, a cancel), no
        delayed job due, nothing released, reclaimed or rescued. The store
        looks anyway when the results themselves make jobs runnable (a
        dependent released, a retry). What other processes add without a
        notification (no NOTIFY and no doorbell) is found by the next look,
        at most a poll interval later, as an idle executor would find it.
        """
        if self._drained is None:
            return False
        at, wakes = self._drained
        return wakes == self._wakeup.wakes and time.monotonic() - at < self.s.poll_interval

    def _resolve(self, inserted: list[Submitted], done: Finished) -> None:
        """Resolve the futures a commit made final: rows final on arrival, and jobs that ended."""
        self._registry.settle(inserted)
        for jid in done.lost:
            log.warning("job %d: this attempt lost its lease (reclaimed elsewhere); its outcome was discarded", jid)
        for jid in done.retried:
            log.info("job %d failed and will be retried", jid)
        for final in done.finals:
            self._registry.resolve(final)

    # -- what may be claimed, and how much ----------------------------------------------------------

    def _scope(self) -> Scope:
        """What this executor may claim: its queues, without the functions its children could not load lately."""
        if self._skip:
            now = time.monotonic()
            self._skip = {fn: until for fn, until in self._skip.items() if until > now}
        return Scope(self.s.queues, frozenset(self._skip))

    def _cannot_run(self, report: Report) -> None:
        """A child could not load a job: stop claiming its function here for a while, and say so."""
        if report.fn_name not in self._skip:
            jobs_log.error(
                "job %d (%s) attempt %d could not be loaded here: %s; is the same code importable here? It goes "
                "back for other executors, and %s is not claimed here for %g s",
                report.job_id, report.fn_name, report.attempt, report.error, report.fn_name, _SKIP_FOR,
            )
        self._skip[report.fn_name] = time.monotonic() + _SKIP_FOR

    def _free_slots(self) -> int:
        """Slots free for this tick's claim: free of this loop's jobs, and not lent to a submitting thread."""
        return max(0, self._own_free_slots() - self._lent())

    def _lent(self) -> int:
        """Slots lent to submitting threads and not handed out yet."""
        return self.lending.in_use() if self.lending is not None else 0

    def _own_free_slots(self) -> int:
        if not self.s.run_jobs:
            return 0
        with self.flags.deciding():
            if self.flags.broken is not None or (self.flags.shutdown and not self._registry.has_outstanding()):
                return 0
        return max(0, self._supervisor.free_slots() - len(self._claimed))

    # -- after the commit: the rest to children -------------------------------------------------------

    def dispatch_claimed(self) -> None:
        """Hand the claimed jobs to children, each with the upstream results it takes as arguments; then say what may be lent."""
        if self._claimed:
            inputs = self._inputs(self._claimed)
            self.store.functions.fetch(job.payload for job in self._claimed)
            for job in self._claimed:
                self._registry.mark_running(job.job_id)
            self._supervisor.dispatch([(job, inputs[job.job_id]) for job in self._claimed])
            self._claimed, self._fresh = [], {}
        if self.lending is not None:
            self.lending.publish(self._own_free_slots(), self._scope())

    def hand_out_lent(self) -> None:
        """Hand out the jobs submitting threads' inserts leased in slots this loop lent (before this tick's transaction)."""
        landed = self.lending.take() if self.lending is not None else []
        if landed:
            self.stats.started(len(landed))
            for job in landed:
                self._registry.mark_running(job.job_id)
            # No upstream (only such a job goes in leased): nothing to read first (but a stored
            # function, which this process wrote if it submitted the job).
            self.store.functions.fetch(job.payload for job in landed)
            self._supervisor.dispatch([(job, {}) for job in landed])

    def _inputs(self, claimed: Sequence[Claimed]) -> dict[int, dict[int, bytes]]:
        """The stored results each job takes, by job id (read once for all; passed on still signed)."""
        wanted = {ref for job in claimed if job.refs for ref in job.refs}
        results = {ref: self._fresh[ref] for ref in wanted if ref in self._fresh}
        missing = sorted(wanted - set(results))
        if missing:
            results.update(self.store.results(missing))
        # Rows written before schema 3 did not record which upstreams they
        # take: they get every done upstream's result.
        unrecorded = [job.job_id for job in claimed if job.refs is None]
        upstream = self.store.upstream_results(unrecorded) if unrecorded else {}
        return {
            job.job_id: upstream.get(job.job_id, {})
            if job.refs is None
            else {ref: results[ref] for ref in job.refs if ref in results}
            for job in claimed
        }

    def give_back_claimed(self) -> None:
        """The loop ends with jobs claimed but never handed out: release them (else their leases expire)."""
        if self.lending is not None:
            self._claimed += self.lending.close()
        for job in self._claimed:
            try:
                self.store.release(job.job_id, job.attempt)
            except Exception:  # noqa: BLE001 - the lease expires anyway
                log.warning("could not release job %d; its lease will expire", job.job_id)
        self._claimed = []
