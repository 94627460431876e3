"""dbexecutor: a ``concurrent.futures.Executor`` whose only durable state is a database.

::

    from dbexecutor import DBExecutor

    with DBExecutor("sqlite:///jobs.db", max_workers=4) as ex:
        a = ex.submit(load, "a.csv")
        b = ex.submit(clean, a)             # a future as an argument: dependency + its result
        c = ex.submit(report, after=[a, b]) # ordering-only dependencies
        print(c.result())
"""

import importlib
import logging
from typing import TYPE_CHECKING, Any

from .errors import (
    ConfigurationError,
    DatabaseUnavailable,
    DBExecutorError,
    DependencyFailed,
    JobTimeoutError,
    CannotRunHere,
    NotRunnable,
    PayloadRejected,
    RemoteError,
    SchemaVersionError,
    SubmitRolledBack,
    WorkerDied,
)
from .progress import report_progress
from .transactions import transaction

if TYPE_CHECKING:
    from .executor import Batch, DBExecutor, JobOptions, Submitter
    from .future import JobFuture
    from .readmodels import ExecutorInfo, GroupInfo, JobDetail, JobProgress, JobSummary, StatusReport

#: The package's version; pyproject.toml reads it from here (the one place it is written).
__version__ = "0.1.0"

# A child process imports dbexecutor.child, and with it this package: the
# executor (and SQLAlchemy with it) load only when one of these is asked for,
# so that a child never imports them. The read models too: their 28
# dataclasses took 20 ms to build, in every fork server and every import.
_LAZY = {
    "DBExecutor": "executor",
    "Batch": "executor",
    "JobOptions": "executor",
    "Submitter": "executor",
    "JobFuture": "future",
    "ExecutorInfo": "readmodels",
    "GroupInfo": "readmodels",
    "JobDetail": "readmodels",
    "JobProgress": "readmodels",
    "JobSummary": "readmodels",
    "StatusReport": "readmodels",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# A library prints nothing unless the application configures logging.
logging.getLogger("dbexecutor").addHandler(logging.NullHandler())

__all__ = [
    "DBExecutor",
    "JobFuture",
    "JobOptions",
    "Submitter",
    "Batch",
    "GroupInfo",
    "StatusReport",
    "JobSummary",
    "JobDetail",
    "ExecutorInfo",
    "JobProgress",
    "report_progress",
    "transaction",
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
