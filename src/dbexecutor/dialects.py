"""One small class per database: the only place that knows dialect names.

Each class answers the questions where databases differ (how to begin a write
transaction, how to lock rows for a claim, how to serialise schema creation,
which errors are worth retrying, which server versions are too old) through
capability flags and small methods, River-driver style. ``for_url`` picks the
class once, from the URL, before any connection is made.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Insert,
    Select,
    Table,
    any_,
    bindparam,
    event,
    func,
    insert,
    literal_column,
    select,
    text,
    true,
)
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from . import schema
from .errors import ConfigurationError

_FINISH_CHUNK = 500  # rows per set-based finishing statement (3 to 5 parameters each)
_PACKET_BYTES = 4 << 20  # text and bytes per multi-row statement: well under MySQL's max_allowed_packet


def _packets(rows: Sequence[dict[str, Any]], limit: int = _PACKET_BYTES) -> Iterator[Sequence[dict[str, Any]]]:
    """``rows`` in runs of at most ``_FINISH_CHUNK`` rows and about ``limit`` bytes of data."""
    start, size = 0, 0
    for n, row in enumerate(rows):
        weight = sum(len(v) for v in row.values() if isinstance(v, (bytes, str)))
        if n > start and (n - start >= _FINISH_CHUNK or size + weight > limit):
            yield rows[start:n]
            start, size = n, 0
        size += weight
    if start < len(rows):
        yield rows[start:]

__all__ = ["Dialect", "resolve"]

log = logging.getLogger("dbexecutor.listen")


class Dialect:
    """Behaviour shared by the databases with row locks (PostgreSQL, MySQL/MariaDB)."""

    #: Human name, for messages.
    label: ClassVar[str] = "database"
    #: ``pip install 'dbexecutor[extra]'`` brings the driver.
    extra: ClassVar[str | None] = None
    supports_partial_indexes: ClassVar[bool] = True

    def __init__(self, url: URL) -> None:
        self.url = url

    # -- engine ---------------------------------------------------------------

    def database_missing(self) -> bool:
        """True if connecting would create the database (an SQLite file that is not there yet)."""
        return False

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments for ``create_engine``."""
        # No pre-ping: it would cost a round trip per transaction. A connection that
        # died in the pool fails its first statement, and Store._txn runs the
        # transaction again on a fresh one (SQLAlchemy invalidates the pool).
        return {"pool_size": 4, "max_overflow": 8}

    def setup_engine(self, engine: Engine) -> None:
        """Install connection events (nothing by default)."""

    def check_server(self, conn: Connection) -> None:
        """Raise ``ConfigurationError`` if the server cannot run dbexecutor."""

    # -- statements -----------------------------------------------------------

    def for_claim(self, stmt: Select[Any]) -> Select[Any]:
        """Lock the selected ready rows, skipping rows another claim holds."""
        return stmt.with_for_update(skip_locked=True)

    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        """Lock the selected rows until the transaction ends (waiting if needed)."""
        return stmt.with_for_update()

    def id_in(self, column: Any, ids: Select[Any]) -> ColumnElement[bool]:
        """``column`` is one of the ids ``ids`` selects (for an UPDATE that claims them)."""
        return column.in_(ids)

    def in_ids(self, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
        """``column`` is one of ``ids`` (a list of job ids)."""
        return column.in_(list(ids))

    def edges_out(self, deps: Table, jobs: Table, ids: Sequence[int]) -> Select[Any]:
        """``(job_id, depends_on_id, batch)`` of every edge out of the jobs ``ids`` (``batch``: the dependent's)."""
        stmt = select(deps.c.job_id, deps.c.depends_on_id, jobs.c.batch).join(jobs, jobs.c.id == deps.c.job_id)
        return stmt.where(self.in_ids(deps.c.depends_on_id, ids))

    @contextlib.contextmanager
    def schema_lock(self, conn: Connection, name: str) -> Iterator[None]:
        """Serialise schema creation between processes (inside ``conn``'s transaction)."""
        yield

    def insert_ignore(self, table: Table) -> Insert:
        """An ``INSERT`` that silently skips rows whose primary key exists."""
        return insert(table).prefix_with("IGNORE")

    def reserve_ids(self, conn: Connection, table: Table, n: int) -> list[int] | None:
        """``n`` new ids for ``table``'s ``id`` column, ascending; None: let each INSERT return its id."""
        return None

    def insert_many(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> bool:
        """Insert ``rows`` (same keys each) in one set-based statement; False: not here, use an executemany."""
        return False

    def insert_returning_ids(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> list[int] | None:
        """Insert ``rows`` and return their new ids in row order; None: not here (the store falls back)."""
        return None

    #: The largest payload a row can hold here (bytes; None: no limit worth checking).
    max_payload: int | None = None
    #: Data per multi-row statement (see ``_packets``).
    packet_bytes: int = _PACKET_BYTES

    def finish_many(
        self, conn: Connection, jobs: Table, rows: Sequence[tuple[int, int, bytes]], now: float
    ) -> set[int] | None:
        """Mark ``(id, attempt, result)`` done where the attempt still holds an active lease.

        Set-based statements; returns the ids known to be done by them. The
        store reads back the rows left out (a lost lease, or a statement that
        only counts its rows and came up short). None: not here (the store
        uses an executemany).
        """
        return None

    # -- notifications --------------------------------------------------------

    #: Whether :meth:`notify` and :meth:`listen` do anything (PostgreSQL only).
    supports_notify: ClassVar[bool] = False

    def notify(self, conn: Connection, channel: str, payload: str) -> None:
        """Queue a notification, delivered when ``conn``'s transaction commits."""

    def listen(
        self,
        engine: Engine,
        channel: str,
        callback: Callable[[str | None], None],
        stop: threading.Event,
        url: URL | None = None,
    ) -> threading.Thread | None:
        """Start a thread that calls ``callback(payload)`` per notification, until ``stop`` is set.

        ``callback(None)`` means notifications may have been missed (the
        listening connection was (re)opened): look at everything. ``url``: where
        to listen, if not at the engine's URL (``listen_url``). Returns None
        where the database has no notifications, so polling is all there is.
        """
        return None

    explain_prefix: ClassVar[str] = "EXPLAIN "

    def explain(self, conn: Connection, stmt: Any) -> list[str]:
        """The query plan of ``stmt``, one text line per plan row."""
        sql = str(stmt.compile(conn, compile_kwargs={"literal_binds": True}))
        return [" | ".join(str(v) for v in row) for row in conn.exec_driver_sql(self.explain_prefix + sql)]

    def is_transient(self, error: DBAPIError) -> bool:
        """Whether the failed transaction is worth running again (deadlock, busy, lost connection)."""
        return bool(error.connection_invalidated)


class SQLiteDialect(Dialect):
    """SQLite: no row locks, so every write transaction is ``BEGIN IMMEDIATE``."""

    label = "SQLite"
    explain_prefix = "EXPLAIN QUERY PLAN "

    def __init__(self, url: URL) -> None:
        super().__init__(url)
        db = url.database or ""
        if db in ("", ":memory:") or url.query.get("mode") == "memory" or db.startswith("file::memory:"):
            raise ConfigurationError(
                "an in-memory SQLite database cannot be shared with the child processes that run the jobs; "
                "use a file, e.g. DBExecutor('sqlite:///jobs.db')"
            )
        if not db.startswith("file:"):
            # Children may start in another working directory (a forkserver
            # keeps the one it started in): pin the file now.
            self.url = url.set(database=os.path.abspath(db))

    def database_missing(self) -> bool:
        db = self.url.database or ""
        return not db.startswith("file:") and not os.path.exists(db)

    def engine_options(self) -> dict[str, Any]:
        # The driver's own busy handler waits for the write lock; 30 s covers
        # any claim or finalize transaction by a wide margin.
        return {"connect_args": {"timeout": 30.0, "check_same_thread": False}}

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
                conn.exec_driver_sql("BEGIN IMMEDIATE")

    def for_claim(self, stmt: Select[Any]) -> Select[Any]:
        return stmt  # BEGIN IMMEDIATE already holds the only lock there is

    def insert_ignore(self, table: Table) -> Insert:
        return insert(table).prefix_with("OR IGNORE")

    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        return stmt

    def in_ids(self, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
        # One JSON text parameter, unpacked by json_each: the statement's text
        # stays the same whatever the number of ids. An IN list is a new text
        # for each length, and the sqlite3 module keeps up to 128 prepared
        # statements per connection, each holding its list's parameters: the
        # parent's memory grew by megabytes as batch sizes varied.
        each = func.json_each(bindparam(None, json.dumps(list(ids)))).table_valued("value")
        return column.in_(select(each.c.value))

    def is_transient(self, error: DBAPIError) -> bool:
        message = str(error.orig).lower()
        return super().is_transient(error) or "database is locked" in message or "database is busy" in message


class PostgreSQLDialect(Dialect):
    """PostgreSQL through psycopg 3: ``FOR UPDATE SKIP LOCKED`` at READ COMMITTED."""

    label = "PostgreSQL"
    extra = "postgresql"
    _TRANSIENT = {"40P01", "40001", "55P03", "57P01", "57P02", "57P03"}

    @contextlib.contextmanager
    def schema_lock(self, conn: Connection, name: str) -> Iterator[None]:
        # Transaction-scoped advisory lock: released by the commit that publishes the tables.
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(name.encode())})
        yield

    def insert_ignore(self, table: Table) -> Insert:
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()

    def engine_options(self) -> dict[str, Any]:
        # Nothing is prepared on the server (psycopg's prepare_threshold=None:
        # each statement is parsed and planned where it runs, as an unnamed
        # statement), and nothing is SET on a connection. Both are session
        # state, and a transaction pooler (PgBouncer in transaction mode, which
        # before 1.21 knows nothing of prepared statements) hands each
        # transaction whichever server connection is free: a statement psycopg
        # prepared on one ("_pg3_0") is missing on the next, or another
        # client's "_pg3_0" is already there, and a SET lands on a connection
        # other clients get next, not on the ones this process gets later.
        # Measured against preparing after 5 runs (psycopg's default) with
        # custom plans forced: a claim transaction +0.08 ms, a read of 200
        # rows by id +0.2 ms, one row by id the same; submit-to-result, a
        # burst of 2,000 jobs and a DAG of 1,000 the same within the noise
        # (benchmarks/pg_session_state.py).
        #
        # What the connect-time settings did is covered without them:
        # - plan_cache_mode = force_custom_plan kept the server from reusing a
        #   generic plan made while a table was small (with autovacuum off
        #   nothing replaced it, and it kept scanning the table as it grew:
        #   129 ms for 500 ids by primary key in the random-DAG benchmark;
        #   planned afresh, 4 ms). An unnamed statement gets a custom plan
        #   every time, for its own parameters.
        # - jit = off kept a statement estimated without statistics from
        #   passing jit_above_cost (a 150 ms compile on a 1 ms lookup, before
        #   edges_out looked edges up by index). JIT is now the server's
        #   setting. On never-analyzed tables of a million jobs and a million
        #   edges the highest estimate of a run's statements was 44,500
        #   (edges_out), under the default jit_above_cost of 100,000; the
        #   estimates grow with the tables, so a server that never gathers
        #   statistics should turn JIT off for the role (README, "PgBouncer").
        return {**super().engine_options(), "connect_args": {"prepare_threshold": None}}

    def edges_out(self, deps: Table, jobs: Table, ids: Sequence[int]) -> Select[Any]:
        # Built once per pair of tables: building the LATERAL subquery and its
        # column collections took ~1 ms of Python on every finish.
        key = ("edges_out", deps.name, jobs.name)
        stmt = self._statements.get(key)
        if stmt is None:
            stmt = self._statements[key] = self._edges_out(deps, jobs)
        return stmt.params(e_ids=list(ids))  # type: ignore[no-any-return]

    @staticmethod
    def _edges_out(deps: Table, jobs: Table) -> Select[Any]:
        # One index lookup per upstream id, whatever the planner believes:
        # without statistics (before the first ANALYZE, or with autovacuum
        # off) it takes "depends_on_id = ANY(ids)" to match a large share of
        # the edge table for a few hundred ids and hash-joins sequential scans
        # of both tables, so every finish got slower as the tables grew.
        # OFFSET 0 keeps the LATERAL subquery from being flattened into
        # that join again.
        u = func.unnest(bindparam("e_ids", type_=ARRAY(BigInteger))).table_valued("id").render_derived(name="u")
        # The dependent's batch flag as a primary-key lookup per edge: joined,
        # the same missing statistics made the planner hash-join a scan of
        # the jobs table once per upstream id.
        batch = select(jobs.c.batch).where(jobs.c.id == deps.c.job_id).scalar_subquery()
        edges = (
            select(deps.c.job_id, deps.c.depends_on_id, batch.label("batch"))
            .where(deps.c.depends_on_id == u.c.id)
            .offset(literal_column("0"))
            .lateral("e")
        )
        return select(edges.c.job_id, edges.c.depends_on_id, edges.c.batch).select_from(u).join(edges, true())

    def id_in(self, column: Any, ids: Select[Any]) -> ColumnElement[bool]:
        # id = ANY(ARRAY(subquery)): the subquery runs once and the update finds
        # its rows through the primary key. With IN (subquery) the planner may
        # hash-join against a sequential scan of the whole table.
        return column == any_(func.array(ids.scalar_subquery()))

    def in_ids(self, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
        # One array parameter: the statement's text stays the same whatever the
        # number of ids, so psycopg and the server prepare it once (an IN list
        # is a new statement for each length, parsed again every time).
        return column == any_(bindparam(None, list(ids), type_=ARRAY(BigInteger)))

    def __init__(self, url: URL) -> None:
        super().__init__(url)
        self._sequences: dict[str, str] = {}
        self._statements: dict[tuple[Any, ...], Any] = {}  # built once: texts and constructs

    # Set-based writes: one statement whose parameters are arrays, unnested on
    # the server. Pipelined or not, one statement per row costs the server
    # (and psycopg) several times more than one statement for the batch.

    def _unnest(self, conn: Connection, table: Table, columns: Sequence[str]) -> str:
        types = [table.c[c].type.compile(dialect=conn.dialect) for c in columns]
        return ", ".join(f"CAST(:a{i} AS {t}[])" for i, t in enumerate(types))

    def insert_many(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> bool:
        columns = list(rows[0])
        first = rows[0]
        # A column with the same value in every row (the group, the function,
        # the lease of a burst leased on insert, ...) is bound once as a
        # scalar: psycopg dumps array elements one by one in Python, and
        # nine such columns of 157 rows cost ~2 ms of a map's insert.
        same = tuple(
            len(rows) > 1 and all(type(row[c]) is type(first[c]) and row[c] == first[c] for row in rows)
            for c in columns
        )
        if all(same):
            same = (False,) + same[1:]  # unnest needs one array, for the number of rows
        key = ("insert", table.name, tuple(columns), same)
        stmt = self._statements.get(key)
        arrays = [c for c, one in zip(columns, same) if not one]
        scalars = [c for c, one in zip(columns, same) if one]
        if stmt is None:
            quote = conn.dialect.identifier_preparer.quote
            picked = {c: f"u.a{k}" for k, c in enumerate(arrays)}
            picked.update({c: f"CAST(:s{k} AS {table.c[c].type.compile(dialect=conn.dialect)})" for k, c in enumerate(scalars)})
            stmt = text(
                f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) "
                f"SELECT {', '.join(picked[c] for c in columns)} FROM unnest({self._unnest(conn, table, arrays)}) "
                f"AS u({', '.join(f'a{k}' for k in range(len(arrays)))})"
            )
            self._statements[key] = stmt
        params = {f"a{k}": [row[c] for row in rows] for k, c in enumerate(arrays)}
        params.update({f"s{k}": first[c] for k, c in enumerate(scalars)})
        conn.execute(stmt, params)
        return True

    def finish_many(
        self, conn: Connection, jobs: Table, rows: Sequence[tuple[int, int, bytes]], now: float
    ) -> set[int] | None:
        key = ("finish", jobs.name)
        stmt = self._statements.get(key)
        if stmt is None:
            quote = conn.dialect.identifier_preparer.quote
            active = ", ".join(f"'{s}'" for s in schema.ACTIVE_STATES)
            stmt = text(
                f"UPDATE {quote(jobs.name)} AS j SET state = '{schema.DONE}', result = u.result, error = NULL, "
                "finished_at = :now, lease_owner = NULL, lease_expires = NULL "
                f"FROM unnest({self._unnest(conn, jobs, ['id', 'attempt', 'result'])}) AS u(id, attempt, result) "
                f"WHERE j.id = u.id AND j.attempt = u.attempt AND j.state IN ({active}) RETURNING j.id"
            )
            self._statements[key] = stmt
        params = {"a0": [r[0] for r in rows], "a1": [r[1] for r in rows], "a2": [r[2] for r in rows], "now": now}
        return {int(i) for i in conn.execute(stmt, params).scalars()}

    def reserve_ids(self, conn: Connection, table: Table, n: int) -> list[int] | None:
        # One round trip for the ids, then one set-based INSERT (insert_many):
        # a multi-row INSERT ... RETURNING is a new long query text for each
        # number of rows.
        seq = self._sequences.get(table.name)
        if seq is None:
            seq = conn.execute(text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": table.name}).scalar_one()
            self._sequences[table.name] = seq
        got = conn.execute(
            text("SELECT nextval(CAST(:s AS regclass)) FROM generate_series(1, :n)"), {"s": seq, "n": n}
        ).scalars()
        return sorted(int(i) for i in got)

    supports_notify = True

    def notify(self, conn: Connection, channel: str, payload: str) -> None:
        # pg_notify() rather than NOTIFY: the payload is a bound parameter.
        conn.execute(text("SELECT pg_notify(:c, :p)"), {"c": channel, "p": payload})

    def listen(
        self,
        engine: Engine,
        channel: str,
        callback: Callable[[str | None], None],
        stop: threading.Event,
        url: URL | None = None,
    ) -> threading.Thread | None:
        # A connection of its own, outside the pool: it sits in LISTEN for the
        # executor's lifetime, in autocommit (notifications arrive between
        # transactions). ``url`` (listen_url) is a direct one when the pool's
        # goes through a transaction pooler.
        target = url if url is not None else self.url
        cargs, cparams = engine.dialect.create_connect_args(target)
        where = f"{target.host or 'localhost'}:{target.port or 5432}"
        thread = threading.Thread(
            target=_pg_listen,
            args=(cargs, cparams, channel, callback, stop, where, url is not None),
            name="dbexecutor-listen",
            daemon=True,
        )
        thread.start()
        return thread

    def is_transient(self, error: DBAPIError) -> bool:
        code = getattr(error.orig, "sqlstate", None)
        if code is None:
            # No SQLSTATE: the connection itself failed (refused while the server restarts, reset, ...).
            return isinstance(error, OperationalError)
        return super().is_transient(error) or code in self._TRANSIENT or code.startswith("08")


class MySQLDialect(Dialect):
    """MySQL >= 8.0.1 and MariaDB >= 10.6 through PyMySQL, InnoDB, READ COMMITTED."""

    label = "MySQL/MariaDB"
    extra = "mysql"
    supports_partial_indexes = False
    # Deadlock, lock wait timeout, server gone away, lost connection, server shutting down.
    _TRANSIENT = {1213, 1205, 2006, 2013, 2003, 1053, 4031}

    def engine_options(self) -> dict[str, Any]:
        # READ COMMITTED for every transaction: each statement of a claim or a
        # finalize sees rows committed since the transaction began, as on
        # PostgreSQL, instead of REPEATABLE READ's start-of-transaction snapshot.
        return {**super().engine_options(), "isolation_level": "READ COMMITTED", "pool_recycle": 3600}

    def _multi_insert(
        self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]], returning: bool
    ) -> list[int]:
        # One multi-row INSERT per chunk, handed to the driver as text:
        # SQLAlchemy's executemany path costs more Python time per row than the
        # server spends on it.
        columns = list(rows[0])
        quote = conn.dialect.identifier_preparer.quote
        head = f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) VALUES "
        one = "(" + ", ".join(["%s"] * len(columns)) + ")"
        tail = " RETURNING id" if returning else ""
        ids: list[int] = []
        for part in _packets(rows, self.packet_bytes):
            res = conn.exec_driver_sql(head + ", ".join([one] * len(part)) + tail, tuple(r[c] for r in part for c in columns))
            if returning:
                # One statement's auto-increment values rise in row order.
                ids += sorted(int(i) for i in res.scalars())
        return ids

    def insert_many(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> bool:
        self._multi_insert(conn, table, rows, returning=False)
        return True

    def insert_returning_ids(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> list[int] | None:
        if not getattr(conn.dialect, "is_mariadb", False):
            return None  # MySQL has no INSERT ... RETURNING
        return self._multi_insert(conn, table, rows, returning=True)

    def finish_many(
        self, conn: Connection, jobs: Table, rows: Sequence[tuple[int, int, bytes]], now: float
    ) -> set[int] | None:
        # PyMySQL runs an UPDATE executemany as one round trip per row: one
        # statement per chunk instead, each row's result and token picked by
        # CASE on the id. (A join against a derived table of UNION ALL selects
        # took 4.1 ms for 157 rows with its commit, this 3.4 ms.) The
        # text goes straight to the driver: compiling a statement of hundreds
        # of parameters each time costs more than the server's work on it.
        won: set[int] = set()
        quote = conn.dialect.identifier_preparer.quote
        active = ", ".join(f"'{s}'" for s in schema.ACTIVE_STATES)
        for start in range(0, len(rows), _FINISH_CHUNK):
            part = rows[start : start + _FINISH_CHUNK]
            cases = " ".join(["WHEN %s THEN %s"] * len(part))
            sql = (
                f"UPDATE {quote(jobs.name)} SET state = '{schema.DONE}', result = CASE id {cases} END, error = NULL, "
                f"finished_at = %s, lease_owner = NULL, lease_expires = NULL "
                f"WHERE id IN ({', '.join(['%s'] * len(part))}) AND attempt = CASE id {cases} END AND state IN ({active})"
            )
            params = (
                tuple(x for job_id, _, blob in part for x in (job_id, blob))
                + (now,)
                + tuple(job_id for job_id, _, _ in part)
                + tuple(x for job_id, attempt, _ in part for x in (job_id, attempt))
            )
            if conn.exec_driver_sql(sql, params).rowcount == len(part):
                won.update(r[0] for r in part)
            # else some lease was lost: the store reads this chunk's rows back
        return won

    def check_server(self, conn: Connection) -> None:
        dialect = conn.dialect
        version = tuple(dialect.server_version_info or ())
        if getattr(dialect, "is_mariadb", False):
            if version < (10, 6):
                raise ConfigurationError(
                    f"MariaDB {'.'.join(map(str, version))} is too old: dbexecutor needs MariaDB 10.6 or newer "
                    "for SKIP LOCKED; upgrade the server or use PostgreSQL or SQLite"
                )
        elif version < (8, 0, 1):
            raise ConfigurationError(
                f"MySQL {'.'.join(map(str, version))} is too old: dbexecutor needs MySQL 8.0.1 or newer "
                "for SKIP LOCKED; upgrade the server or use PostgreSQL or SQLite"
            )
        # A statement larger than this is refused, or the server drops the
        # connection, which looks like an outage and would be retried forever.
        packet = int(conn.execute(text("SELECT @@max_allowed_packet")).scalar() or 0)
        if packet:
            self.max_payload = max(1, packet - (64 << 10))  # room for the rest of the row and the statement
            self.packet_bytes = min(_PACKET_BYTES, packet // 4)

    @contextlib.contextmanager
    def schema_lock(self, conn: Connection, name: str) -> Iterator[None]:
        # DDL commits implicitly on MySQL, so the lock must be session-level.
        got = conn.execute(text("SELECT GET_LOCK(:n, 120)"), {"n": name[:64]}).scalar()
        if got != 1:
            raise TimeoutError(f"could not take the schema lock {name!r} within 120 s")
        try:
            yield
        finally:
            conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": name[:64]})

    def is_transient(self, error: DBAPIError) -> bool:
        args = getattr(error.orig, "args", ())
        code = args[0] if args and isinstance(args[0], int) else None
        return super().is_transient(error) or code in self._TRANSIENT


def _pg_listen(
    cargs: Any,
    cparams: dict[str, Any],
    channel: str,
    callback: Callable[[str | None], None],
    stop: threading.Event,
    where: str = "",
    listen_url: bool = False,
) -> None:
    import psycopg
    from psycopg import sql

    backoff = 0.1
    warned = False
    while not stop.is_set():
        try:
            with psycopg.connect(*cargs, **cparams, autocommit=True) as pg:
                # A pooler (PgBouncer, ...) answers the connection with a
                # process id of its own, not the server's. In transaction
                # pooling, LISTEN there would stay on a server connection that
                # later serves other clients (PgBouncer drops what arrives on
                # it meanwhile), and nothing would reach this one: poll instead.
                # A listen_url is taken as given (a session-mode pool works).
                server_pid = pg.execute("SELECT pg_backend_pid()").fetchone()
                pooled = server_pid is not None and server_pid[0] != pg.info.backend_pid
                if pooled and not listen_url:
                    log.warning(
                        "%s goes through a connection pooler: no LISTEN there (in transaction pooling it would "
                        "lose the notifications), so this process polls for work and results from other "
                        "processes every poll_interval; give listen_url (dbexecutor worker --listen-url) "
                        "a direct URL of the server for wake-ups", where,
                    )
                    return
                if pooled and not warned:
                    warned = True
                    log.warning(
                        "listen_url %s goes through a connection pooler: LISTEN works there only in "
                        "session pooling; polling every poll_interval stays as the backstop", where,
                    )
                pg.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                callback(None)  # anything sent while we were not listening is unknown
                backoff = 0.1
                while not stop.is_set():
                    # A bounded wait, so that ``stop`` is seen within half a second.
                    for note in pg.notifies(timeout=0.5):
                        callback(note.payload)
        except psycopg.Error as error:
            if stop.is_set():
                break
            log.info("LISTEN connection lost (%s); reconnecting in %.1f s", type(error).__name__, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, 5.0)
        except Exception:  # a bug in the callback must not end the wake-ups silently
            log.exception("the LISTEN thread failed; polling continues without it")
            return


# URL scheme -> (dialect class, the driver we use for it)
_SCHEMES: dict[str, tuple[type[Dialect], str]] = {
    "sqlite": (SQLiteDialect, "sqlite+pysqlite"),
    "postgresql": (PostgreSQLDialect, "postgresql+psycopg"),
    "postgres": (PostgreSQLDialect, "postgresql+psycopg"),
    "mysql": (MySQLDialect, "mysql+pymysql"),
    "mariadb": (MySQLDialect, "mariadb+pymysql"),
}


def resolve(url: str | URL) -> Dialect:
    """Parse ``url`` and return the dialect object for it, with its URL pinned to our driver.

    ``postgresql://`` means psycopg 3 and ``mysql://`` / ``mariadb://`` mean
    PyMySQL; an explicit other driver is refused with the reason.
    """
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        raise ConfigurationError(
            "malformed database URL; expected e.g. 'sqlite:///jobs.db', "
            "'postgresql://user@host/db' or 'mysql://user@host/db'"
        ) from None
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
