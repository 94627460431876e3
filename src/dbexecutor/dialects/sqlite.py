"""SQLite: one writer at a time, so every write transaction is ``BEGIN IMMEDIATE``."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Sequence
from typing import Any
from typing import cast as typed

from sqlalchemy import ColumnElement, Insert, Integer, Select, String, Table, bindparam, cast, event, func, insert, select, text
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.types import Float, LargeBinary, NullType, TypeDecorator

from ..errors import ConfigurationError, DBExecutorError
from .base import Driver

__all__ = ["SQLiteDriver"]


class _JsonList(TypeDecorator[Any]):
    """A list of ids (``item=int``) or names (``item=str``) bound as one JSON text, unpacked by ``json_each``."""

    impl = String
    cache_ok = True  # the cache key is ``item``, the one argument

    def __init__(self, item: type[int] | type[str]) -> None:
        super().__init__()
        self.item = item

    def process_bind_param(self, value: Any, dialect: Any) -> str:
        return json.dumps([self.item(v) for v in value])

    def process_literal_param(self, value: Any, dialect: Any) -> str:
        return "'" + json.dumps([self.item(v) for v in value]).replace("'", "''") + "'"


def _in_json(column: Any, name: str, item: type[int] | type[str]) -> ColumnElement[bool]:
    """``column`` is one of the values of the JSON list bound to ``name`` (see ``_JsonList``)."""
    each = func.json_each(bindparam(name, type_=_JsonList(item))).table_valued("value")
    return typed(ColumnElement[bool], column.in_(select(each.c.value)))


class SQLiteDriver(Driver):
    """SQLite through the standard library's ``sqlite3``: WAL, a busy timeout, ``BEGIN IMMEDIATE`` for writes."""

    repeats_index_predicate = True
    drops_constraints = False  # a constraint is part of CREATE TABLE; changing one rebuilds the table

    label = "SQLite"
    explain_prefix = "EXPLAIN QUERY PLAN "
    single_writer = True
    leases_durable_submits = True
    reserves_ids = True
    lock_wait = 30.0  # seconds a statement waits for another connection's lock before "database is locked"

    def __init__(self, url: URL) -> None:
        super().__init__(url)
        db = url.database or ""
        if url.host:
            # "sqlite://jobs.db" parses as a host named jobs.db and no file at all.
            path = url.host + (f"/{db}" if db else "")
            raise ConfigurationError(
                f"'sqlite://{path}' names no file (SQLite has no host); write 'sqlite:///{path}' "
                "(three slashes for a relative path, four for an absolute one)"
            )
        if db in ("", ":memory:") or url.query.get("mode") == "memory" or db.startswith("file::memory:"):
            raise ConfigurationError(
                "an in-memory SQLite database cannot be shared with the child processes that run the jobs; "
                "use a file, e.g. DBExecutor('sqlite:///jobs.db')"
            )
        if not db.startswith("file:"):
            # Children may start in another working directory (a forkserver
            # keeps the one it started in): pin the file now.
            self.url = url.set(database=os.path.abspath(db))

    def server_time(self, conn: Connection) -> float:
        # The "server" is this machine's clock, read by SQLite's C library as
        # every process on the file reads it (a Julian day number, in days).
        return float(conn.exec_driver_sql("SELECT (julianday('now') - 2440587.5) * 86400.0").scalar_one())

    def database_identity(self, conn: Connection) -> tuple[Any, ...]:
        # The main database's file, as SQLite opened it (symbolic links resolved here).
        rows = conn.exec_driver_sql("PRAGMA database_list").all()
        path = next((r[2] for r in rows if r[1] == "main"), "") or ""
        return ("sqlite", os.path.realpath(path) if path else "")

    def database_missing(self) -> bool:
        db = self.url.database or ""
        return not db.startswith("file:") and not os.path.exists(db)

    def engine_options(self) -> dict[str, Any]:
        # The driver's own busy handler waits for locks other than the one a
        # write transaction starts with (see _begin_immediate); 30 s covers
        # any claim or finalize transaction by a wide margin.
        return {"connect_args": {"timeout": self.lock_wait, "check_same_thread": False}}

    def setup_engine(self, engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, _record: Any) -> None:
            # Take transaction control away from the sqlite3 module so that
            # the "begin" hook below decides how a transaction starts.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            # Switching a new file to WAL needs an exclusive lock, and SQLite may
            # answer "locked" at once (no busy handler) while another process
            # opens the same new file: try again for a while.
            for attempt in range(200):
                try:
                    cur.execute("PRAGMA journal_mode=WAL")
                    break
                except sqlite3.OperationalError as error:
                    if "locked" not in str(error) and "busy" not in str(error) or attempt == 199:
                        raise
                    time.sleep(0.05)
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            # Reads that must not block writers ask for a deferred transaction;
            # everything else takes the write lock up front, which is what
            # makes read-then-update atomic without row locks.
            if conn.get_execution_options().get("dbexecutor_read_only"):
                conn.exec_driver_sql("BEGIN")
            else:
                _begin_immediate(conn, self.lock_wait)

    def insert_job_rows(
        self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]], notify: tuple[str, str] | None = None
    ) -> list[int]:
        """Ids counted on from the table's sequence, then one plain multi-row insert with them.

        Every write transaction here holds the database's write lock (``BEGIN
        IMMEDIATE``, or the write a caller's transaction starts with), so no
        other connection can take the ids meanwhile. An ``INSERT ... RETURNING``
        that must keep the rows' order runs one statement per row.
        """
        if len(rows) == 1 or notify is not None:
            return super().insert_job_rows(conn, table, rows, notify)
        ids = self.reserve_ids(conn, table, len(rows))
        self.insert_rows(conn, table, [{**row, "id": job_id} for row, job_id in zip(rows, ids)])
        return ids

    def reserve_ids(self, conn: Connection, table: Table, n: int) -> list[int]:
        """The next ``n`` ids after the largest given out: the write lock this transaction holds keeps them its own."""
        # The sequence remembers ids whose rows were purged (AUTOINCREMENT); the
        # largest id covers a table made without it. Inserting the rows moves the sequence past them.
        last = conn.execute(self._derived(("last_id", table.name), lambda: _last_id(conn, table))).scalar_one()
        return list(range(int(last) + 1, int(last) + 1 + n))

    def executemany(
        self, conn: Connection, stmt: Any, params: Sequence[dict[str, Any]], columns: tuple[str, ...] | None = None
    ) -> int:
        """Through ``sqlite3``'s own ``executemany``, each parameter set a plain tuple.

        SQLAlchemy builds and type-processes every parameter set of a
        statement in Python; with a few dozen rows per tick (jobs, attempts,
        the guarded "mark done") that was a fifth of the loop's time at
        one-by-one throughput. The statement is compiled once to positional
        SQL: every column here binds as ``sqlite3`` takes it (numbers, text,
        bytes, None), and ``_positional`` refuses any other type.
        """
        given = tuple(params[0])
        # Statements compare by identity: the key keeps the statement (a cached one) alive.
        compiled = self._derived(("positional", stmt, columns, given), lambda: _positional(conn, stmt, columns, given))
        if len(params) == 1:
            return int(conn.exec_driver_sql(compiled.sql, compiled.bind(params[0])).rowcount)
        return int(conn.exec_driver_sql(compiled.sql, [compiled.bind(p) for p in params]).rowcount)

    def connect_failure(self, error: DBAPIError) -> DBExecutorError:
        message = str(error.orig).lower()
        path = self.url.database
        if "file is not a database" in message or "malformed" in message:
            return ConfigurationError(f"{path} is not an SQLite database (or it is damaged); point the URL at another file")
        if "unable to open" in message:
            return ConfigurationError(f"cannot open or create the SQLite database {path} (does its directory exist, is it writable?)")
        return super().connect_failure(error)

    def is_transient(self, error: DBAPIError) -> bool:
        message = str(error.orig).lower()
        return super().is_transient(error) or "database is locked" in message or "database is busy" in message

    def for_claim(self, stmt: Select[Any]) -> Select[Any]:
        return stmt  # BEGIN IMMEDIATE already holds the only lock there is

    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        return stmt

    def insert_ignore(self, table: Table) -> Insert:
        return insert(table).prefix_with("OR IGNORE")

    def bucket(self, offset: Any, width: Any) -> ColumnElement[Any]:
        # floor() exists only where SQLite was built with its math functions;
        # a cast truncates, which is the floor of a number that is not negative.
        return cast(offset / width, Integer)

    def in_ids(self, column: Any, name: str) -> ColumnElement[bool]:
        # One JSON text parameter, unpacked by json_each: the statement's text
        # stays the same whatever the number of ids. An IN list is a new text
        # for each length, and the sqlite3 module keeps up to 128 prepared
        # statements per connection, each holding its list's parameters: the
        # parent's memory grew by megabytes as batch sizes varied.
        return _in_json(column, name, int)

    def in_names(self, column: Any, name: str) -> ColumnElement[bool]:
        # One JSON text, as in_ids. An expanding IN list is written into the
        # statement's text at every execution: SQLAlchemy's pass over the text
        # cost 96 us of the submitting thread's CPU for each durable submit's
        # leased INSERT (whose claim check names the executor's queues).
        return _in_json(column, name, str)


