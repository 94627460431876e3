"""Which machine and process this is, and whether a process on this machine still exists.

An executor registers as ``host:pid:token``. On the machine it ran on, "is it
alive?" has an exact answer: its process exists, and it is the same process
(started at the recorded time, not a later one that reuses the pid). That
answer is what lets other executors rescue a killed executor's jobs at once
rather than after its lease runs out.
"""

from __future__ import annotations

import os
import socket
import uuid

import psutil

__all__ = ["hostname", "process_started", "process_alive", "owner_name"]

_HOST = socket.gethostname()
# Two readings of one process's start time may differ by rounding.
_START_TOLERANCE = 1.0


def hostname() -> str:
    """This machine's name, as registrations record it."""
    return _HOST


def process_started(pid: int | None = None) -> float | None:
    """When process ``pid`` (default: this one) started, as psutil reports it; None if it is gone."""
    try:
        return float(psutil.Process(pid if pid is not None else os.getpid()).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_alive(pid: int, started: float | None) -> bool:
    """Whether process ``pid`` exists on this machine and is the one that started at ``started``."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        found = proc.create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # another user's process: it exists, and we cannot tell more
    return started is None or abs(found - started) <= _START_TOLERANCE


def owner_name(pid: int | None = None) -> str:
    """A name no other process will have: ``host:pid:token``."""
    return f"{_HOST}:{pid if pid is not None else os.getpid()}:{uuid.uuid4().hex[:6]}"
