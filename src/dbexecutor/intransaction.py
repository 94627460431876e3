"""Submits inside the caller's transaction: ``ex.options(connection=conn).submit(...)``.

::

    submit ──► rows and edges written through the caller's connection, in its open
    │          transaction (PostgreSQL: the NOTIFY too, so it is sent only if it commits)
    │          the future: job_id known, pending, not tracked yet
    ├─ caller commits ──"commit" event──► Scheduler.committing(): once the commit has
    │                                     returned, rows found ─► tracked like any other
    │                                     future; doorbell rung (no NOTIFY), loop woken
    │                                     rows missing (a savepoint rolled back, the
    │                                     commit failed) ─► SubmitRolledBack
    └─ caller rolls back ──"rollback" event──► every future fails with SubmitRolledBack

The events are SQLAlchemy's ``ConnectionEvents`` on the caller's connection
(a Session's connection for a ``Session``), which fire on the caller's
thread just before the commit or rollback: nothing here touches the database
then, the scheduler reads the rows once the commit is over.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, event
from sqlalchemy.engine import RootTransaction

from .errors import SubmitRolledBack
from .future import JobFuture
from .records import NewJob, Submitted

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ["CallerTransaction", "connection_of", "pending", "never_stored", "NOT_COMMITTED"]


class _NotCommitted:
    """The control of a future whose transaction has not committed: no executor can see its job yet."""

    def cancel_job(self, job_id: int) -> bool:
        return False

    def terminate_job(self, job_id: int) -> bool:
        return False

    def job_progress(self, job_id: int) -> None:
        return None


#: What a future submitted in an open transaction asks instead of its scheduler.
NOT_COMMITTED = _NotCommitted()


def connection_of(given: Any) -> Connection:
    """The connection to write through: ``given`` itself, or an ORM ``Session``'s connection (begun if needed)."""
    if isinstance(given, Connection):
        return given
    # Never imported here: a caller with a Session has imported the ORM already.
    orm = sys.modules.get("sqlalchemy.orm")
    if orm is not None and isinstance(given, orm.Session):
        conn: Connection = given.connection()
        return conn
    raise TypeError(f"connection= takes a SQLAlchemy Connection or an ORM Session, not {type(given).__name__}")


@dataclass(eq=False)
class CallerTransaction:
    """The jobs one executor wrote through one transaction of a caller's connection, until it ends."""

    scheduler: Scheduler
    trans: RootTransaction
    rows: list[Submitted] = field(default_factory=list)
    futures: list[JobFuture[Any]] = field(default_factory=list)
    jobs: list[NewJob] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)  # sent once it commits (databases without NOTIFY)
    groups: dict[str, int | None] = field(default_factory=dict)

    def future_of(self, job_id: int) -> JobFuture[Any] | None:
        """The future of a job this transaction wrote (a key submitted twice in it), if any."""
        for row, fut in zip(self.rows, self.futures):
            if row.job_id == job_id:
                return fut
        return None

    def add(self, job: NewJob, row: Submitted, fut: JobFuture[Any]) -> None:
        """A row written in this transaction, and its future (pending until the commit)."""
        fut._control = NOT_COMMITTED
        fut.job_id = row.job_id  # known now: the caller may store it in its own rows
        self.jobs.append(job)
        self.rows.append(row)
        self.futures.append(fut)

    def rolled_back(self) -> None:
        """The transaction rolled back: none of these jobs ever existed."""
        never_stored(self.futures)


def never_stored(futures: Sequence[JobFuture[Any]]) -> None:
    """Fail the futures of jobs whose transaction rolled back (or whose commit failed) with ``SubmitRolledBack``."""
    for fut in futures:
        fut._set_exception_quietly(SubmitRolledBack(
            f"job {fut._job_id} was submitted in a transaction that rolled back; it was never stored"
        ))


class _Watch:
    """The commit and rollback events of one caller connection, and the transactions waiting for them."""

    def __init__(self, conn: Connection) -> None:
        self.lock = threading.Lock()
        self.waiting: list[CallerTransaction] = []
        event.listen(conn, "commit", self._commit)
        event.listen(conn, "rollback", self._rollback)

    def _take(self) -> list[CallerTransaction]:
        with self.lock:
            waiting, self.waiting = self.waiting, []
        return waiting

    def _commit(self, conn: Connection) -> None:
        for txn in self._take():
            txn.scheduler.committing(txn)

    def _rollback(self, conn: Connection) -> None:
        for txn in self._take():
            txn.rolled_back()


_watches: weakref.WeakKeyDictionary[Connection, _Watch] = weakref.WeakKeyDictionary()
_watches_lock = threading.Lock()


def pending(conn: Connection, scheduler: Scheduler) -> CallerTransaction:
    """The jobs ``scheduler`` wrote in ``conn``'s current transaction (a new, empty record for its first)."""
    trans = conn.get_transaction()
    if trans is None:
        raise RuntimeError("the connection has no transaction open")
    with _watches_lock:
        watch = _watches.get(conn)
        if watch is None:
            watch = _watches[conn] = _Watch(conn)
    with watch.lock:
        for txn in watch.waiting:
            if txn.scheduler is scheduler and txn.trans is trans:
                return txn
        txn = CallerTransaction(scheduler, trans)
        watch.waiting.append(txn)
        return txn

