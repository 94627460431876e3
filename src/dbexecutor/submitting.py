"""The typed ``submit`` that an executor, its :class:`~dbexecutor.submitter.Submitter` and a batch share.

Apart because its two signatures are the part a type checker reads, and
they were written out three times: each class now says only how it submits
one call (:meth:`SubmitsJobs._submit_call`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, ParamSpec, TypeVar, overload

from .future import JobFuture

__all__ = ["SubmitsJobs"]

P = ParamSpec("P")
T = TypeVar("T")


class SubmitsJobs:
    """``submit(fn, *args, after=..., **kwargs)``, typed once; a subclass submits one call in :meth:`_submit_call`."""

    # Two signatures because a ParamSpec cannot have a keyword (``after``)
    # beside it: with ``after``, the result type is still known but the
    # arguments are not checked against ``fn``; without it, they are.
    @overload
    def submit(
        self, fn: Callable[..., T], /, *args: Any, after: Iterable[Future[Any]], **kwargs: Any
    ) -> JobFuture[T]: ...

    @overload
    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> JobFuture[T]: ...

    def submit(self, fn: Callable[..., T], /, *args: Any, after: Any = (), **kwargs: Any) -> JobFuture[T]:
        """Persist ``fn(*args, **kwargs)`` as a job and return its future.

        ``after``: futures this job waits for (ordering only). A ``JobFuture``
        among the arguments (or one level inside a list, tuple or dict
        argument) is a dependency too, and is replaced by its result when the
        job runs. A call that cannot be pickled gives a future failed with
        the pickling error (a batch's ``submit`` raises it).
        """
        return self._submit_call(fn, args, kwargs, after)

    def _submit_call(
        self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], after: Iterable[Future[Any]]
    ) -> JobFuture[T]:
        raise NotImplementedError
