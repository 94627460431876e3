"""``JobFuture``: a ``concurrent.futures.Future`` that knows its job row.

No database imports here: cancelling, terminating and reading progress go
through the :class:`JobControl` the executor provides (its scheduler), and
resolving from a stored row goes through :meth:`JobFuture._apply`.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING, RUNNING
from typing import Any, Callable, Generic, Protocol, TypeVar

from . import schema, serialization
from .readmodels import JobProgress

__all__ = ["JobFuture", "JobControl"]

T = TypeVar("T")


class _Condition(threading.Condition):
    """A future's condition: ``threading.Condition`` over a plain lock, with no bound methods of its own.

    The standard ``Future`` makes a ``Condition`` over an ``RLock``, and the
    ``Condition`` keeps five of the lock's bound methods as attributes: with
    the lock, seven objects the garbage collector tracks, of the eleven a
    future holds. A program that keeps 10,000 futures (a ``wait`` on all it
    submitted) makes every full collection walk them; one-by-one submits
    spent 10-20% of their time in the collector. Here ``acquire`` and
    ``release`` are methods of the class, and ``Condition``'s own fallbacks
    for a plain lock serve ``wait``. A future's lock is never taken twice by
    one thread (``Future`` and ``wait``/``as_completed`` take each once), so
    it need not be re-entrant. The queue of waiting threads (a ``deque``,
    760 bytes) is made by the first ``wait``: a future that is never waited
    on through its own condition (``concurrent.futures.wait`` and
    ``as_completed`` use the future's list) never has one; ``notify`` reads
    the empty tuple as no one waiting.
    """

    def __init__(self) -> None:  # not Condition.__init__: it would bind the lock's methods
        self._lock = threading.Lock()
        self._waiters: deque[Any] | tuple[()] = ()

    def wait(self, timeout: float | None = None) -> bool:
        """As ``Condition.wait`` (the caller holds the lock, so the queue is made once)."""
        if type(self._waiters) is tuple:
            self._waiters = deque()
        return super().wait(timeout)

    def _at_fork_reinit(self) -> None:
        self._lock._at_fork_reinit()  # type: ignore[attr-defined]
        self._waiters = ()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock (as ``Lock.acquire``)."""
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        """Give the lock back."""
        self._lock.release()


class JobControl(Protocol):
    """What a future asks of the executor that made it (implemented by its scheduler)."""

    def cancel_job(self, job_id: int) -> bool:
        """Cancel the job if it has not started (and its dependents); True if it was cancelled."""

    def terminate_job(self, job_id: int) -> bool:
        """Stop the job wherever it runs, or cancel it if it has not started; False if it had finished."""

    def job_progress(self, job_id: int) -> JobProgress | None:
        """What the job last reported about its progress."""


class JobFuture(Future[T], Generic[T]):
    """The future of one job row; ``job_id`` is the row's id.

    Generic in the job's return type: ``ex.submit(fn, ...)`` is a
    ``JobFuture[R]`` when ``fn`` returns ``R``, and ``result()`` an ``R``.

    It behaves like any ``Future`` (``result``, ``exception``, callbacks,
    ``wait``, ``as_completed``). ``cancel()`` cancels the job in the database,
    so no executor anywhere runs it later; it returns False once the job has
    been claimed or has finished.
    """

    def __init__(
        self,
        job_id: int,
        control: JobControl | None = None,
        identity: Any = None,
        flusher: Callable[[], None] | None = None,
    ) -> None:
        # Future.__init__'s fields (the same in Python 3.10 to 3.13; a test compares
        # them with a fresh Future's), with the lighter condition.
        self._condition = _Condition()
        self._state = PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Callable[[Future[T]], object]] = []
        self._job_id: int | None = job_id
        # Given while the job waits to be written with the next commit of
        # submits: reading ``job_id`` then writes it first.
        self._flusher = flusher
        self._control = control
        # Which database and prefix the job lives in: a future is a valid
        # dependency only for executors on the same tables.
        self._identity = identity

    @property
    def job_id(self) -> int:
        """The id of the job's row in the ``jobs`` table.

        A job submitted a moment ago may not be written yet (submits are
        committed in groups); reading its id writes it first. ``None`` for a
        call that was never stored (it could not be pickled).
        """
        while self._job_id is None and self._flusher is not None:
            self._flusher()
        return self._job_id  # type: ignore[return-value]

    @job_id.setter
    def job_id(self, value: int) -> None:
        self._job_id = value
        self._flusher = None

    def awaits(self, flusher: Callable[[], None]) -> bool:
        """Whether the job is still waiting for ``flusher`` (its executor's submit queue) to write it."""
        pending = self._flusher
        return self._job_id is None and pending is not None and pending == flusher

    @property
    def stored(self) -> bool:
        """True once the job's row is committed (``submit`` may return a moment before)."""
        return self._job_id is not None

    def __repr__(self) -> str:
        with self._condition:
            state = self._state.lower()
            if self._state == FINISHED:
                if self._exception is not None:
                    return f"<JobFuture job_id={self._job_id} state={state} raised {type(self._exception).__name__}>"
                return f"<JobFuture job_id={self._job_id} state={state} returned {type(self._result).__name__}>"
            return f"<JobFuture job_id={self._job_id} state={state}>"

    def cancel(self) -> bool:
        """Cancel the job if it has not started; True if it is (now) cancelled."""
        with self._condition:
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                return True
            if self._state in (RUNNING, FINISHED):
                return False
        if self._control is None:
            return super().cancel()
        # The database decides: the executor resolves this future (and its
        # dependents' futures) as cancelled when the conditional update wins.
        self._control.cancel_job(self.job_id)
        return self.cancelled()

    def terminate(self) -> bool:
        """Stop the job wherever it runs: its owner kills its process tree at its next beat.

        The job ends ``cancelled`` (an attempt row says ``terminated``) and
        its dependents are cancelled; this future then raises
        ``CancelledError`` (as a running future it cannot say ``cancelled()``).
        A job that has not started is simply cancelled. Returns False if the
        job had finished already; otherwise it returns at once, without
        waiting for the kill (wait on the future for that).
        """
        if self.done():
            return False
        if self._control is None:
            return super().cancel()
        return self._control.terminate_job(self.job_id)

    @property
    def progress(self) -> JobProgress | None:
        """What the job last reported with ``dbexecutor.report_progress`` (read from its row: one query)."""
        if self._control is None or self._job_id is None:
            return None
        return self._control.job_progress(self._job_id)

    def _cancel_local(self) -> None:
        """Mark cancelled after the database said so; a running future gets ``CancelledError``."""
        self._never_stored()
        with self._condition:
            state = self._state
        if state == PENDING:
            Future.cancel(self)
            state = CANCELLED
        if state == CANCELLED:
            # Move to CANCELLED_AND_NOTIFIED so wait() and as_completed() count it as done.
            try:
                self.set_running_or_notify_cancel()
            except RuntimeError:
                pass  # notified meanwhile by another thread
        elif state == RUNNING:
            self._set_exception_quietly(CancelledError(f"job {self._job_id} was cancelled"))

    def _set_result_quietly(self, value: Any) -> None:
        try:
            self.set_result(value)
        except InvalidStateError:
            pass  # cancelled or resolved by another path first; the row is the truth either way

    def _set_exception_quietly(self, error: BaseException) -> None:
        self._never_stored()
        try:
            self.set_exception(error)
        except InvalidStateError:
            pass

    def _never_stored(self) -> None:
        # Resolved before its row was written (refused, dropped at shutdown):
        # it never will be, so reading job_id must not try to write it.
        if self._job_id is None:
            self._flusher = None

    def _apply(self, state: str, blob: bytes | None) -> None:
        """Resolve from a final row: ``done`` with its result, ``failed`` with its exception."""
        if state == schema.DONE:
            try:
                value = serialization.loads(blob) if blob is not None else None
            except Exception as error:  # the result's class is not importable in this process
                self._set_exception_quietly(error)
            else:
                self._set_result_quietly(value)
        elif state == schema.FAILED:
            self._set_exception_quietly(
                serialization.load_exception(blob) if blob else RuntimeError(f"job {self._job_id} failed")
            )
        elif state == schema.CANCELLED:
            self._cancel_local()
