"""The engine and the transactions: the only place a transaction is opened.

A unit of work is a function of a connection; :meth:`Database.txn` runs it in
one transaction and runs it again, on a fresh connection, after a deadlock, a
busy database or a lost connection. The work must therefore be safe to
repeat: it is, because every write is conditional on what it reads in the
same transaction.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection, create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, NoSuchModuleError, OperationalError

from ..dialects import Driver
from ..errors import ConfigurationError

__all__ = ["Database", "masked_url"]

log = logging.getLogger("dbexecutor.store")
T = TypeVar("T")

MAX_TRIES = 8


def masked_url(url: object) -> str:
    """The URL as text with its password replaced by ``***``."""
    return url.render_as_string(hide_password=True)  # type: ignore[attr-defined, no-any-return]


class Database:
    """One engine (a small connection pool) on the driver's URL, checked at construction."""

    def __init__(self, driver: Driver, *, pool_size: int | None = None) -> None:
        self.driver = driver
        options = driver.engine_options()
        if pool_size is not None and "pool_size" in options:
            options.update(pool_size=pool_size, max_overflow=pool_size)
        try:
            self.engine: Engine = create_engine(driver.url, **options)
        except (ModuleNotFoundError, ImportError, NoSuchModuleError) as error:
            hint = f"pip install 'dbexecutor[{driver.extra}]'" if driver.extra else "check the installation"
            raise ConfigurationError(f"the driver for {driver.label} is not installed ({error}); {hint}") from None
        driver.setup_engine(self.engine)
        self._check()

    def _check(self) -> None:
        """Connect once: the server is there, new enough, and the driver knows what it supports."""
        try:
            with self.engine.connect() as conn:
                self.driver.check_server(conn)
        except DBAPIError as error:
            self.engine.dispose()
            raise self.driver.connect_failure(error) from None

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def txn(
        self, work: Callable[[Connection], T], *, read_only: bool = False, tries: int = MAX_TRIES, one_write: bool = False
    ) -> T:
        """Run ``work`` in one transaction, again after a deadlock, busy database or lost connection.

        ``one_write``: the caller knows that ``work`` writes with one
        statement at most (and reads only what may be read outside a
        transaction): where the driver says it pays, it runs in autocommit,
        each statement committed as it ends, without ``BEGIN`` and ``COMMIT``.
        """
        delay = 0.02
        for attempt in itertools.count(1):
            try:
                with self.engine.connect() as conn:
                    if read_only:
                        conn.execution_options(dbexecutor_read_only=True)
                    if one_write and self.driver.autocommits_one_write:
                        # Reset to the pool's default when the connection goes back.
                        conn.execution_options(isolation_level="AUTOCOMMIT")
                    with conn.begin():
                        return work(conn)
            except DBAPIError as error:
                if attempt >= tries or not self.driver.is_transient(error):
                    raise
                log.info("transaction failed (%s), retry %d of %d", type(error.orig).__name__, attempt, tries - 1)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def retry_later(self, error: DBAPIError) -> bool:
        """Whether ``error`` is the database's state (down, busy, restarting) rather than a refused row."""
        return isinstance(error, (OperationalError, InterfaceError)) or self.driver.is_transient(error)
