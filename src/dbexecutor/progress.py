"""Progress from inside a job: ``dbexecutor.report_progress(fraction, message)``.

::

    job (in a child) ── report_progress ──► the child's heartbeat ──Progress──► its owner
                                             (the latest value, at most         (writes the latest per
                                              a few messages a second)           job with its next lease
                                                                                 renewal)

The value shows in ``dbexecutor status``/``show``, the web UI and
``JobFuture.progress`` within about one heartbeat interval. No database
code here: a child never imports SQLAlchemy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["report_progress", "install", "MESSAGE_WIDTH"]

#: Characters of a message that are kept.
MESSAGE_WIDTH = 255

_reporter: Callable[[float | None, str | None], None] | None = None


def install(reporter: Callable[[float | None, str | None], None] | None) -> None:
    """Where :func:`report_progress` sends its values in this process (a child installs its heartbeat)."""
    global _reporter
    _reporter = reporter


def report_progress(fraction: float | None = None, message: str | None = None) -> bool:
    """Tell the job's owner how far the running job has got: ``fraction`` from 0 to 1, and/or a short ``message``.

    Call it as often as you like: only the latest value is kept, and the
    owner writes it to the job's row with its next lease renewal. Returns
    False (and does nothing) outside a job run by dbexecutor, so a job
    function can also be called directly.
    """
    if fraction is not None:
        fraction = float(fraction)
        if math.isnan(fraction) or not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress is a fraction from 0 to 1, not {fraction!r}")
    if message is not None:
        message = " ".join(str(message).split())[:MESSAGE_WIDTH]
    if fraction is None and message is None:
        raise ValueError("report a fraction, a message, or both")
    reporter = _reporter
    if reporter is None:
        return False
    reporter(fraction, message)
    return True
