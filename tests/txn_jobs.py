"""Jobs for the transaction tests: they write through ``dbexecutor.transaction()`` (imported in the child)."""

from __future__ import annotations

import os
import time
from typing import Any

import dbexecutor


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def insert(table: str, value: Any, fail: bool = False) -> Any:
    """Insert ``value`` into ``table`` through the job's transaction; raise afterwards if ``fail``."""
    from sqlalchemy import text

    with dbexecutor.transaction() as conn:
        conn.execute(text(f"INSERT INTO {table} (v) VALUES (:v)"), {"v": str(value)})
    if fail:
        raise ValueError(f"failed after writing {value!r}")
    return value


def sleep_then_insert(table: str, value: Any, seconds: float) -> Any:
    """Sleep ``seconds``, then insert ``value`` through the job's transaction (opened only then)."""
    from sqlalchemy import text

    time.sleep(seconds)
    with dbexecutor.transaction() as conn:
        conn.execute(text(f"INSERT INTO {table} (v) VALUES (:v)"), {"v": str(value)})
    return value


def insert_then_wait(table: str, value: Any, marker: str, pid_path: str, gate: str) -> Any:
    """First run: insert, write the pid, then wait for ``gate`` (to be killed meanwhile); later runs: insert and return."""
    from sqlalchemy import text

    first = not os.path.exists(marker)
    _write_atomically(marker, "1")
    with dbexecutor.transaction() as conn:
        conn.execute(text(f"INSERT INTO {table} (v) VALUES (:v)"), {"v": str(value)})
    if first:
        _write_atomically(pid_path, str(os.getpid()))
        while not os.path.exists(gate):
            time.sleep(0.05)
    return value


def frozen_first(table: str, marker: str, pid_path: str, seconds: float, write_first: bool) -> str:
    """First run: write the pid, sleep (to be frozen), write ``first``; later runs write ``second``.

    ``write_first``: the first run writes before its sleep (its transaction
    stays open while it is frozen), else after it.
    """
    from sqlalchemy import text

    def write(value: str) -> None:
        with dbexecutor.transaction() as conn:
            conn.execute(text(f"INSERT INTO {table} (v) VALUES (:v)"), {"v": value})

    if os.path.exists(marker):
        write("second")
        return "second"
    _write_atomically(marker, "1")
    if write_first:
        write("first")
    _write_atomically(pid_path, str(os.getpid()))
    time.sleep(seconds)
    if not write_first:
        write("first")
    return "first"


def block_raises(table: str, value: Any) -> str:
    """Write in a block that raises, catch it, and return: the block's writes are rolled back."""
    from sqlalchemy import text

    try:
        with dbexecutor.transaction() as conn:
            conn.execute(text(f"INSERT INTO {table} (v) VALUES (:v)"), {"v": str(value)})
            raise KeyError("inside the block")
    except KeyError:
        pass
    return "caught"


def modules_after_transaction(table: str) -> bool:
    """Whether SQLAlchemy is imported in this child once a transaction was used (it must be)."""
    import sys

    insert(table, "probe")
    return "sqlalchemy" in sys.modules


def insert_commit_unanswered(table: str, value: Any, made: bool = True) -> Any:
    """Insert ``value`` through the job's transaction, whose ``COMMIT`` then fails in the client, made on the server or not.

    As if the connection dropped between the server's commit and its answer
    (``made``), or before the commit reached it: the driver's own
    lost-connection error (on SQLite, which has no connection, its transient
    "database is locked").
    """
    from sqlalchemy import text

    with dbexecutor.transaction() as conn:
        conn.execute(text(f"INSERT INTO {table} (v) VALUES (:v)"), {"v": str(value)})
        dialect = conn.engine.dialect
    real = dialect.do_commit

    def do_commit(dbapi_connection: Any) -> None:
        del dialect.do_commit  # once: the class's own again
        if made:
            real(dbapi_connection)
        if dialect.name == "sqlite":
            import sqlite3

            raise sqlite3.OperationalError("database is locked")
        if dialect.name == "postgresql":
            import psycopg

            raise psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")
        import pymysql

        raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")

    dialect.do_commit = do_commit  # type: ignore[method-assign]
    return value