# Seconds between two tries for the write lock: short at first, since the
# transactions that hold it take about a millisecond, and never long, so a
# waiter is never asleep long after the lock became free.
_FIRST_RETRY = 0.00005
_LONGEST_RETRY = 0.001


class _Positional:
    """A statement compiled for ``sqlite3`` (``?`` placeholders), and how to bind one parameter set to it."""

    __slots__ = ("sql", "_names", "_spec")

    def __init__(self, sql: str, spec: list[tuple[str, bool, Any]]) -> None:
        self.sql = sql
        # Every placeholder from the parameter set (the common case), or some
        # from the statement's own values (``state = 'done'``, ``error = NULL``).
        self._names = tuple(n for n, _, _ in spec) if all(given for _, given, _ in spec) else None
        self._spec = spec

    def bind(self, params: dict[str, Any]) -> tuple[Any, ...]:
        """The tuple of ``params`` (and the statement's own values) in placeholder order."""
        if self._names is not None:
            return tuple([params[n] for n in self._names])
        return tuple([params[n] if given else value for n, given, value in self._spec])


def _positional(conn: Connection, stmt: Any, columns: tuple[str, ...] | None, given: tuple[str, ...]) -> _Positional:
    """Compile ``stmt`` once for :meth:`SQLiteDriver.executemany` (``given``: the keys of its parameter sets)."""
    compiled = stmt.compile(dialect=conn.dialect, column_keys=None if columns is None else list(columns))
    if not compiled.positional or compiled.positiontup is None:
        raise TypeError(f"{conn.dialect.name} does not bind positionally")
    for name in compiled.positiontup:
        kind = compiled.binds[name].type
        # A type that converts its values (a TypeDecorator, dates) would be skipped here.
        if isinstance(kind, TypeDecorator) or not isinstance(kind, _PLAIN_TYPES):
            raise TypeError(f"parameter {name!r} is a {kind!r}, which sqlite3 would not take as it is")
    spec = [
        (name, name in given, None if name in given else compiled.binds[name].effective_value)
        for name in compiled.positiontup
    ]
    return _Positional(str(compiled), spec)


