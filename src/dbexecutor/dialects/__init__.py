"""One driver per database: the only place that knows dialect names.

::

    resolve(url) ──► SQLiteDriver      (sqlite://)
                 ──► PostgreSQLDriver  (postgresql://, postgres://: psycopg 3)
                 ──► MySQLDriver       (mysql://, mariadb://: PyMySQL)

``resolve`` picks the class once, from the URL, before any connection is made;
the store asks the driver every question where databases differ
(:class:`~dbexecutor.dialects.base.Driver` lists them).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from ..errors import ConfigurationError
from .base import Driver
from .mysql import MySQLDriver
from .postgresql import PostgreSQLDriver
from .sqlite import SQLiteDriver

__all__ = ["Driver", "resolve", "SQLiteDriver", "PostgreSQLDriver", "MySQLDriver"]

# URL scheme -> (driver class, the DBAPI driver we use for it)
_SCHEMES: dict[str, tuple[type[Driver], str]] = {
    "sqlite": (SQLiteDriver, "sqlite+pysqlite"),
    "postgresql": (PostgreSQLDriver, "postgresql+psycopg"),
    "postgres": (PostgreSQLDriver, "postgresql+psycopg"),
    "mysql": (MySQLDriver, "mysql+pymysql"),
    "mariadb": (MySQLDriver, "mariadb+pymysql"),
}

_EXAMPLES = "e.g. 'sqlite:///jobs.db', 'postgresql://user@host/db' or 'mysql://user@host/db'"


def resolve(url: Any) -> Driver:
    """Parse ``url`` and return the driver for it, with its URL pinned to our DBAPI driver.

    ``postgresql://`` means psycopg 3 and ``mysql://`` / ``mariadb://`` mean
    PyMySQL; an explicit other driver is refused with the reason.
    """
    if not isinstance(url, (str, URL)):
        raise ConfigurationError(f"a database URL is needed ({_EXAMPLES}), not {type(url).__name__}")
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        raise ConfigurationError(f"malformed database URL; expected {_EXAMPLES}") from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in _SCHEMES:
        raise ConfigurationError(
            f"unsupported database {backend!r}: dbexecutor runs on sqlite, postgresql and mysql/mariadb"
        )
    cls, our_driver = _SCHEMES[backend]
    if driver and driver != our_driver.partition("+")[2]:
        raise ConfigurationError(
            f"driver {driver!r} is not supported for {cls.label}; use {our_driver}:// (or plain {backend}://)"
        )
    return cls(parsed.set(drivername=our_driver))
