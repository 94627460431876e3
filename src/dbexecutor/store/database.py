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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Connection, create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, NoSuchModuleError, OperationalError

from ..dialects import Driver
from ..errors import ConfigurationError

__all__ = ["Database", "Hold", "masked_url"]

log = logging.getLogger("dbexecutor.store")
T = TypeVar("T")

MAX_TRIES = 8
#: Seconds before the first retry of a transaction and at most between two (doubling, jittered):
#: 8 tries wait about 2.3 s in all, a server's restart or a failover's switch.
RETRY_DELAY = 0.02
RETRY_DELAY_MAX = 1.0

#: Seconds a thread that holds a connection (:meth:`Database.holding`) keeps it before it takes a
#: fresh one from the pool, where the pool's own rules (recycling, a reset) apply again.
HOLD_FOR = 60.0


class Hold:
    """A connection kept between transactions (see :meth:`Database.holding`), and since when (monotonic).

    ``autocommit``: where the driver says that pays (see ``Database.txn``),
    its connection is in autocommit and serves one-write work only (other
    work takes a connection from the pool, as without a hold); elsewhere it
    is a plain hold. Used by one thread at a time: its owner serializes the
    transactions that use it.
    """

    def __init__(self, autocommit: bool = False) -> None:
        self.autocommit = autocommit
        self.conn: Connection | None = None
        self.since = 0.0


class _Current(threading.local):
    """The hold this thread's transactions use, if any."""

    hold: Hold | None = None


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
        self._current = _Current()
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

    @contextmanager
    def holding(self, hold: Hold | None = None) -> Iterator[None]:
        """While inside, this thread's transactions reuse one connection instead of taking one from the pool each time.

        For a thread that runs transactions back to back (the scheduler's
        loop): taking a connection from the pool and giving it back cost
        about a tenth of a SQLite tick. Every transaction of the thread runs
        on it (a one-write one in a transaction, not in autocommit), so the
        thread never holds two. A transaction that fails drops the
        connection, so that the next one starts on a fresh one; after
        :data:`HOLD_FOR` seconds the connection goes back to the pool anyway.

        ``hold``: one that outlives the block, for transactions of several
        threads taken in turn (the durable submits, under the submit
        queue's writer); it keeps its connection on leaving, until
        :meth:`release`. Without it, the connection goes back on leaving.
        """
        current = self._current
        before, current.hold = current.hold, hold if hold is not None else Hold()
        try:
            yield
        finally:
            mine, current.hold = current.hold, before
            if hold is None and mine is not None:
                self.release(mine)

    def release(self, hold: Hold) -> None:
        """Give the connection ``hold`` keeps back to the pool (the next transaction that uses it takes a new one)."""
        conn, hold.conn = hold.conn, None
        if conn is not None:
            conn.close()

    def _connection(self, hold: Hold) -> Connection:
        """The connection a held transaction runs on: ``hold``'s, or a new one it keeps from now."""
        if hold.conn is not None and time.monotonic() - hold.since > HOLD_FOR:
            self.release(hold)
        if hold.conn is None:
            conn = self.engine.connect()
            if self._autocommits(hold):
                conn.execution_options(isolation_level="AUTOCOMMIT")
            hold.conn, hold.since = conn, time.monotonic()
        return hold.conn

    def _held(self, one_write: bool) -> Hold | None:
        """The hold a transaction runs on (None: one from the pool)."""
        hold = self._current.hold
        if hold is None or (hold.conn is not None and hold.conn.in_transaction()):
            return None  # work that opens a transaction inside another one takes its own
        if self._autocommits(hold) and not one_write:
            return None  # a transaction of several writes, on a connection of its own
        return hold

    def _autocommits(self, hold: Hold) -> bool:
        """Whether ``hold``'s connection is in autocommit (where the driver gains from it; else a plain hold)."""
        return hold.autocommit and self.driver.autocommits_one_write

    def txn(
        self,
        work: Callable[[Connection], T],
        *,
        read_only: bool = False,
        tries: int = MAX_TRIES,
        one_write: bool = False,
        landed: Callable[[Connection, T | None], T | None] | None = None,
    ) -> T:
        """Run ``work`` in one transaction, again after a deadlock, busy database or lost connection.

        ``one_write``: the caller knows that ``work`` writes with one
        statement at most (and reads only what may be read outside a
        transaction): where the driver says it pays, it runs in autocommit,
        each statement committed as it ends, without ``BEGIN`` and ``COMMIT``.

        ``landed``: a connection can drop after the server committed and
        before its answer arrived, and a lost connection is tried again.
        Before ``work`` runs again, ``landed(conn, what the last try that
        ran to its end returned, or None)`` reads whether an earlier try was
        committed all the same (its ``COMMIT``, or in autocommit its one
        statement); it returns what to return then, and ``work`` does not
        run again (it would write its rows twice), or None.
        """
        if landed is not None:
            work = _once(work, landed)
        delay = RETRY_DELAY
        hold = self._held(one_write)
        for attempt in itertools.count(1):
            try:
                if hold is not None:
                    # On a hold that is not autocommit, one-write work runs in a transaction:
                    # switching the connection to autocommit and back would cost what it saves.
                    return self._held_txn(hold, work, read_only)
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
                delay = min(delay * 2, RETRY_DELAY_MAX)
        raise AssertionError("unreachable")

    def _held_txn(self, hold: Hold, work: Callable[[Connection], T], read_only: bool) -> T:
        """One transaction on ``hold``'s connection; it is given up if anything fails."""
        try:
            conn = self._connection(hold)
            if read_only:
                conn.execution_options(dbexecutor_read_only=True)
            try:
                with conn.begin():
                    return work(conn)
            finally:
                if read_only:
                    conn.execution_options(dbexecutor_read_only=False)
        except BaseException:
            self.release(hold)  # a fresh connection for the next try, whatever went wrong
            raise

    def retry_later(self, error: DBAPIError) -> bool:
        """Whether ``error`` is the database's state (down, busy, restarting) rather than a refused row."""
        return isinstance(error, (OperationalError, InterfaceError)) or self.driver.is_transient(error)


def _once(work: Callable[[Connection], T], landed: Callable[[Connection, T | None], T | None]) -> Callable[[Connection], T]:
    """``work``, which from its second try on first asks ``landed`` whether an earlier try was committed."""
    tried: list[T] = []  # what the last try that ran to its end returned (its COMMIT then failed)
    first = [True]

    def run(conn: Connection) -> T:
        if not first[0]:
            found = landed(conn, tried[0] if tried else None)
            if found is not None:
                return found
        first[0] = False
        out = work(conn)
        tried[:] = [out]
        return out

    return run
