"""A job's own transaction, committed with its completion (run inside a child).

::

    begin()     the job writes through the connection (dbexecutor.transaction())
    complete()  same transaction: server time; the job's row done with its result,
                fenced by (id, attempt) (finish.finish, as the parent would);
                dependents released; the attempt row; the notification ──► COMMIT
                0 rows matched (the lease is gone) ──► ROLLBACK, False
                COMMIT unanswered (connection lost) ──► made if the attempt row is there

The completion's ``UPDATE`` of the job row comes last and the commit follows
at once, so the row lock it takes (PostgreSQL, MariaDB) is held for one
statement's time: the parent's lease renewals of the same row wait for it
at most that long, and never hold a lock it waits for. On SQLite the
connection's transaction begins ``IMMEDIATE`` (the engine's hook), so it
holds the one write lock from the job's first ``transaction()`` to the end
of the job; the busy timeout (30 s) is what other writers wait.

This module is imported by a child only when a job asks for a transaction.
"""

from __future__ import annotations

import os
import time

from sqlalchemy import Connection
from sqlalchemy.engine import RootTransaction
from sqlalchemy.exc import DBAPIError

from .. import serialization
from ..dialects import resolve
from ..records import Report
from . import finish, landed, submit, worker_name
from .clock import Clock
from .context import Context
from .database import Database
from .sql import Statements

__all__ = ["JobDatabase"]


class JobDatabase:
    """One child's connection to its executor's database, for the jobs that ask for a transaction."""

    def __init__(self, url: str, prefix: str, signer: serialization.Signer) -> None:
        driver = resolve(url)
        tables = driver.make_tables(prefix)
        # One connection: a child runs one job at a time.
        self._db = Database(driver, pool_size=1)
        self._ctx = Context(tables, driver, Statements(tables, driver), signer, prefix, Clock())
        self._conn: Connection | None = None
        self._trans: RootTransaction | None = None

    @property
    def open(self) -> bool:
        """Whether a transaction is open."""
        return self._conn is not None

    def begin(self) -> Connection:
        """The connection, in its transaction (begun on the first call of a job)."""
        if self._conn is None:
            conn = self._db.engine.connect()
            try:
                self._trans = conn.begin()
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def rollback(self) -> None:
        """Roll the transaction back and give the connection back to the pool."""
        conn, trans = self._conn, self._trans
        self._conn = self._trans = None
        if conn is None:
            return
        try:
            if trans is not None and trans.is_active:
                trans.rollback()
        finally:
            conn.close()

    def complete(self, job_id: int, attempt: int, blob: bytes, started: float) -> bool:
        """Finish the attempt in the job's transaction and commit; False (rolled back) if its lease is gone.

        ``blob``: the signed result; ``started``: when the job started (this machine's epoch seconds).
        """
        conn, trans = self._conn, self._trans
        assert conn is not None and trans is not None, "complete() without a transaction"
        ctx = self._ctx
        try:
            now = ctx.driver.server_time(conn)
            ran = max(0.0, time.time() - started)
            report = Report(job_id, attempt, True, blob, "ok", None, worker_name(os.getpid()), now - ran, now)
            done = finish.finish(ctx, conn, [report], now)
            if job_id in done.lost:
                return False  # rolled back below: nothing the job wrote stays
            submit.notify_changes(ctx, conn, [], [], now, done)
            try:
                trans.commit()
                return True
            except DBAPIError as error:
                # Never used again: whatever its transaction's state on the server, closing the
                # connection ends it. A failure in the client could otherwise send it back to the
                # pool still inside that transaction, holding the job row's lock.
                conn.invalidate()
                if not ctx.driver.is_transient(error):
                    raise
                unanswered = error
        finally:
            # Without NOTIFY the parent tells the other executors (it rings its doorbell once it has the Result).
            ctx.unsent().clear()
            self.rollback()
        # The connection dropped during the COMMIT: the server may have made it, its answer lost.
        # Reported as a failure, the parent would record a second outcome beside the child's own.
        if self._committed(report):
            return True
        raise unanswered

    def _committed(self, report: Report) -> bool:
        """Whether the transaction that recorded ``report`` committed (its attempt row is there), on a fresh connection.

        False if that cannot be read either: the attempt is reported as failed,
        and the parent's fenced finish sorts it out.
        """
        try:
            with self._db.engine.connect() as conn:
                conn = conn.execution_options(dbexecutor_read_only=True)
                return bool(landed.recorded(self._ctx, conn, [report]))
        except DBAPIError:
            return False
