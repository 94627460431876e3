"""What ends the scheduler's wait early: a self-pipe, and the times delayed jobs become runnable.

::

    submit / cancel / shutdown / notification ──wake()──► pipe ──┐
    submit(delay=...) ──────────────────────────due()──► heap ───┼─► the loop's wait
    children's pipes and sentinels ──────────────────────────────┘

A wake-up the loop has not consumed yet covers every later one, so a burst of
submits costs one system call, not one each.
"""

from __future__ import annotations

import heapq
import os
import threading

__all__ = ["Wakeup", "DueTimes"]


class Wakeup:
    """A pipe the loop waits on; any thread writes a byte to end the wait."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._lock = threading.Lock()
        self._closed = False
        self._pending = False  # a byte is in the pipe that the loop has not read
        self._work = False  # a submit or a notification says ready work is there
        #: How many wake-ups there have been: the loop compares it to tell whether anything
        #: (a submit, a cancel, a notification) happened since it last looked for work.
        self.wakes = 0

    @property
    def reader(self) -> int:
        """The descriptor to wait on (with ``multiprocessing.connection.wait``)."""
        return self._r

    def wake(self, work: bool = False) -> None:
        """End the loop's wait now; ``work``: jobs became ready (claim without probing first)."""
        if work:
            self._work = True
        with self._lock:
            # Under the lock: an increment lost between threads could bring the
            # count back to a value the loop saw before a wake-up it then missed.
            self.wakes += 1
            # Once closed, the descriptor number may already belong to a file
            # or socket opened since: never write to it again.
            if self._closed or self._pending:
                return
            self._pending = True
            try:
                os.write(self._w, b"x")
            except BlockingIOError:
                pass  # pipe full: a wake-up is pending anyway

    def consume(self) -> None:
        """Read the pending wake-up (the loop, after its wait returned the reader)."""
        with self._lock:
            # Cleared before the read: a wake() from now on writes again.
            self._pending = False
            if self._closed:
                return
            try:
                os.read(self._r, 4096)
            except BlockingIOError:
                pass

    def take_work_hint(self) -> bool:
        """Whether a wake-up since the last call said that work became ready."""
        hint, self._work = self._work, False
        return hint

    def close(self) -> None:
        """Close the pipe (the loop has ended); later wake-ups do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._r)
            os.close(self._w)


class DueTimes:
    """Wall-clock times at which delayed jobs of ours become runnable (a heap)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[float] = []

    def add(self, when: float) -> None:
        """A job becomes runnable at ``when`` (epoch seconds)."""
        with self._lock:
            heapq.heappush(self._heap, when)

    def until_next(self, now: float) -> float | None:
        """Seconds until the next due time (0.0 if one has passed, now consumed); None if none is left."""
        with self._lock:
            passed = False
            while self._heap and self._heap[0] <= now:
                heapq.heappop(self._heap)
                passed = True
            if passed:
                return 0.0
            return self._heap[0] - now if self._heap else None
