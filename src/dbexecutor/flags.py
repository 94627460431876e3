"""The state of one executor's scheduler: shutting down, broken, abandoning its jobs.

One object with one lock, as loky's ``_ExecutorFlags``: a submit is admitted
and the loop decides to end under the same lock, so a job can never slip into
the queue after the loop has looked at it for the last time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager

__all__ = ["ExecutorFlags"]


class ExecutorFlags:
    """Shutdown and broken flags of one scheduler (read them freely; change them through the methods)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        #: No new work is taken; the loop ends once this process's jobs are finished.
        self.shutdown = False
        #: Why the executor is broken (an initializer failed, the loop crashed); None if it is not.
        self.broken: str | None = None
        #: ``stop_now()``: kill the children and give their jobs back instead of waiting for them.
        self.abandon = False
        #: A submit-only executor told not to wait: the loop ends once its submits are written;
        #: the jobs carry on elsewhere, and this process's futures end with it.
        self.detached = False
        self._admitting = _Admitting(self)

    def request_shutdown(self, *, detach: bool = False) -> None:
        """Stop taking new work; ``detach``: do not wait for this process's futures (a submit-only executor)."""
        with self._lock:
            self.shutdown = True
            self.detached = self.detached or detach

    def stop_now(self) -> None:
        """Stop taking new work and give back what the children hold."""
        with self._lock:
            self.shutdown = True
            self.abandon = True

    def set_broken(self, reason: str) -> None:
        """The executor cannot run jobs any more (the first reason sticks)."""
        with self._lock:
            if self.broken is None:
                self.broken = reason

    def admitting(self) -> _Admitting:
        """Hold while adding work: raises if the executor no longer takes it, and no shutdown lands meanwhile."""
        return self._admitting

    @contextmanager
    def deciding(self) -> Iterator[None]:
        """Hold while deciding from the flags and the queue (whether the loop may end)."""
        with self._lock:
            yield


class _Admitting:
    """``ExecutorFlags.admitting()``: every submit enters it, so it is a plain object, not a generator.

    It keeps no state of its own (the lock is re-entrant), so one serves every thread.
    """

    __slots__ = ("_flags",)

    def __init__(self, flags: ExecutorFlags) -> None:
        self._flags = flags

    def __enter__(self) -> None:
        flags = self._flags
        flags._lock.acquire()
        if flags.broken is not None or flags.shutdown:
            flags._lock.release()
            if flags.broken is not None:
                raise BrokenProcessPool(flags.broken)
            raise RuntimeError("cannot schedule new futures after shutdown")

    def __exit__(self, *exc: object) -> None:
        self._flags._lock.release()
