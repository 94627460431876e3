"""What one scheduler did, counted in memory: jobs started, attempts ended by outcome, claim latency, rescues.

Plain counters under a lock, with no dependency, bumped by the scheduler
thread; ``dbexecutor worker --metrics-port`` exports them in the Prometheus
format (:mod:`dbexecutor.metrics`). They count this process's work since it
started, as Prometheus counters do.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from .records import Report

__all__ = ["SchedulerStats", "StatsSnapshot", "CLAIM_BUCKETS", "outcome_label"]

#: Upper bounds (seconds) of the claim latency histogram's buckets.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_KNOWN = ("ok", "exception", "timeout", "terminated")


def outcome_label(outcome: str) -> str:
    """An attempt's outcome as a label with few values: ok, exception, timeout, terminated, or died (signals, exit codes)."""
    return outcome if outcome in _KNOWN else "died"


@dataclass(frozen=True)
class StatsSnapshot:
    """The counters at one moment (``claim_buckets``: claims at or under each bound of ``CLAIM_BUCKETS``, cumulative)."""

    started: int
    ended: dict[str, int]
    claims: int
    claim_seconds: float
    claim_buckets: list[int]
    rescued: int

    @property
    def failures(self) -> int:
        """Attempts that failed: raised, timed out or died (not stopped on request)."""
        return sum(n for outcome, n in self.ended.items() if outcome not in ("ok", "terminated"))


@dataclass
class SchedulerStats:
    """Counters of one scheduler (thread-safe)."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _started: int = 0
    _ended: dict[str, int] = field(default_factory=dict)
    _claims: int = 0
    _claim_seconds: float = 0.0
    _claim_counts: list[int] = field(default_factory=lambda: [0] * (len(CLAIM_BUCKETS) + 1))
    _rescued: int = 0

    def started(self, n: int) -> None:
        """``n`` jobs were claimed to run here."""
        if n:
            with self._lock:
                self._started += n

    def ended(self, reports: Sequence[Report]) -> None:
        """These attempts' outcomes were written."""
        if not reports:
            return
        with self._lock:
            for rep in reports:
                label = outcome_label(rep.outcome)
                self._ended[label] = self._ended.get(label, 0) + 1

    def claimed(self, seconds: float) -> None:
        """A transaction that claims took ``seconds``, from the request to its commit."""
        with self._lock:
            self._claims += 1
            self._claim_seconds += seconds
            self._claim_counts[bisect.bisect_left(CLAIM_BUCKETS, seconds)] += 1

    def rescued(self, n: int) -> None:
        """``n`` jobs whose lease had expired were put back to ready by this scheduler."""
        if n:
            with self._lock:
                self._rescued += n

    def snapshot(self) -> StatsSnapshot:
        """A consistent copy of every counter."""
        with self._lock:
            cumulative, total = [], 0
            for n in self._claim_counts[:-1]:
                total += n
                cumulative.append(total)
            return StatsSnapshot(self._started, dict(self._ended), self._claims, self._claim_seconds, cumulative, self._rescued)
