"""dbexecutor: a ``concurrent.futures.Executor`` whose only durable state is a database.

::

    from dbexecutor import DBExecutor

    with DBExecutor("sqlite:///jobs.db", max_workers=4) as ex:
        a = ex.submit(load, "a.csv")
        b = ex.submit(clean, a)             # a future as an argument: dependency + its result
        c = ex.submit(report, after=[a, b]) # ordering-only dependencies
        print(c.result())
"""

import logging

from .errors import (
    ConfigurationError,
    DatabaseUnavailable,
    DBExecutorError,
    DependencyFailed,
    JobTimeoutError,
    PayloadRejected,
    RemoteError,
    SchemaVersionError,
    WorkerDied,
)
from .executor import Batch, DBExecutor, JobOptions, Submitter
from .future import JobFuture
from .records import GroupInfo, JobDetail, JobSummary, StatusReport

#: The package's version; pyproject.toml reads it from here (the one place it is written).
__version__ = "0.1.0"

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
    "DBExecutorError",
    "ConfigurationError",
    "DatabaseUnavailable",
    "SchemaVersionError",
    "DependencyFailed",
    "JobTimeoutError",
    "WorkerDied",
    "PayloadRejected",
    "RemoteError",
]