#: The column types whose values sqlite3 binds unconverted (for ``_positional``).
_PLAIN_TYPES = (Integer, Float, String, LargeBinary, NullType)


def _last_id(conn: Connection, table: Table) -> Any:
    """A statement reading the largest id ``table`` has given out: its AUTOINCREMENT sequence, or its largest id.

    Tables made before ``jobs`` had AUTOINCREMENT have no sequence, and a
    database with no such table has no ``sqlite_sequence`` to read.
    """
    name = conn.dialect.identifier_preparer.quote(table.name)
    largest = f"coalesce((SELECT max(id) FROM {name}), 0)"
    if conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").first() is None:
        return text(f"SELECT {largest}")
    seq = "coalesce((SELECT seq FROM sqlite_sequence WHERE name = :p_table), 0)"
    return text(f"SELECT max({seq}, {largest})").bindparams(p_table=table.name)


def _begin_immediate(conn: Connection, patience: float) -> None:
    """``BEGIN IMMEDIATE``, waiting up to ``patience`` seconds for the write lock in sleeps of at most 1 ms.

    SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50,
    50 and then 100 ms between tries, whatever happened meanwhile. With
    several processes taking turns on one file, a claim that lost one race
    slept 50 or 100 ms while the lock was free most of that time: executors
    on a shared SQLite file started their first jobs up to 200 ms late and
    left children idle between jobs. Here the busy handler is off while the
    write transaction starts, and the tries come at most 1 ms apart.
    """
    raw = conn.connection.dbapi_connection
    assert raw is not None
    raw.execute("PRAGMA busy_timeout = 0")
    try:
        deadline = time.monotonic() + patience
        delay = _FIRST_RETRY
        while True:
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as error:
                text_ = str(error)
                if "locked" not in text_ and "busy" not in text_ or time.monotonic() >= deadline:
                    break
            time.sleep(delay)
            delay = min(delay * 2, _LONGEST_RETRY)
        # Once more through SQLAlchemy, which raises what it raises for any statement.
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    finally:
        raw.execute(f"PRAGMA busy_timeout = {int(patience * 1000)}")
