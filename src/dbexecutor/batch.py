"""``Batch``: jobs submitted as one unit, with a future of their own.

Apart from the executor because a batch has a life of its own (unsealed,
sealed, cancelled before it formed) that none of the executor's other
operations share; it submits its children and stores its own row through
the executor, as ``submit`` and ``map`` do.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from .calls import prepare
from .future import JobFuture
from .options import JobOptions
from .records import NewJob
from .submitting import SubmitsJobs

if TYPE_CHECKING:  # the executor imports this module
    from .executor import DBExecutor

__all__ = ["Batch"]

T = TypeVar("T")

_MAP_BATCH = 500  # rows per insert transaction in Batch.map()


class Batch(SubmitsJobs, JobFuture[list[Any]]):
    """A set of jobs submitted as one unit, with a future of its own.

    Use it as a context manager; leaving the block seals it::

        with ex.batch() as batch:
            for path in paths:
                batch.submit(load, path)
        ex.submit(report, after=[batch])   # runs when every child is done
        batch.result()                     # the children's results, in submission order

    The children run as ordinary jobs as soon as they are submitted; the
    batch itself never runs. It is done when its last child is done, and fails
    as soon as a child fails, with that child's exception (the other children
    go on; :attr:`children` shows their states). Cancelling the batch cancels
    the children that have not started. Sealing stores the batch row; until
    then it has no ``job_id`` and cannot be a dependency.
    """

    def __init__(self, executor: DBExecutor, options: JobOptions) -> None:
        super().__init__(None, executor._scheduler, executor._store.identity)  # type: ignore[arg-type]
        self._executor = executor
        self._options = options
        #: The children's futures, in submission order.
        self.children: list[JobFuture[Any]] = []
        self._sealed = False

    def __repr__(self) -> str:
        sealed = "" if self._sealed else " unsealed"
        return f"<Batch job_id={self.job_id}{sealed} children={len(self.children)} state={self._state.lower()}>"

    def _check_unsealed(self) -> None:
        if self._sealed:
            raise RuntimeError("this batch is sealed; start a new one to submit more jobs")

    def _submit_call(
        self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], after: Iterable[Future[Any]]
    ) -> JobFuture[T]:
        # A child: a call that cannot be pickled raises here, not in its future.
        self._check_unsealed()
        fut = self._executor._submit(fn, args, kwargs, after, self._options)
        if fut.job_id is None:  # not stored: a batch holds only stored jobs
            fut.result()
        self._add([fut])
        return fut

    def map(self, fn: Callable[..., T], *iterables: Iterable[Any]) -> list[JobFuture[T]]:
        """Submit one child per item (as :meth:`DBExecutor.map` with chunksize 1); their futures, in order."""
        self._check_unsealed()
        ex = self._executor
        ex._check_open()
        now = ex._store.now()
        futures: list[JobFuture[Any]] = []
        calls = (prepare(ex, fn, args, {}, (), self._options, now) for args in zip(*iterables))
        while chunk := list(itertools.islice(calls, _MAP_BATCH)):
            for call in chunk:
                if isinstance(call, JobFuture):
                    call.result()  # raises the pickling error
            futures += ex._submit_many(chunk, now, self._options.connection)
        self._add(futures)
        return futures

    def _add(self, futures: list[JobFuture[Any]]) -> None:
        known = {f.job_id for f in self.children}
        for fut in futures:
            if fut.job_id in known:
                raise ValueError(f"job {fut.job_id} is already in this batch (a key submitted twice?)")
            known.add(fut.job_id)
        self.children += futures

    def seal(self) -> Batch:
        """Store the batch; from now on it resolves from its row and can be a dependency. Returns itself."""
        self._check_unsealed()
        self._write()
        self._sealed = True
        return self

    def _write(self) -> None:
        """Store the batch row: it waits for every child, and this future resolves from it."""
        ex = self._executor
        ex._check_open()
        now = ex._store.now()
        job = NewJob(
            fn_name="dbexecutor.batch",
            payload=b"",
            deps=tuple(f.job_id for f in self.children),
            group=self._options.group,
            submitted_by=ex._submitter_id,
            batch=True,
        )
        if self._options.connection is not None:
            ex._write_in(self._options.connection, [job], futures=[self])
        else:
            ex._scheduler.write([job], now, futures=[self])

    def cancel(self) -> bool:
        """Cancel the batch and its children that have not started."""
        if not self._sealed:
            for child in self.children:
                child.cancel()
            self._sealed = True
            self._cancel_local()  # never stored: nothing in the database to cancel
            return True
        return super().cancel()

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._sealed:
            return
        if exc_type is None:
            self.seal()
        else:  # the block failed: the batch never forms, its children do not run
            self.cancel()
