"""How long jobs and transactions take, and what the scheduler makes of it.

Pure arithmetic over moving averages, no I/O, so it is tested without a
database. Two decisions follow from it:

- **prefetch depth**: while recent jobs are short, a child holds several in
  its pipe, so it never waits for a round trip and one transaction finishes
  and claims many; for long jobs that would only block the head of the line;
- **linger**: a tick that would only record results may wait for the jobs
  the children still hold, when they should end sooner than a transaction
  takes, and record them all in one commit;
- **hold**: a transaction that hands jobs to idle children before its
  ``COMMIT`` may wait for them there, when they should end sooner than a
  transaction takes, and record them itself: one commit instead of two.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HOLD_MAX_ONE_WRITER", "Pace"]

_PREFETCH_BELOW = 0.05  # seconds: average run time under which a child gets more jobs queued
# Seconds: average run time under which a child holds one job queued behind the one it runs, so it
# goes straight on when a job ends instead of waiting for a transaction to record it and claim
# the next (the queued job waits at most about one run time; longer jobs are not worth the wait).
_NEXT_QUEUED_BELOW = 1.0
_PREFETCH_WORK = 0.05  # seconds of (short) work a child may hold queued behind its running job
_PREFETCH_MAX = 512  # at most this many jobs per child
_PREFETCH_AFTER = 4  # results seen before the average is trusted
_LINGER_MAX = 0.02  # seconds a tick that would only record results may wait
# Seconds a transaction may stay open waiting for the jobs it started, all its waits together
# (its jobs' futures resolve at its COMMIT).
_HOLD_MAX = 0.01
#: The same where one writer holds the whole database back (SQLite): a transaction held for
#: 10 ms at a time starved another thread's durable submits (p50 3.7 -> 25 ms beside a chain);
#: 1 ms kept them near (p50 4.1 ms) and the chain still gained (2.7 -> 2.1 s).
HOLD_MAX_ONE_WRITER = 0.001


@dataclass
class Pace:
    """Moving averages of run times and of the transactions that record results.

    The fields are public so a test can pin them (a transaction "taking"
    30 s makes every tick linger).
    """

    avg_run: float = 1.0  # seconds, recent jobs' run time
    results_seen: int = 0
    tick_cost: float = 0.0  # seconds, recent transactions that recorded results (0: none yet)
    linger_max: float = _LINGER_MAX  # the longest a tick waits for results it could record together
    hold_max: float = _HOLD_MAX  # the longest a transaction waits, in all, for the jobs it started before its COMMIT

    def job_ended(self, seconds: float) -> None:
        """A child reported a job that ran for ``seconds``."""
        self.avg_run = 0.8 * self.avg_run + 0.2 * max(0.0, seconds)
        self.results_seen += 1

    def tick_recorded(self, seconds: float) -> None:
        """A transaction that recorded results took ``seconds``."""
        self.tick_cost = seconds if not self.tick_cost else 0.8 * self.tick_cost + 0.2 * seconds

    def depth(self, tasks_done: int = 0, max_tasks_per_child: int | None = None) -> int:
        """How many jobs a child may hold: one, or more while jobs are short (never past its task limit)."""
        depth = 1
        if self.results_seen >= _PREFETCH_AFTER and self.avg_run < _PREFETCH_BELOW:
            depth = max(2, min(_PREFETCH_MAX, int(_PREFETCH_WORK / max(self.avg_run, 1e-6))))
        elif self.results_seen >= _PREFETCH_AFTER and self.avg_run < _NEXT_QUEUED_BELOW:
            depth = 2
        if max_tasks_per_child:
            depth = min(depth, max_tasks_per_child - tasks_done)
        return depth

    def linger_budget(self, longest_queue: int) -> float:
        """Seconds worth waiting for the children's held jobs before recording results (0.0: do not wait).

        Worth it when the longest queue should drain within a transaction's
        time: one transaction later then records everything, and the last
        result is written sooner than by a tick now and another after.
        """
        if longest_queue <= 0 or self.tick_cost <= 0.0:
            return 0.0
        budget = min(self.tick_cost, self.linger_max)
        if longest_queue * self.avg_run > budget:
            return 0.0
        return budget

    def hold_budget(self) -> float:
        """Seconds worth keeping a transaction open for the jobs it just handed out before its ``COMMIT`` (0.0: do not wait).

        Worth it when recent jobs ran in less than a transaction takes: the
        transaction that leased them then records them too, and their
        results are final one ``COMMIT`` sooner. Never before a few results
        have been seen; never longer than :attr:`hold_max` (which also
        bounds all the waits of one transaction together).
        """
        if self.results_seen < _PREFETCH_AFTER or self.tick_cost <= 0.0:
            return 0.0
        budget = min(self.tick_cost, self.hold_max)
        return budget if self.avg_run < budget else 0.0
