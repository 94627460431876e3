"""Pickling of payloads, results and exceptions.

Data flow of one job::

    submit(fn, *args)          child                       parent / any reader
    ─────────────────          ─────                       ───────────────────
    futures → JobRef    ──►    JobRef → upstream result
    dump_payload()      ──►    load_payload(), run fn  ──►  load_result() / load_exception()
                               dump_result() or dump_exception()

An exception keeps its ``__cause__`` chain across the pickle (plain pickling
drops it), and the child's formatted traceback becomes a
:class:`RemoteTraceback` cause, as ``ProcessPoolExecutor`` does.
"""

from __future__ import annotations

import pickle
import traceback
from typing import Any, Callable

from .errors import DependencyFailed

PROTOCOL = pickle.HIGHEST_PROTOCOL
_MAX_CAUSE_DEPTH = 8


class JobRef:
    """Stands in for a ``JobFuture`` inside a stored payload; the child swaps in the result."""

    __slots__ = ("job_id",)

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (JobRef, (self.job_id,))

    def __repr__(self) -> str:
        return f"JobRef({self.job_id})"


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a child, as text (set as ``__cause__``)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def qualified_name(fn: Any) -> str:
    """``module.qualname`` of a callable, for the readable ``fn_name`` column."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}"[:255]


def _map_shallow(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to ``obj`` and, one level down, to the items of a list, tuple or dict."""
    if type(obj) is list:
        return [fn(x) for x in obj]
    if type(obj) is tuple:
        return tuple(fn(x) for x in obj)
    if type(obj) is dict:
        return {k: fn(v) for k, v in obj.items()}
    return fn(obj)


def map_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], fn: Callable[[Any], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Apply ``fn`` where a dependency may sit: each argument, each keyword value, and their items."""
    return (
        tuple(_map_shallow(a, fn) for a in args),
        {k: _map_shallow(v, fn) for k, v in kwargs.items()},
    )


def dumps(obj: Any) -> bytes:
    """Pickle with the highest protocol."""
    return pickle.dumps(obj, protocol=PROTOCOL)


def loads(data: bytes) -> Any:
    """Unpickle a stored blob."""
    return pickle.loads(data)


def dump_payload(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """Pickle what a child needs to run the job (futures already replaced by ``JobRef``)."""
    return dumps((fn, args, kwargs))


def load_payload(data: bytes) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """Inverse of :func:`dump_payload`."""
    fn, args, kwargs = loads(data)
    return fn, args, kwargs


def collect_refs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
    """Job ids of the ``JobRef`` placeholders in a loaded payload."""
    found: list[int] = []

    def visit(x: Any) -> Any:
        if type(x) is JobRef:
            found.append(x.job_id)
        return x

    map_arguments(args, kwargs, visit)
    return found


def resolve_refs(
    args: tuple[Any, ...], kwargs: dict[str, Any], results: dict[int, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Replace each ``JobRef`` by the upstream job's result."""
    return map_arguments(args, kwargs, lambda x: results[x.job_id] if type(x) is JobRef else x)


class _BatchResult:
    """A batch's stored result: its children's result pickles, loaded as one list."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_load_batch, (self.blobs,))


def _load_batch(blobs: list[bytes]) -> list[Any]:
    return [loads(b) for b in blobs]


def batch_result(blobs: list[bytes]) -> bytes:
    """The result of a batch: unpickles to the list of its children's results, in order.

    The children's pickles are nested as they are, so the parent never has to
    unpickle (or be able to import) the children's result types.
    """
    return dumps(_BatchResult(blobs))


# -- exceptions ---------------------------------------------------------------


def _rebuild_exception(exc: BaseException, cause: BaseException | None) -> BaseException:
    exc.__cause__ = cause
    return exc


class _ExceptionBox:
    """Pickles an exception together with its ``__cause__`` chain."""

    def __init__(self, exc: BaseException, depth: int = 0) -> None:
        self.exc = exc
        cause = exc.__cause__
        self.cause = _ExceptionBox(cause, depth + 1) if cause is not None and depth < _MAX_CAUSE_DEPTH else None

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild_exception, (self.exc, self.cause))


def format_remote_traceback(exc: BaseException) -> str:
    """The child's traceback, framed like ``ProcessPoolExecutor``'s remote traceback."""
    return '\n"""\n' + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) + '"""'


def dump_exception(exc: BaseException, *, remote_tb: str | None = None) -> bytes:
    """Pickle an exception with its cause chain; ``remote_tb`` becomes the innermost cause.

    If the exception itself cannot be pickled, the pickling error is stored in
    its place, with the original's type and message, as ``ProcessPoolExecutor`` does.
    """
    if remote_tb is not None:
        exc.__cause__ = RemoteTraceback(remote_tb)
    try:
        return dumps(_ExceptionBox(exc))
    except Exception as pickling_error:
        replacement = pickle.PicklingError(
            f"exception {type(exc).__module__}.{type(exc).__qualname__}({exc}) could not be pickled: {pickling_error}"
        )
        if remote_tb is not None:
            replacement.__cause__ = RemoteTraceback(remote_tb)
        return dumps(_ExceptionBox(replacement))


def load_exception(data: bytes) -> BaseException:
    """Inverse of :func:`dump_exception`; a blob that cannot be loaded becomes an explanatory error."""
    try:
        exc = loads(data)
    except Exception as error:  # e.g. the exception class is not importable here
        return RuntimeError(f"the stored exception could not be unpickled: {error!r}")
    if not isinstance(exc, BaseException):
        return TypeError(f"stored exception blob holds {type(exc).__name__}, not an exception")
    return exc


def dependency_failure(upstream_id: int, upstream_blob: bytes | None) -> bytes:
    """The stored error of a job whose upstream ``upstream_id`` failed.

    The cause is the root failure's exception (not a chain of intermediate
    ``DependencyFailed``), so the blob stays small however long the chain is.
    """
    upstream = load_exception(upstream_blob) if upstream_blob else RuntimeError(f"job {upstream_id} failed")
    if isinstance(upstream, DependencyFailed):
        root_id = upstream.root_job_id
        cause = upstream.__cause__
    else:
        root_id, cause = upstream_id, upstream
    if root_id == upstream_id:
        message = f"upstream job {upstream_id} failed: {type(cause).__name__}: {cause}"
    else:
        message = f"upstream job {upstream_id} failed because job {root_id} failed: {type(cause).__name__}: {cause}"
    error = DependencyFailed(upstream_id, message, root_job_id=root_id)
    error.__cause__ = cause
    return dumps(_ExceptionBox(error))
