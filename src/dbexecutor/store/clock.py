"""One clock for every process on a database: the server's.

Leases, delays, backoff and retention compare times written by different
machines, so they must come from one clock. Reading the server's clock in
every statement would cost a round trip per reading; instead the store
measures the server's time against this process's *monotonic* clock (a few
round trips, keeping the one with the shortest delay) and reads
``monotonic() + offset`` from then on. A machine whose wall clock is off by
minutes, or is stepped by NTP meanwhile, gets the server's time all the same;
the offset is measured again every minute, which absorbs the drift between
the two clocks. SQLite's "server" is the machine the file is on: its clock is
read through SQLite, which every process on the file shares, whatever any
one process's Python thinks the time is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Clock"]

SAMPLES = 3  # round trips per measurement; the shortest one is kept
RESYNC = 60.0  # seconds between measurements


class Clock:
    """The database server's time in epoch seconds, without a round trip per reading."""

    def __init__(self) -> None:
        self._offset = time.time() - time.monotonic()  # server time - monotonic time, until measured
        self._synced = -float("inf")  # monotonic time of the last measurement
        self._error = 0.0  # half the round trip of the kept sample: how far off now() may be
        self._lock = threading.Lock()

    def now(self) -> float:
        """The server's current time, as epoch seconds."""
        return time.monotonic() + self._offset

    def to_server(self, local_wall: float) -> float:
        """A time read from this machine's wall clock (``time.time()``), on the server's clock."""
        return local_wall + (self.now() - time.time())

    @property
    def due(self) -> bool:
        """Whether the offset should be measured again."""
        return time.monotonic() - self._synced >= RESYNC

    @property
    def error(self) -> float:
        """At most this far (seconds) from the server's clock, as of the last measurement."""
        return self._error

    def sync(self, read_server: Callable[[], float]) -> None:
        """Measure the offset: ``read_server()`` returns the server's time (one round trip)."""
        best: tuple[float, float] | None = None  # (round trip, offset)
        for _ in range(SAMPLES):
            before = time.monotonic()
            server = read_server()
            after = time.monotonic()
            # The server read its clock somewhere within the round trip: the middle is the best guess.
            sample = (after - before, server - (before + after) / 2)
            if best is None or sample[0] < best[0]:
                best = sample
        assert best is not None
        with self._lock:
            self._offset = best[1]
            self._error = best[0] / 2
            self._synced = time.monotonic()
