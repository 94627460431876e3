"""Where tests reach into an executor: its scheduler, whose public seams they drive.

The scheduler offers ``hold_writes()`` (queued submits stay queued until the
block ends), ``pace`` (run-time and transaction-time averages a test can pin)
and ``is_alive()`` / ``join()`` (its thread). This is the one place that
knows where an executor keeps it.
"""

from __future__ import annotations

from dbexecutor import DBExecutor
from dbexecutor.scheduler import Scheduler


def scheduler_of(ex: DBExecutor) -> Scheduler:
    """The scheduler behind ``ex``."""
    return ex._scheduler
