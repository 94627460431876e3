"""What the scheduler's loop does on a schedule, each at its own next-due time.

::

    every tick, when due:
      keep_time()               the server clock's offset (Store.sync_clock: every minute)
      reclaim_expired()         leases that ran out, anyone's ─────────────┐
      rescue_dead_executors()   jobs of dead executors on this machine ────┼──► TickCommit: look again
                                (and, rarely, forget old registrations)    ┘
      renew_leases()            this executor's beat and every lease it holds, in one transaction
      follow_other_processes()  finals of our jobs that other processes finished ──► Registry
      apply_retention()         one bounded batch of old finished jobs deleted (caught up: the
                                stored functions no job names, every ten minutes)

Each task keeps its own next-due time (monotonic); :meth:`Upkeep.next_due`
is what the loop's wait must not sleep past. Everything here runs in the
scheduler thread.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .records import Registration
from .registry import Registry
from .stats import SchedulerStats
from .store import Store
from .supervisor import Supervisor
from .tickcommit import TickCommit

if TYPE_CHECKING:
    from .scheduler import Settings

__all__ = ["Upkeep"]

log = logging.getLogger("dbexecutor")

_IN_POLL = 500  # ids checked per remote poll
_RETENTION_BATCH = 500  # jobs deleted per retention transaction
_SWEEP_EVERY = 600.0  # seconds between sweeps of the stored functions (see store.functions)
_RESCUE_EVERY = 1.0  # seconds between looks for dead executors on this machine (a cheap indexed read)
_FORGET_EVERY = 60.0  # seconds between clean-ups of old registrations
_FORGET_AFTER = 600.0  # seconds a dead executor stays listed (at least ten lease TTLs)


class Upkeep:
    """The periodic tasks of one executor's loop, and when each is due next."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        registration: Registration,
        stats: SchedulerStats,
        supervisor: Supervisor,
        registry: Registry,
        commit: TickCommit,
    ) -> None:
        self.store = store
        self.s = settings
        self.registration = registration  # what the beat renews
        self.stats = stats
        self._supervisor = supervisor
        self._registry = registry
        self._commit = commit  # told when work may be runnable again; its claimed jobs' leases are renewed too
        self._lost: set[tuple[int, int]] = set()  # leases already reported lost
        self._next_renew = self._next_poll = self._next_reclaim = self._next_retention = self._next_sweep = 0.0
        self._next_rescue = self._next_forget = 0.0

    def next_due(self) -> float:
        """The monotonic time of the next reclaim or beat, which the loop's wait must not sleep past.

        The beat is due whether or not jobs are held: the registration says this executor is alive.
        """
        return min(self._next_reclaim, self._next_renew)

    def keep_time(self) -> None:
        """Measure the server clock's offset again when it is due (every minute; a few round trips)."""
        self.store.sync_clock(force=False)

    def reclaim_expired(self) -> None:
        """Put back to ready the jobs whose lease expired (anyone's), every half TTL (at most 5 s)."""
        now = time.monotonic()
        if now < self._next_reclaim:
            return
        self._next_reclaim = now + min(self.s.lease_ttl / 2, 5.0)
        reclaimed = self.store.reclaim_expired(self.store.now())
        self.stats.rescued(len(reclaimed))
        if reclaimed:
            self._commit.forget_drained()
            log.warning("reclaimed %d job(s) whose lease expired: %s", len(reclaimed), reclaimed[:20])

    def rescue_dead_executors(self) -> None:
        """Put back to ready, at once, the jobs of executors on this machine whose process is gone."""
        now = time.monotonic()
        if now >= self._next_rescue:
            self._next_rescue = now + _RESCUE_EVERY
            for name, ids in self.store.rescue_dead_here().items():
                if ids:
                    self._commit.forget_drained()
                    log.warning("executor %s is gone; its job(s) %s were put back to ready", name, ids[:20])
        if now >= self._next_forget:
            self._next_forget = now + _FORGET_EVERY
            self.store.forget_dead(max(_FORGET_AFTER, 10 * self.s.lease_ttl))

    def renew_leases(self) -> None:
        """Every interval, or when a job began running: this executor's beat and every lease it holds, in one transaction."""
        now = time.monotonic()
        if now < self._next_renew and not self._supervisor.new_starts:
            return
        self._supervisor.drain()  # a beat that arrived during this tick counts
        held, started = self._supervisor.leases(now)
        held += self._commit.claimed_leases()
        progress = self._supervisor.take_progress()  # the latest per job, written with the renewal
        renewal = self.store.beat(self.registration, held, started, self.s.lease_ttl, progress)
        pairs = {pair for pair in held if pair[0] in renewal.lost}
        for job_id, attempt in sorted(pairs - self._lost):
            log.warning("job %d attempt %d lost its lease; its result will be discarded", job_id, attempt)
        self._lost = pairs
        if renewal.stop:  # someone asked for these to stop: the supervisor kills them
            self._supervisor.terminate({pair for pair in held if pair[0] in renewal.stop})
        self._supervisor.starts_marked()
        self._next_renew = now + self.s.heartbeat_interval

    def follow_other_processes(self) -> None:
        """Resolve futures whose jobs another process finished: polled round robin, or named by a notification."""
        now = time.monotonic()
        if self._registry.take_full_poll() or now >= self._next_poll:
            self._next_poll = now + self.s.poll_interval
            ids = self._registry.poll_batch(_IN_POLL)
        else:
            ids = self._registry.take_finished_elsewhere()
        if ids:
            for final in self.store.finals(ids):
                self._registry.resolve(final)

    def apply_retention(self) -> None:
        """Delete one bounded batch of jobs finished longer than ``retention`` ago.

        One batch per interval keeps each transaction small and the cost per
        tick flat; a full batch means more are due, so the next comes soon.
        """
        now = time.monotonic()
        if self.s.retention is None or now < self._next_retention:
            return
        deleted = self.store.purge_batch(self.store.now() - self.s.retention, _RETENTION_BATCH)
        if deleted:
            log.debug("retention: deleted %d finished job(s) older than %g s", deleted, self.s.retention)
        pause = 0.0 if deleted >= _RETENTION_BATCH else min(60.0, max(1.0, self.s.retention / 10))
        self._next_retention = now + pause
        if deleted < _RETENTION_BATCH and now >= self._next_sweep:
            # Caught up: the stored functions no job left can name go too (rarely: they are few, and kept an hour).
            swept = self.store.sweep_functions()
            if swept:
                log.debug("retention: deleted %d stored function(s) no job names", swept)
            self._next_sweep = now + _SWEEP_EVERY
