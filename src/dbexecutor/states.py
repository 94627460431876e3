"""A job's states and the default group: plain names, importable anywhere (no database code).

::

    waiting ──► ready ──► leased ──► running ──► done | failed | cancelled
       (an upstream      (claimed)   (its child has been
        is unfinished)                running it a moment)
"""

from __future__ import annotations

__all__ = [
    "WAITING", "READY", "LEASED", "RUNNING", "DONE", "FAILED", "CANCELLED",
    "ACTIVE_STATES", "FINAL_STATES", "PENDING_STATES", "ALL_STATES", "DEFAULT_GROUP", "DEFAULT_QUEUE",
]

WAITING = "waiting"  # some upstream job is not done yet
READY = "ready"  # runnable once run_after has passed
LEASED = "leased"  # claimed by an executor; a child is about to run it
RUNNING = "running"  # a child has been running it for a moment
DONE = "done"
FAILED = "failed"
CANCELLED = "cancelled"

ACTIVE_STATES = (LEASED, RUNNING)
FINAL_STATES = (DONE, FAILED, CANCELLED)
PENDING_STATES = (WAITING, READY)
ALL_STATES = (WAITING, READY, LEASED, RUNNING, DONE, FAILED, CANCELLED)

#: The group of jobs submitted without one.
DEFAULT_GROUP = "default"
#: The queue of rows written before queues existed, and of programs that have no name of their own.
DEFAULT_QUEUE = "default"
