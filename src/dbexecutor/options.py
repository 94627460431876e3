"""Per-job options: :class:`JobOptions`, and the checks an option's value goes through.

Apart from the executor because they are plain values: a ``Submitter``, a
``Batch`` and the executor's own defaults all carry a ``JobOptions``, and
none of this needs a database (no SQLAlchemy import here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .durations import Duration, seconds
from .queues import check_name
from .states import DEFAULT_GROUP

__all__ = ["JobOptions", "with_options", "required_seconds"]


def required_seconds(value: Duration, name: str) -> float:
    """A duration option that may not be None, in seconds (ranges are the caller's to check)."""
    found = seconds(value, name)
    if found is None:
        raise TypeError(f"{name} must be a duration (seconds, a timedelta or e.g. '30s'), not None")
    return found


@dataclass(frozen=True)
class JobOptions:
    """Per-job options, stored on the row; :meth:`DBExecutor.options` takes the same names.

    ``key``: unique per database; submitting an existing key returns that job's
    future instead of a new job. ``group``: the fair-share group (see
    :meth:`DBExecutor.configure_group`); ``weight``: sets that group's weight
    (``None``: leave it as configured). ``priority``: higher runs first within
    its group. ``timeout``: seconds per attempt before the child's process
    tree is killed (``None``: the executor default). ``retries``: further
    attempts after a failure; ``retry_delay``: seconds before the first retry
    (doubled for each further one, with jitter). ``delay`` or ``run_after``
    (epoch seconds): not ready before then.

    ``timeout``, ``retry_delay`` and ``delay`` take a number of seconds, a
    ``timedelta`` or a duration string such as ``"90s"``, ``"30m"`` or
    ``"1h30m"``; they are stored as seconds (floats).

    ``connection``: a SQLAlchemy ``Connection`` or ORM ``Session`` on the
    executor's database: the jobs are written through it, inside its open
    transaction, and exist only if it commits (README, "Submitting inside
    your transaction"). Not stored.
    """

    key: str | None = None
    group: str = DEFAULT_GROUP
    queue: str | None = None
    weight: int | None = None
    priority: int = 0
    timeout: float | None = None
    retries: int | None = None
    delay: float | None = None
    run_after: float | None = None
    retry_delay: float | None = None
    connection: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in _DURATIONS:
            # Frozen: normalizing "30m" or a timedelta to seconds goes around __setattr__.
            object.__setattr__(self, name, seconds(getattr(self, name), name))
        if self.key is not None and (not isinstance(self.key, str) or not 0 < len(self.key) <= 255):
            raise ValueError("key must be a non-empty string of at most 255 characters")
        if not isinstance(self.group, str) or not 0 < len(self.group) <= 255:
            raise ValueError("group must be a non-empty string of at most 255 characters")
        if self.queue is not None:
            check_name(self.queue)
        if self.weight is not None and (not isinstance(self.weight, int) or self.weight < 1):
            raise ValueError("weight must be an integer >= 1")
        if not isinstance(self.priority, int):
            raise ValueError("priority must be an integer")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError("timeout must be > 0 seconds (or None for no limit)")
        if self.retries is not None and (not isinstance(self.retries, int) or self.retries < 0):
            raise ValueError("retries must be an integer >= 0")
        if self.retry_delay is not None and not (self.retry_delay >= 0 and math.isfinite(self.retry_delay)):
            raise ValueError("retry_delay must be a finite number of seconds >= 0")
        if self.delay is not None and not (self.delay >= 0 and math.isfinite(self.delay)):
            raise ValueError("delay must be a finite number of seconds >= 0")
        if self.delay is not None and self.run_after is not None:
            raise ValueError("give delay or run_after, not both")


#: The options that are durations (seconds, a timedelta or "1h30m").
_DURATIONS = ("timeout", "retry_delay", "delay")
#: Every option name, in the order the error for an unknown name lists them.
_OPTION_NAMES = tuple(f.name for f in fields(JobOptions))


def with_options(base: JobOptions, options: dict[str, Any]) -> JobOptions:
    """``base`` with ``options`` over it; a ``TypeError`` that lists the valid names for an unknown one."""
    unknown = [name for name in options if name not in _OPTION_NAMES]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise TypeError(
            f"unknown job option{plural} {', '.join(map(repr, unknown))}; "
            f"the options are {', '.join(_OPTION_NAMES)}"
        )
    return replace(base, **options)
