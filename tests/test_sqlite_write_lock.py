"""SQLite: a write transaction waits for the write lock in short tries, not in SQLite's long sleeps.

SQLite-only by nature: PostgreSQL and MariaDB lock rows and wake a waiter
when the lock is released; SQLite has one file lock, and its own busy handler
sleeps up to 100 ms between tries. Several executors sharing one file lost
whole job lengths to it (issue 16's scale-out benchmark).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from dbexecutor.dialects import resolve
from dbexecutor.store.database import Database


def _database(path: Any, lock_wait: float | None = None) -> Database:
    driver = resolve(f"sqlite:///{path}")
    if lock_wait is not None:
        driver.lock_wait = lock_wait  # type: ignore[attr-defined]
    return Database(driver)


def _hold_write_lock(path: Any, seconds: float, holding: threading.Event) -> threading.Thread:
    """Another connection (not dbexecutor's) holds the write lock for ``seconds``."""

    def hold() -> None:
        other = sqlite3.connect(str(path), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        holding.set()
        time.sleep(seconds)
        other.execute("COMMIT")
        other.close()

    thread = threading.Thread(target=hold)
    thread.start()
    return thread


def _tries(database: Database) -> list[str]:
    """Every ``BEGIN IMMEDIATE`` the pooled connection's sqlite3 module runs from now on."""
    seen: list[str] = []
    with database.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        raw.set_trace_callback(lambda sql: seen.append(sql) if sql.startswith("BEGIN IMMEDIATE") else None)
    return seen


def _busy_timeout(database: Database) -> int:
    with database.engine.connect() as conn:
        return int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one())


def test_a_writer_tries_again_often_while_the_lock_is_held_then_gets_it(tmp_path: Any) -> None:
    database = _database(tmp_path / "jobs.db")
    try:
        database.txn(lambda conn: conn.exec_driver_sql("CREATE TABLE t (x INTEGER)"))
        tries = _tries(database)
        holding = threading.Event()
        holder = _hold_write_lock(tmp_path / "jobs.db", 0.3, holding)
        holding.wait(5)
        database.txn(lambda conn: conn.exec_driver_sql("INSERT INTO t VALUES (1)"), tries=1)
        holder.join()
        # SQLite's busy handler would retry inside one statement (one trace, in
        # sleeps of up to 100 ms); tries at most 1 ms apart make hundreds in 0.3 s.
        assert len(tries) >= 30, len(tries)
        assert database.txn(lambda conn: conn.exec_driver_sql("SELECT count(*) FROM t").scalar_one()) == 1
        # Statements other than the start of a write transaction keep the busy handler.
        assert _busy_timeout(database) == 30_000
    finally:
        database.close()


def test_a_writer_gives_up_after_the_lock_wait_with_database_is_locked(tmp_path: Any) -> None:
    database = _database(tmp_path / "jobs.db", lock_wait=0.2)
    try:
        database.txn(lambda conn: conn.exec_driver_sql("CREATE TABLE t (x INTEGER)"))
        holding = threading.Event()
        holder = _hold_write_lock(tmp_path / "jobs.db", 1.0, holding)
        holding.wait(5)
        started = time.monotonic()
        with pytest.raises(OperationalError, match="database is locked"):
            database.txn(lambda conn: conn.exec_driver_sql("INSERT INTO t VALUES (1)"), tries=1)
        waited = time.monotonic() - started
        holder.join()
        assert database.driver.is_transient(OperationalError("", {}, sqlite3.OperationalError("database is locked")))
        assert waited >= 0.2  # it did wait its lock_wait, not give up at the first try
        assert _busy_timeout(database) == 200
        database.txn(lambda conn: conn.exec_driver_sql("INSERT INTO t VALUES (1)"), tries=1)
    finally:
        database.close()
