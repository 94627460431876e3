"""This process's futures, by job id: tracked when their rows are written, resolved from final rows.

::

    write rows ──► track(id) ──► futures[id] ◄── resolve(final) ◄── the loop's commits,
                        │                                          polls, notifications
                        └──► outstanding (what shutdown(wait=True) waits for)

A future is held weakly: a caller that drops it lets it go, while the job
goes on. The rows are the truth; this is a cache of who is waiting for which.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from . import schema, serialization
from .errors import PayloadRejected
from .future import JobControl, JobFuture
from .records import Final, Submitted

__all__ = ["Registry"]

log = logging.getLogger("dbexecutor")


class Registry:
    """The futures of one executor's jobs, and which of them are still outstanding."""

    def __init__(self, control: JobControl, identity: Any, signer: serialization.Signer) -> None:
        self._control = control
        self._identity = identity
        self._signer = signer
        self._lock = threading.RLock()
        self._futures: weakref.WeakValueDictionary[int, JobFuture[Any]] = weakref.WeakValueDictionary()
        self._outstanding: set[int] = set()
        self._poll_cursor = -1
        self._poll_all = False  # a notification asked for a full poll of our futures
        self._finished_elsewhere: set[int] = set()  # ... or for these jobs
        # Writes in progress (write_and_track), and the final rows resolve() met meanwhile
        # for jobs it does not track: one of them may be a row such a write is about to track.
        self._writing = 0
        self._early: dict[int, Final] = {}

    def new_future(self, flusher: Callable[[], None] | None = None) -> JobFuture[Any]:
        """A future for a job not written yet: ``flusher`` writes it when someone needs its id."""
        return JobFuture(None, self._control, self._identity, flusher=flusher)  # type: ignore[arg-type]

    # -- tracking --------------------------------------------------------------------

    def track(self, job_id: int, outstanding: bool = True, future: JobFuture[Any] | None = None) -> JobFuture[Any]:
        """The future of ``job_id`` (one per job per process), resolved when the job ends."""
        with self._lock:
            fut = self._futures.get(job_id)
            if fut is None:
                fut = future if future is not None else JobFuture(job_id, self._control, self._identity)
                self._futures[job_id] = fut
            if outstanding:
                self._outstanding.add(job_id)
            return fut

    def adopt(
        self, rows: Sequence[Submitted], futures: Sequence[JobFuture[Any] | None] | None = None
    ) -> list[JobFuture[Any]]:
        """Track written rows: give ``futures`` (if given, one per row) their ids; the futures, in order."""
        given = futures if futures is not None else [None] * len(rows)
        out: list[JobFuture[Any]] = []
        with self._lock:
            for row, fut in zip(rows, given):
                if fut is not None:
                    fut.job_id = row.job_id
                    fut._control = self._control  # submitted in a caller's transaction: controllable from now on
                out.append(self.track(row.job_id, outstanding=row.state not in schema.FINAL_STATES, future=fut))
        return out

    def write_and_track(
        self, write: Callable[[], Sequence[Submitted]], futures: Sequence[JobFuture[Any] | None] | None = None
    ) -> tuple[Sequence[Submitted], list[JobFuture[Any]]]:
        """Run ``write`` (an insert) and track its rows; a row resolved in between is resolved once tracked.

        The loop may claim and finish a job the moment its row is committed,
        before this thread tracks it: :meth:`resolve` keeps what it finds for
        jobs it does not track while a write is in progress, and the rows
        this write tracks take theirs from there.
        """
        with self._lock:
            self._writing += 1
        try:
            rows = write()
            # The lock is not held across the write: the loop resolving other
            # jobs meanwhile would wait for this insert's round trip and commit.
            with self._lock:
                futures_out = self.adopt(rows, futures)
                early = [self._early.pop(row.job_id) for row in rows if row.job_id in self._early]
        finally:
            with self._lock:
                self._writing -= 1
                if not self._writing:
                    self._early.clear()  # other processes' jobs, finished while these rows were written
        for final in early:
            self.resolve(final)
        return rows, futures_out

    def mark_running(self, job_id: int) -> None:
        """The job was handed to a child: its future says running (``cancel()`` returns False)."""
        with self._lock:
            fut = self._futures.get(job_id)
        if fut is not None and not fut.running():
            try:
                fut.set_running_or_notify_cancel()
            except RuntimeError:
                pass  # already resolved by another path; the row decides

    # -- resolving -----------------------------------------------------------------

    def resolve(self, final: Final) -> None:
        """Apply a final row to this process's future of that job, if it has one."""
        with self._lock:
            fut = self._futures.pop(final.job_id, None)
            self._outstanding.discard(final.job_id)
            if fut is None and self._writing:
                self._early[final.job_id] = final  # perhaps a row being written and not tracked yet
        if fut is None:
            return
        try:
            blob = final.result
            if blob is not None and final.state in (schema.DONE, schema.FAILED):
                # Checked before the future unpickles it: a tampered result never loads.
                blob = self._signer.open(
                    blob, serialization.blob_context(final.job_id, final.state), f"the result of job {final.job_id}"
                )
            fut._apply(final.state, blob)
        except PayloadRejected as rejected:
            log.error("job %d: %s", final.job_id, rejected)
            fut._set_exception_quietly(rejected)
        except Exception:  # never let one future take the loop down
            log.exception("could not resolve the future of job %d", final.job_id)

    def settle(self, rows: Sequence[Submitted]) -> None:
        """Resolve the futures of rows that were final on arrival (a failed or cancelled upstream, a done key)."""
        for row in rows:
            if row.state in schema.FINAL_STATES:
                self.resolve(Final(row.job_id, row.state, row.result))

    def fail_all(self, error: BaseException) -> None:
        """Fail every tracked future (the executor broke; the rows stay for other executors)."""
        with self._lock:
            futures = [self._futures.pop(i, None) for i in list(self._futures.keys())]
            self._outstanding.clear()
        for fut in futures:
            if fut is not None:
                fut._set_exception_quietly(error)

    # -- what is still open ----------------------------------------------------------

    def has_outstanding(self) -> bool:
        """Whether a job of this process is unfinished (shutdown(wait=True) waits for it)."""
        with self._lock:
            return bool(self._outstanding)

    def outstanding(self) -> list[int]:
        """Ids of this process's unfinished jobs, in order."""
        with self._lock:
            return sorted(self._outstanding)

    def poll_batch(self, limit: int) -> list[int]:
        """The next ``limit`` ids to ask the database about, round robin over every watched job."""
        # Jobs held by our own children are polled too: if a child froze and lost its
        # lease, another process may finish the job, and the future must follow the row.
        with self._lock:
            watched = self._outstanding | set(self._futures.keys())
        if not watched:
            return []
        ids = sorted(i for i in watched if i > self._poll_cursor)[:limit]
        if len(ids) < limit:
            ids += sorted(watched)[: limit - len(ids)]
            self._poll_cursor = -1
        else:
            self._poll_cursor = ids[-1]
        return sorted(set(ids))

    def finished_elsewhere(self, ids: Sequence[int] | None) -> bool:
        """Another process says these jobs finished (None: it may have finished any); True if one is ours."""
        if ids is None:
            self._poll_all = True
            return True
        with self._lock:
            mine = set(ids) & (self._outstanding | set(self._futures.keys()))
            self._finished_elsewhere |= mine
        return bool(mine)

    def take_full_poll(self) -> bool:
        """Whether a notification asked for a look at every watched job since the last call."""
        wanted, self._poll_all = self._poll_all, False
        return wanted

    def take_finished_elsewhere(self) -> list[int]:
        """The ids notifications named since the last call."""
        with self._lock:
            ids, self._finished_elsewhere = sorted(self._finished_elsewhere), set()
        return ids
