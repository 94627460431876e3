"""``map``: submitting many calls of one function, and the iterator of their results.

::

    map(fn, *iterables) ──► MapPlan (the calls, maybe in chunks for run_chunk)
        │ queue(): prepared and handed to the scheduler in slices (or written
        │          through the caller's transaction)
        ▼
    results(): the futures in a deque, oldest on the right; each result in
        turn, waiting until the map's end time; with a buffersize, one more
        job queued per job consumed; leaving early cancels the rest

Apart from the executor because the iterator must not keep the executor
alive (it holds only a weak reference to it), and because ``DBExecutor.map``
and ``Submitter.map`` share all of it.
"""

from __future__ import annotations

import collections
import itertools
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from . import serialization
from .calls import prepare
from .child import run_chunk
from .future import JobFuture
from .options import JobOptions

if TYPE_CHECKING:  # the executor imports this module
    from .executor import DBExecutor
    from .scheduler import Scheduler

__all__ = ["MapPlan", "submit_map", "queue", "results"]

T = TypeVar("T")

_MAP_SLICE = 256  # jobs map() hands to the scheduler at a time


@dataclass(frozen=True)
class MapPlan:
    """The jobs of one ``map``: each runs ``fn(*args)`` for the next ``args``; ``name`` is the row's function name."""

    fn: Callable[..., Any]
    opts: JobOptions
    name: str | None
    args: Iterator[tuple[Any, ...]]


def submit_map(
    executor: DBExecutor,
    fn: Callable[..., Any],
    iterables: tuple[Iterable[Any], ...],
    timeout: float | None,
    chunksize: int,
    opts: JobOptions,
    buffersize: int | None = None,
) -> Iterator[Any]:
    """``executor.map`` with ``opts``: queue the jobs (the first ``buffersize`` of them), return the results' iterator."""
    # The checks and messages of CPython 3.14's Executor.map.
    if buffersize is not None and not isinstance(buffersize, int):
        raise TypeError("buffersize must be an integer or None")
    if buffersize is not None and buffersize < 1:
        raise ValueError("buffersize must be None or > 0")
    if chunksize < 1:
        raise ValueError("chunksize must be >= 1.")
    if opts.key is not None:
        raise ValueError("a key names one job; map submits many (use submit for keyed jobs)")
    if opts.connection is not None and buffersize is not None:
        raise ValueError("buffersize submits as results are consumed, after the transaction: give one or the other")
    executor._check_open()
    end_time = None if timeout is None else timeout + time.monotonic()
    items = zip(*iterables)
    plan = MapPlan(fn, opts, None, items)
    if chunksize > 1:
        chunks = iter(lambda: list(itertools.islice(items, chunksize)), [])
        plan = MapPlan(run_chunk, opts, serialization.qualified_name(fn), ((fn, chunk) for chunk in chunks))
    fs = collections.deque(queue(executor, plan, buffersize))
    return results(fs, end_time, chunksize > 1, executor._scheduler, weakref.ref(executor), plan if buffersize else None)


def queue(executor: DBExecutor, plan: MapPlan, limit: int | None) -> list[JobFuture[Any]]:
    """Queue the next ``limit`` jobs of a ``map`` (all of them for None); their futures, in order."""
    now = executor._store.now()
    calls = (prepare(executor, plan.fn, args, {}, (), plan.opts, now, plan.name) for args in itertools.islice(plan.args, limit))
    if plan.opts.connection is not None:
        return executor._submit_many(list(calls), now, plan.opts.connection)
    # Queued like submits: the scheduler writes them with its ticks, in
    # the transactions that also claim them. Handed over in slices: a
    # short map reaches the scheduler whole (one tick writes and claims
    # it all), a long one starts being written while the rest is pickled.
    scheduler = executor._scheduler
    fs: list[JobFuture[Any]] = []
    delays: list[float] = []
    for part in iter(lambda: list(itertools.islice(calls, _MAP_SLICE)), []):
        # A JobFuture in the slice could not be pickled: failed already, nothing to store.
        queued = [c for c in part if not isinstance(c, JobFuture)]
        futures = iter(scheduler.enqueue_many(queued))
        fs.extend(c if isinstance(c, JobFuture) else next(futures) for c in part)
        delays.extend(c.run_after for c in queued if c.run_after is not None)
    if delays:
        scheduler.due(min(delays))
    if executor._durable_submit:
        scheduler.flush()
    return fs


def result_or_cancel(fut: JobFuture[T], end_time: float | None) -> T:
    """``fut``'s result, waiting until ``end_time`` at most; a job whose wait ends without one is cancelled."""
    try:
        try:
            return fut.result(None if end_time is None else end_time - time.monotonic())
        finally:
            fut.cancel()  # a no-op once the future is done
    finally:
        # A raised exception's traceback holds this frame: without this, the
        # frame, the future and the exception would keep each other alive.
        del fut


def results(
    fs: collections.deque[JobFuture[Any]],
    end_time: float | None,
    chunked: bool,
    scheduler: Scheduler,
    executor: weakref.ref[DBExecutor],
    plan: MapPlan | None,
) -> Iterator[Any]:
    """The iterator ``map`` returns: each job's result (or each item of its chunk), in order.

    While suspended at ``yield`` it holds no future and no result it has
    handed out (CPython's ``test_free_reference``), and only a weak
    reference to the executor: the caller decides what stays alive. With a
    ``plan`` (``buffersize``), one more job is queued per job consumed.
    """
    try:
        fs.reverse()  # oldest on the right: pop() it, new jobs go in on the left
        while fs:
            if plan is not None:
                queue_next(fs, executor, plan)
            if not chunked:
                yield result_or_cancel(fs.pop(), end_time)
                continue
            chunk = result_or_cancel(fs.pop(), end_time)
            chunk.reverse()
            while chunk:
                yield chunk.pop()  # popped: an item the caller has dropped is freed
    finally:
        scheduler.cancel_jobs([f.job_id for f in fs if not f.done() and f.job_id is not None])


def queue_next(fs: collections.deque[JobFuture[Any]], executor: weakref.ref[DBExecutor], plan: MapPlan) -> None:
    """Queue the next job of a buffered ``map`` on the left of ``fs``."""
    # A function of its own, so that no local of the suspended iterator holds the executor.
    ex = executor()
    if ex is not None:
        fs.extendleft(queue(ex, plan, 1))
