"""Writes that commit with the job's completion: ``dbexecutor.transaction()``.

::

    job (in a child) ── with transaction() as conn ──► the child's one connection to its executor's
                                                       database, opened on first use: the only time a
                                                       child imports SQLAlchemy
    job returns ──► in that same transaction: the job's row done, fenced by its lease token, its
                    dependents released, its attempt row ──► one COMMIT ──► Result(finalized=True)
    job raises, the block raises, or the lease is gone ──► ROLLBACK (nothing the job wrote stays)

A child never touches the database otherwise (see :mod:`dbexecutor.child`).
The statements the completion runs are the store's
(:mod:`dbexecutor.store.completion`); this module only decides when.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from . import serialization

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from .messages import Call, DatabaseAddress
    from .store.completion import JobDatabase

__all__ = ["transaction", "ChildTransactions", "install"]


class ChildTransactions:
    """The job transactions of one child: a connection opened when a job first asks, kept for the next ones."""

    def __init__(self, address: DatabaseAddress, signer: serialization.Signer) -> None:
        self._address = address
        self._signer = signer
        self._db: JobDatabase | None = None
        self._await_lease: Callable[[], None] | None = None

    def job_started(self, await_lease: Callable[[], None] | None) -> None:
        """A job starts; ``await_lease``: what its first :meth:`begin` waits with until its lease has committed (an early call's), or None."""
        self._await_lease = await_lease

    def begin(self) -> Connection:
        """The running job's connection, its transaction begun (the same one on every call during a job)."""
        if self._await_lease is not None:
            # Before BEGIN, holding nothing: a fenced completion needs the lease committed, and
            # waiting with the transaction open would hold, on SQLite, the write lock the
            # parent's next tick needs before it reads the question (AwaitCommit).
            wait, self._await_lease = self._await_lease, None
            wait()
        if self._db is None:
            # Here, not at import: a child whose jobs never ask stays without SQLAlchemy.
            from .store.completion import JobDatabase

            self._db = JobDatabase(self._address.url, self._address.prefix, self._signer)
        return self._db.begin()

    @property
    def open(self) -> bool:
        """Whether the running job has a transaction open."""
        return self._db is not None and self._db.open

    def rollback(self) -> None:
        """Roll back the running job's transaction, if it has one (the job may begin another)."""
        if self._db is not None:
            self._db.rollback()

    def end(self, call: Call, ok: bool, blob: bytes, error: str | None, started: float) -> tuple[bool, bytes, str | None, bool]:
        """End a job that opened a transaction: commit it with the job's completion, or roll it back.

        Returns ``(ok, blob, error, finalized)``: ``finalized`` when the row is
        done already (the parent must not finish it again). A commit that
        fails fails the attempt with the database's error (the job's writes
        are gone with it); a lost lease rolls back and reports the result as
        usual, for the parent's fenced finish to discard.
        """
        assert self._db is not None
        if not ok:
            self._db.rollback()
            return ok, blob, error, False
        try:
            return ok, blob, error, self._db.complete(call.job_id, call.attempt, blob, started)
        except Exception as failure:  # noqa: BLE001 - the job's outcome now: its writes did not commit
            tb = serialization.format_remote_traceback(failure)
            dumped = serialization.dump_exception(failure, remote_tb=tb, signer=self._signer)
            return False, dumped, serialization.exception_summary(failure), False


_current: ChildTransactions | None = None


def install(transactions: ChildTransactions | None) -> None:
    """Where :func:`transaction` gets its connection in this process (a child installs its own)."""
    global _current
    _current = transactions


@contextmanager
def transaction() -> Iterator[Connection]:
    """Inside a job: a SQLAlchemy ``Connection`` to the executor's database whose writes commit with the job's completion.

    Use it as ``with dbexecutor.transaction() as conn:`` and write through
    ``conn`` inside the block (README, "Exactly-once writes to the job
    database", has an example).

    Leaving the block does not commit: the transaction commits when the job
    returns, in one commit with the job's row marked done (and its result),
    fenced by the attempt's lease token. An attempt that lost its lease, a
    job that raises, and an exception that leaves the block all roll back
    everything written through it. Entering the block again during the same
    job gives the same connection and transaction.

    On SQLite the transaction holds the database's one write lock from the
    block's start until the job returns: every other writer (the executor
    included) waits meanwhile, so open it late and return soon after.
    Outside a job run by dbexecutor it raises ``RuntimeError``.
    """
    current = _current
    if current is None:
        raise RuntimeError("dbexecutor.transaction() works only inside a job run by a DBExecutor or a worker")
    conn = current.begin()
    try:
        yield conn
    except BaseException:
        current.rollback()
        raise
