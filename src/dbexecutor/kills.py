"""Children's process trees killed beside the scheduler's loop, and what they hold meanwhile.

::

    Supervisor ── kill(child, job, report) ──► thread: terminate the tree, wait, kill
                                                  └─► report() once the tree is gone, then wake the loop
               ── void(child) ────────────────► thread: the same, nothing to report
                                                  (its lease never committed), then wake the loop

Terminating a tree waits up to a grace period, so each kill runs in a thread
of its own while the loop goes on dispatching. Until its tree is gone, a job
killed for a timeout or a stop request is still held here: its lease is
renewed (no other executor may rerun it while it could still write) and the
loop does not end. Its report is handed over and the kill forgotten in one
step, under this object's lock, so that the job is always either held here or
reported, never neither.

No database access here, and no decision: the supervisor says whom to kill.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from .pool import Assignment, Child, kill_trees
from .records import Report

__all__ = ["Kills"]

log = logging.getLogger("dbexecutor")


class Kills:
    """The kills in flight of one executor's children, each in a thread of its own."""

    def __init__(self, grace: float, wake: Callable[[], None], report: Callable[[Report], None]) -> None:
        self._grace = grace  # seconds between terminate and kill
        self._wake = wake  # ends the loop's wait: a kill finished
        self._report = report  # where a killed job's report goes (the supervisor's reports)
        self._lock = threading.Lock()
        self._reporting: dict[Child, Assignment] = {}  # killed for their running job: reported once gone
        self._voiding: set[Child] = set()  # running an attempt whose lease never committed: nothing to report

    def kill(self, c: Child, head: Assignment, report: Callable[[], Report]) -> None:
        """Kill ``c``'s process tree beside the loop, then hand over ``report()`` for its job ``head``.

        ``report`` is called once the tree is gone (its end time is then).
        """
        with self._lock:
            self._reporting[c] = head
        threading.Thread(target=self._kill, args=(c, report), name="dbexecutor-kill", daemon=True).start()

    def void(self, c: Child) -> None:
        """Kill ``c``'s process tree beside the loop, reporting nothing (the attempt it runs never existed)."""
        with self._lock:
            self._voiding.add(c)
        threading.Thread(target=self._kill_voided, args=(c,), name="dbexecutor-kill", daemon=True).start()

    def in_flight(self) -> bool:
        """Whether any kill has not finished."""
        with self._lock:
            return bool(self._reporting or self._voiding)

    def holds_jobs(self) -> bool:
        """Whether a job killed for its timeout or a stop request is not reported yet (its lease still needs renewing)."""
        with self._lock:
            return bool(self._reporting)

    def leases(self) -> list[tuple[int, int]]:
        """The ``(job, attempt)`` leases of the jobs being killed and not reported yet."""
        with self._lock:
            return [a.lease for a in self._reporting.values()]

    def wait(self) -> None:
        """Until every kill in flight has finished."""
        while self.in_flight():
            time.sleep(0.01)

    def _kill(self, c: Child, report: Callable[[], Report]) -> None:
        try:
            kill_trees([c.pid], self._grace)
        except Exception:  # never leave the job unreported
            log.exception("could not kill child %d", c.pid)
        finally:
            c.close()
            with self._lock:
                self._report(report())
                del self._reporting[c]
            self._wake()

    def _kill_voided(self, c: Child) -> None:
        try:
            kill_trees([c.pid], self._grace)
        except Exception:
            log.exception("could not kill child %d", c.pid)
        finally:
            c.close()
            with self._lock:
                self._voiding.discard(c)
            self._wake()
