"""Submitting through a caller's connection, inside the caller's open transaction.

Nothing here commits or tries again: the transaction is the caller's, and the
jobs exist only if it commits. ``Store.check_same_database`` refuses a
connection to another database first (:func:`refuse_other`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from ..errors import ConfigurationError
from ..records import NewJob, Submitted
from . import submit
from .context import Context

__all__ = ["IDENTITY_KEY", "insert", "refuse_other"]

#: Where a caller's pooled connection keeps the identity of the database it reaches (read once).
IDENTITY_KEY = "dbexecutor.database_identity"


def refuse_other(ctx: Context, conn: Connection, ours: tuple[Any, ...], url: str) -> None:
    """Raise ``ConfigurationError`` unless ``conn`` reaches the database whose identity is ``ours`` (at ``url``, masked)."""
    theirs = conn.info.get(IDENTITY_KEY)
    if theirs is None:
        theirs = conn.info[IDENTITY_KEY] = ctx.driver.database_identity(conn)
    if theirs != ours:
        raise ConfigurationError(
            f"the connection given to submit reaches another database ({', '.join(map(str, theirs[1:]))}) than "
            f"the executor's {url} ({', '.join(map(str, ours[1:]))}): "
            "a job can be submitted only through a connection to the executor's own database"
        )


def insert(
    ctx: Context, conn: Connection, jobs: Sequence[NewJob], now: float
) -> tuple[list[Submitted], list[str], dict[str, int | None]]:
    """Insert ``jobs`` (keyed or not, in order) through ``conn``, in its open transaction.

    Returns the rows, the notifications to send once it commits (databases
    without NOTIFY; PostgreSQL's are queued in the transaction itself), and
    the groups written.
    """
    unsent = ctx.unsent()
    unsent.clear()
    if ctx.driver.single_writer:
        # The upstream rows read next decide the new rows' states. On SQLite the
        # caller's driver may read them outside any transaction (it begins one
        # before its first write): an upstream that finished in between would
        # leave its new dependent waiting forever. The write lock, taken first,
        # holds every other writer (and so every finish) off until the commit.
        conn.execute(ctx.sql.take_write_lock)
    groups = submit.ensure_groups(ctx, conn, jobs)
    rows: list[Submitted] = []
    i = 0
    while i < len(jobs):
        if jobs[i].key is not None:
            rows.append(submit.insert_job(ctx, conn, jobs[i], now)[0])
            i += 1
            continue
        end = i
        while end < len(jobs) and jobs[end].key is None:
            end += 1
        out = submit.insert_many(ctx, conn, jobs[i:end], now)
        submit.notify_changes(ctx, conn, jobs[i:end], out, now)
        rows += out
        i = end
    notices = list(unsent)
    unsent.clear()
    return rows, notices, groups
