"""The exception hierarchy.

Everything the library raises on its own account derives from
:class:`DBExecutorError`, except where a standard type is the better promise:
a per-job timeout is a :class:`TimeoutError`, a dead child is a
:class:`~concurrent.futures.process.BrokenProcessPool`, a cancelled upstream is
a :class:`~concurrent.futures.CancelledError`, so code written for
``ProcessPoolExecutor`` keeps catching what it caught before.

A job's own exception comes back as itself. Only when this process cannot
rebuild it (its class is not importable here, or its ``__init__`` does not
accept the arguments it was pickled with) does it arrive as a
:class:`RemoteError` that names the original type and keeps its message.
"""

from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool

__all__ = [
    "DBExecutorError",
    "ConfigurationError",
    "DatabaseUnavailable",
    "SchemaVersionError",
    "DependencyFailed",
    "JobTimeoutError",
    "WorkerDied",
    "PayloadRejected",
    "RemoteError",
    "NotRunnable",
    "CannotRunHere",
    "SubmitRolledBack",
]


class DBExecutorError(Exception):
    """Root of the errors raised by dbexecutor itself."""


class ConfigurationError(DBExecutorError, ValueError):
    """The URL, driver, server version or an option cannot be used.

    A ``ValueError`` too, because it is always about a value the caller passed.
    """


class DatabaseUnavailable(DBExecutorError, ConnectionError):
    """The database server could not be reached (the message names host and port)."""


class SchemaVersionError(DBExecutorError):
    """The tables were written by a newer, unknown version of dbexecutor."""


class DependencyFailed(DBExecutorError):
    """An upstream job failed, so this job never ran.

    ``upstream_job_id`` names the job that failed; ``__cause__`` is its
    exception (itself a ``DependencyFailed`` when the failure came from further
    up the chain).
    """

    def __init__(self, upstream_job_id: int, message: str | None = None, *, root_job_id: int | None = None) -> None:
        self.upstream_job_id = upstream_job_id
        #: The job whose own exception started the chain (``__cause__`` is that exception).
        self.root_job_id = upstream_job_id if root_job_id is None else root_job_id
        super().__init__(message or f"upstream job {upstream_job_id} failed")

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild_dependency_failed, (self.upstream_job_id, self.args[0], self.root_job_id))


def _rebuild_dependency_failed(upstream: int, message: str, root: int) -> DependencyFailed:
    return DependencyFailed(upstream, message, root_job_id=root)


class JobTimeoutError(DBExecutorError, TimeoutError):
    """The job ran past its per-dispatch timeout and its process tree was killed."""


class WorkerDied(DBExecutorError, BrokenProcessPool):
    """The child running the job died (signal or exit code in the message).

    It subclasses ``BrokenProcessPool`` so existing handlers keep working, but
    unlike ``ProcessPoolExecutor`` only this job is affected: the executor
    replaces the child and carries on.
    """


class PayloadRejected(DBExecutorError):
    """A stored pickle was not signed with this executor's secret, or was altered.

    With a secret configured (``DBExecutor(secret=...)`` or ``DBEXECUTOR_SECRET``)
    nothing is unpickled unless its HMAC checks out: a payload that fails the
    check fails its job with this error before any of it runs, and a result
    that fails it is never handed to a future or to a dependent job.
    """


class RemoteError(DBExecutorError):
    """A job's exception that could not be rebuilt in this process, with what is known of it.

    The child stores the exception's pickle together with its type's
    qualified name and ``str(exc)``; when the pickle cannot be loaded here
    (e.g. a custom exception whose ``__init__`` takes extra required
    arguments, or a class this process cannot import), the future raises
    this instead. ``__cause__`` is the child's traceback (a
    ``RemoteTraceback``), as for any job exception.

    - ``type_name``: the original type, ``module.QualName``;
    - ``message``: ``str()`` of the original exception, taken in the child;
    - ``reason``: why it could not be rebuilt here (``TypeError(...)``), or None.
    """

    def __init__(self, type_name: str, message: str, reason: str | None = None) -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.message = message
        self.reason = reason

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Its own arguments (and notes), so it pickles again: a dependent's
        # DependencyFailed carries it as its cause.
        return (RemoteError, (self.type_name, self.message, self.reason), self.__dict__)


class CannotRunHere(DBExecutorError):
    """A job's function or arguments cannot be loaded in this process (a missing module or name, another Python).

    Raised inside a child while it loads a payload; the job is not failed for
    it but put back for an executor that can load it (see :class:`NotRunnable`).
    """


class NotRunnable(DBExecutorError):
    """No executor that tried could load this job's function or arguments.

    Each executor that cannot load a job (its module is missing there, a name
    is gone from it, the payload came from another Python version) puts the
    job back and stops claiming that function for a while; after a few such
    refusals the job fails with this error, naming the function and the hosts
    that could not load it.
    """


class SubmitRolledBack(DBExecutorError):
    """The transaction a job was submitted in (``options(connection=...)``) rolled back: the job never existed.

    Its future is final with this error; nothing was stored and nothing runs.
    Submit again in the transaction that replaces it.
    """
