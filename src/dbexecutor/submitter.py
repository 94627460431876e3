"""``Submitter``: an executor's ``submit``, ``map`` and ``batch`` with per-job options.

Apart from the executor because it holds nothing but an executor and a
:class:`~dbexecutor.options.JobOptions`; everything it does, the executor
(or :mod:`dbexecutor.mapping`, or a :class:`~dbexecutor.batch.Batch`) does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from .batch import Batch
from .future import JobFuture
from .mapping import submit_map
from .options import JobOptions, with_options
from .submitting import SubmitsJobs

if TYPE_CHECKING:  # the executor imports this module
    from .executor import DBExecutor

__all__ = ["Submitter"]

T = TypeVar("T")


class Submitter(SubmitsJobs):
    """``submit`` and ``map`` with per-job options; made by :meth:`DBExecutor.options`."""

    def __init__(self, executor: DBExecutor, options: JobOptions) -> None:
        self._executor = executor
        self._options = options

    def options(self, **options: Any) -> Submitter:
        """These options plus or over the given ones (names as in :class:`JobOptions`)."""
        return Submitter(self._executor, with_options(self._options, options))

    def _submit_call(
        self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], after: Iterable[Future[Any]]
    ) -> JobFuture[T]:
        return self._executor._submit(fn, args, kwargs, after, self._options)

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[T]:
        """As :meth:`DBExecutor.map`, with these options."""
        return submit_map(self._executor, fn, iterables, timeout, chunksize, self._options, buffersize)

    def batch(self) -> Batch:
        """As :meth:`DBExecutor.batch`; the children get these options."""
        return Batch(self._executor, self._options)
