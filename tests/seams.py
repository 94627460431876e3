"""Where tests reach into an executor: its scheduler, whose public seams they drive.

The scheduler offers ``hold_writes()`` (queued submits stay queued until the
block ends), ``pace`` (run-time and transaction-time averages a test can pin:
``pin_pace``)
and ``is_alive()`` / ``join()`` (its thread); ``slow_lease_renewal`` and
``slow_ticks`` slow one step of its tick. This is the one place that
knows where an executor keeps it.
"""

from __future__ import annotations

import time

from dbexecutor import DBExecutor
from dbexecutor.scheduler import Scheduler


def scheduler_of(ex: DBExecutor) -> Scheduler:
    """The scheduler behind ``ex``."""
    return ex._scheduler


def pin_pace(ex: DBExecutor, **fields: float) -> None:
    """Pin fields of ``ex``'s scheduler's :class:`~dbexecutor.pace.Pace` (``tick_cost=30.0``: as if a transaction took 30 s)."""
    pace = scheduler_of(ex).pace
    for name, value in fields.items():
        assert hasattr(pace, name), name
        setattr(pace, name, value)


def slow_lease_renewal(ex: DBExecutor, seconds: float) -> None:
    """From now on, a lease renewal that a job's first beat asked for first sleeps ``seconds``.

    That renewal reads the children's pipes (a beat that arrived during the
    tick counts): slowed down, it is the one that reads a short job's result.
    """
    scheduler = scheduler_of(ex)
    upkeep, supervisor = scheduler._upkeep, scheduler._supervisor
    real = upkeep.renew_leases

    def slowed() -> None:
        if supervisor.new_starts:
            time.sleep(seconds)
        real()

    upkeep.renew_leases = slowed  # type: ignore[method-assign]


def slow_ticks(ex: DBExecutor, seconds: float) -> None:
    """From now on, each tick sleeps ``seconds`` before its write (holding nothing, the writer free).

    A submitting thread writes its own backlog only when it finds the writer
    free; on a fast machine the loop's back-to-back ticks could take every
    job before a backlog formed. A tick that slept after its write was not
    enough: started on the first two submits, its write waited for the GIL
    that the submit loop kept (about 5 ms a hand-over), held the writer
    while all 300 went in (13 ms), and the submitting thread never found it
    free (1 run in 12 on PostgreSQL). Asleep before it takes anything, the
    loop leaves every submit loop its window first.
    """
    commit = scheduler_of(ex)._commit
    real = commit.write_and_claim

    def slowed() -> None:
        time.sleep(seconds)
        real()

    commit.write_and_claim = slowed  # type: ignore[method-assign]
