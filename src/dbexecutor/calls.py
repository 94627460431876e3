"""From one call to the row that stores it: its dependencies, its payload, its options.

::

    fn(*args, **kwargs), after=, JobOptions
      ├─ a future among the arguments ──► Upstreams: its id (a JobRef in the payload),
      │                                   or Unwritten if it is still queued here (an ArgRef)
      ├─ pickled and signed ──────────► the payload (or a future failed with the pickling error); a
      │                                   program's function used again named by digest (store.functions)
      └─ options, on the server's clock ► NewJob, for the scheduler or the caller's transaction to write

Apart from the executor because every way in (``submit``, ``map``, a
batch's ``submit`` and ``map``) prepares its rows here and only then
decides how to write them; nothing here writes a job (only, once, the pickle of
a program's function that payloads name: :mod:`dbexecutor.store.functions`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from . import serialization
from .future import JobFuture
from .options import JobOptions
from .records import Dep, NewJob, Unwritten

if TYPE_CHECKING:  # the executor imports this module
    from .executor import DBExecutor
    from .store import Store

__all__ = ["Upstreams", "prepare", "run_after"]


_FUTURES: tuple[type, ...] = (Future,)  # what a call's arguments may hold that is a dependency


class Upstreams:
    """The dependencies of one call being prepared: ids, or :class:`Unwritten` for jobs still queued here.

    An upstream submitted by this executor and not written yet stays
    unwritten (its row and the new one go in with the same commit, or in
    order) rather than being written now to learn its id: a chain of submits
    would otherwise cost a commit per link. In the payload it is an
    ``ArgRef``, its position among the results the call takes.
    """

    def __init__(self, executor: DBExecutor, in_transaction: bool, defer: bool) -> None:
        self._executor = executor
        self._in_transaction = in_transaction
        self._defer = defer
        self.deps: dict[Dep, None] = {}  # ordered, without repeats
        self.refs: dict[Dep, int] = {}  # the deps whose results are arguments (after= only orders), by position
        self.futures: list[Future[Any]] = []  # each upstream future once
        self._seen: dict[Future[Any], Dep] = {}  # one decision per future, written or not

    def _dep(self, f: Future[Any]) -> Dep:
        dep = self._seen.get(f)
        if dep is None:
            ex = self._executor
            if self._defer and isinstance(f, JobFuture) and ex._scheduler.queued_here(f):
                dep = Unwritten(f)
            else:
                dep = ex._dependency(f, self._in_transaction)
            self._seen[f] = dep
            self.futures.append(f)
        return dep

    def argument(self, x: Any) -> Any:
        """``x``, or the placeholder the payload holds for it if it is a future (a dependency whose result it takes)."""
        if not isinstance(x, Future):
            return x
        dep = self._dep(x)
        self.deps[dep] = None
        position = self.refs.setdefault(dep, len(self.refs))
        return serialization.JobRef(dep) if isinstance(dep, int) else serialization.ArgRef(position)

    def order_after(self, f: Future[Any]) -> None:
        """``after=``: a dependency for ordering only."""
        self.deps[self._dep(f)] = None


def prepare(
    executor: DBExecutor,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    after: Iterable[Future[Any]],
    opts: JobOptions,
    now: float,
    fn_name: str | None = None,
    upstream: list[Future[Any]] | None = None,
) -> NewJob | JobFuture[Any]:
    """The row for one call to ``executor``, or a future already failed with the pickling error.

    ``upstream`` (if given) collects the dependency futures.
    """
    if not callable(fn):
        raise TypeError(f"{fn!r} is not callable")
    store = executor._store
    # Not for a keyed job or a caller's transaction: those are written at
    # once, below their upstreams' rows.
    named = Upstreams(executor, opts.connection is not None, defer=opts.connection is None and opts.key is None)
    args, kwargs = serialization.map_arguments(args, kwargs, named.argument, _FUTURES)
    for f in after:
        named.order_after(f)
    if upstream is not None:
        upstream += named.futures
    try:
        # A function of the program used again goes to the functions table, named in the payload
        # by digest; not in a caller's transaction: the table's row is written on a connection of
        # the store's, which on SQLite would wait for the write lock the caller's transaction holds.
        reference = store.functions.reference if opts.connection is None else None
        payload = serialization.dump_payload(fn, args, kwargs, store.signer, reference)
        limit = store.driver.max_payload
        if limit is not None and len(payload) > limit:
            raise ValueError(
                f"the pickled call is {len(payload):,} bytes; this {store.driver.label} server takes "
                f"at most {limit:,} in a row (max_allowed_packet): pass a path or a key instead of the data"
            )
    except Exception as error:
        # As ProcessPoolExecutor: the future fails with the pickling error; nothing is stored.
        failed: JobFuture[Any] = JobFuture(None)  # type: ignore[arg-type]
        error.__cause__ = serialization.RemoteTraceback(serialization.format_remote_traceback(error))
        failed.set_exception(error)
        return failed
    return NewJob(
        fn_name=fn_name or serialization.qualified_name(fn),
        payload=payload,
        deps=tuple(named.deps),
        refs=tuple(named.refs),
        key=opts.key,
        group=opts.group,
        queue=opts.queue if opts.queue is not None else executor.queue,
        weight=opts.weight,
        priority=opts.priority,
        timeout=opts.timeout,
        retries=opts.retries or 0,
        run_after=run_after(store, opts, now),
        submitted_by=executor._submitter_id,
        retry_delay=opts.retry_delay,
    )


def run_after(store: Store, opts: JobOptions, now: float) -> float | None:
    """When the job may start, on the server's clock (``run_after`` is given on this machine's)."""
    if opts.delay is not None:
        return now + opts.delay
    return None if opts.run_after is None else store.clock.to_server(opts.run_after)
