"""Job functions for the tests of the operators' view (issue 19): importable by name from the children."""

from __future__ import annotations

import os
import time

import dbexecutor


def progress_then_wait(gate: str, fraction: float, message: str, timeout: float = 60.0) -> bool:
    """Report ``fraction`` and ``message``, then wait for ``gate`` to exist; returns what report_progress returned."""
    sent = dbexecutor.report_progress(fraction, message)
    end = time.monotonic() + timeout
    while not os.path.exists(gate):
        if time.monotonic() > end:
            raise TimeoutError(gate)
        time.sleep(0.02)
    return sent


def progress_steps(n: int) -> int:
    """Report progress ``n`` times in a tight loop (only the latest crosses the pipe, a few times a second)."""
    for i in range(n):
        dbexecutor.report_progress((i + 1) / n, f"step {i + 1} of {n}")
    return n


def not_importable_here() -> None:
    """Stands in for a function the workers cannot import (the test rewrites its module's name)."""
