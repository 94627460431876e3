"""MySQL >= 8.0.1 and MariaDB >= 10.6 through PyMySQL: InnoDB, READ COMMITTED, ``SKIP LOCKED``.

MariaDB stands in for MySQL in this project's tests. What differs between the
two is learnt from the server at connect time, here and nowhere else: MariaDB
has ``INSERT ... RETURNING``, MySQL does not (there every row of a multi-row
insert of jobs is its own statement, so that each reports its id). Neither
has ``UPDATE ... RETURNING``: a claim locks its rows with a select, then
leases them by id.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import FromClause, Select, Table, event, text
from sqlalchemy.engine import Connection, CursorResult, Engine
from sqlalchemy.pool import PoolResetState
from sqlalchemy.exc import DBAPIError

from .. import schema
from ..errors import ConfigurationError
from .base import PACKET_BYTES, ROWS_PER_STATEMENT, Driver, packets

if TYPE_CHECKING:
    from ..store.sql import Statements

__all__ = ["MySQLDriver"]

_SERVER_STATUS_IN_TRANS = 1  # pymysql.constants.SERVER_STATUS.SERVER_STATUS_IN_TRANS


@functools.cache
def _connection_class() -> Any:
    """PyMySQL's ``Connection``, with the TLS context of its "preferred" mode made once per process.

    Without TLS options, PyMySQL (2.x) makes a TLS context for every new
    connection, in case the server offers TLS: that loads the system's CA
    bundle, about 20 ms of CPU per connection here (0.4 ms for the rest of
    the connect), although that context verifies nothing (no CA, no host
    name). The same context serves every connection, as PyMySQL builds it
    from nothing but those empty options; TLS options given in the URL, and
    the servers' own choice of TLS, are PyMySQL's as before.
    """
    from pymysql.connections import Connection as PyMySQLConnection  # type: ignore[import-untyped, unused-ignore]

    lock = threading.Lock()
    shared: list[Any] = []  # the one context, once made

    class Connection(PyMySQLConnection):  # type: ignore[misc, unused-ignore]
        def _create_ssl_ctx(self, sslp: Any) -> Any:
            if not isinstance(sslp, dict) or sslp:
                return super()._create_ssl_ctx(sslp)
            with lock:
                if not shared:
                    shared.append(super()._create_ssl_ctx(sslp))
                return shared[0]

    return Connection


class MySQLDriver(Driver):
    """MySQL/MariaDB: row locks with ``SKIP LOCKED`` at READ COMMITTED; multi-row statements as text."""

    label = "MySQL/MariaDB"
    extra = "mysql"
    supports_partial_indexes = False
    update_returning = False
    submitters_write_backlog = True
    insert_returning = False  # until the server says it is MariaDB (check_server)
    # Deadlock, lock wait timeout, server gone away, lost connection, cannot connect, shutting down, idle timeout.
    _TRANSIENT = {1213, 1205, 2006, 2013, 2003, 1053, 4031}

    def engine_options(self) -> dict[str, Any]:
        # READ COMMITTED for every transaction: each statement of a claim or a
        # finalize sees rows committed since the transaction began, as on
        # PostgreSQL, instead of REPEATABLE READ's start-of-transaction snapshot.
        #
        # No unconditional ROLLBACK when a connection goes back to the pool:
        # PyMySQL sends one even after a COMMIT, a round trip per transaction
        # (see setup_engine for the reset that replaces it).
        return {
            **super().engine_options(),
            "isolation_level": "READ COMMITTED",
            "pool_recycle": 3600,
            "pool_reset_on_return": None,
        }

    def setup_engine(self, engine: Engine) -> None:
        @event.listens_for(engine, "do_connect")
        def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
            return _connection_class()(*cargs, **cparams)

        @event.listens_for(engine, "reset")
        def _reset(dbapi_conn: Any, _record: Any, _state: PoolResetState) -> None:
            # Roll back only what the server says is open: every OK and EOF
            # packet carries SERVER_STATUS_IN_TRANS (bit 0), which PyMySQL
            # keeps as ``server_status``. A committed transaction (the usual
            # case) leaves nothing to roll back; a failed one, or a connection
            # whose status is unknown, is rolled back as the pool would.
            status = getattr(dbapi_conn, "server_status", None)
            if status is None or status & _SERVER_STATUS_IN_TRANS:
                dbapi_conn.rollback()

    def check_server(self, conn: Connection) -> None:
        dialect = conn.dialect
        version = tuple(dialect.server_version_info or ())
        mariadb = bool(getattr(dialect, "is_mariadb", False))
        if mariadb and version < (10, 6):
            raise ConfigurationError(
                f"MariaDB {'.'.join(map(str, version))} is too old: dbexecutor needs MariaDB 10.6 or newer "
                "for SKIP LOCKED; upgrade the server or use PostgreSQL or SQLite"
            )
        if not mariadb and version < (8, 0, 1):
            raise ConfigurationError(
                f"MySQL {'.'.join(map(str, version))} is too old: dbexecutor needs MySQL 8.0.1 or newer "
                "for SKIP LOCKED; upgrade the server or use PostgreSQL or SQLite"
            )
        self.insert_returning = mariadb
        # A statement larger than this is refused, or the server drops the
        # connection, which looks like an outage and would be retried forever.
        packet = int(conn.execute(text("SELECT @@max_allowed_packet")).scalar() or 0)
        if packet:
            self.max_payload = max(1, packet - (64 << 10))  # room for the rest of the row and the statement
            self.packet_bytes = min(PACKET_BYTES, packet // 4)

    def along_index(self, stmt: Select[Any], table: FromClause, index: str) -> Select[Any]:
        # Given "state = 'done' AND id < :before ORDER BY id DESC LIMIT n", MariaDB
        # picks a ref lookup on (state, id) and walks every newer row of the state
        # before the first one below :before (seconds, a million rows in); the
        # range it then reads is a few pages of the index. Given a group's best
        # ready row, without fresh statistics it read the group's rows of every
        # state (ix_jobs_group) and sorted them.
        quote = self._quote
        return stmt.with_hint(table, f"FORCE INDEX ({quote(index)})")

    @staticmethod
    def _quote(name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    def database_identity(self, conn: Connection) -> tuple[Any, ...]:
        # The server (its host name, port and server id: the same through any
        # address or proxy that reaches it) and the current database.
        row = conn.exec_driver_sql("SELECT @@hostname, @@port, @@server_id, DATABASE()").one()
        return ("mysql", *tuple(row))

    def server_time(self, conn: Connection) -> float:
        # SYSDATE(6), not NOW(6): NOW() is the statement's start, and SYSDATE the moment it is read.
        return float(conn.exec_driver_sql("SELECT UNIX_TIMESTAMP(SYSDATE(6))").scalar_one())

    def is_transient(self, error: DBAPIError) -> bool:
        args = getattr(error.orig, "args", ())
        code = args[0] if args and isinstance(args[0], int) else None
        return super().is_transient(error) or code in self._TRANSIENT

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

    # -- running statements -----------------------------------------------------------------------
    # Multi-row statements go to PyMySQL as text: SQLAlchemy's executemany
    # costs more Python time per row than the server spends on it, and PyMySQL
    # runs an UPDATE executemany as one round trip per row. Their values are
    # written in as literals (_inline), which halves the Python time per row again.

    def _multi_insert(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]], returning: bool) -> list[int]:
        columns = list(rows[0])
        quote = conn.dialect.identifier_preparer.quote
        head = f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) VALUES "
        one = "(" + ", ".join(["%s"] * len(columns)) + ")"
        tail = " RETURNING id" if returning else ""
        ids: list[int] = []
        for part in packets(rows, self.packet_bytes):
            res = _inline(conn, head + ", ".join([one] * len(part)) + tail, [r[c] for r in part for c in columns])
            if returning:
                # One statement's auto-increment values rise in row order.
                ids += sorted(int(i) for i in res.scalars())
        return ids

    def insert_rows(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
        """One multi-row ``INSERT`` per packet of rows."""
        if rows:
            self._multi_insert(conn, table, rows, returning=False)

    def insert_job_rows(
        self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]], notify: tuple[str, str] | None = None
    ) -> list[int]:
        """MariaDB: multi-row ``INSERT ... RETURNING id``; MySQL: one statement per row (the base form)."""
        if len(rows) > 1 and self.insert_returning and notify is None:
            return self._multi_insert(conn, table, rows, returning=True)
        return super().insert_job_rows(conn, table, rows, notify)

    def finish_done(self, conn: Connection, sql: Statements, rows: Sequence[tuple[int, int, bytes]], now: float) -> set[int]:
        """One ``UPDATE`` per chunk, each row's result and token picked by ``CASE`` on the id; a short count is read back."""
        jobs = sql.tables.jobs
        won: set[int] = set()
        quote = conn.dialect.identifier_preparer.quote
        for start in range(0, len(rows), ROWS_PER_STATEMENT):
            part = rows[start : start + ROWS_PER_STATEMENT]
            cases = " ".join(["WHEN %s THEN %s"] * len(part))
            stmt = (
                f"UPDATE {quote(jobs.name)} SET state = '{schema.DONE}', result = CASE id {cases} END, error = NULL, "
                f"finished_at = %s, lease_owner = NULL, lease_expires = NULL "
                f"WHERE id IN ({', '.join(['%s'] * len(part))}) AND attempt = CASE id {cases} END "
                f"AND state IN ({self.active_states_sql()})"
            )
            params = (
                tuple(x for job_id, _, blob in part for x in (job_id, blob))
                + (now,)
                + tuple(job_id for job_id, _, _ in part)
                + tuple(x for job_id, attempt, _ in part for x in (job_id, attempt))
            )
            if _inline(conn, stmt, params).rowcount == len(part):
                won.update(r[0] for r in part)
            else:  # some lease was lost: which rows did this statement finish?
                won |= self.finished_by(conn, sql, part)
        return won


def _literal(value: Any, escape: Callable[[Any], str]) -> str:
    """``value`` as a MySQL literal, spelled as PyMySQL spells it (``escape``: its connection's, for the rest)."""
    kind = type(value)
    if kind is int:
        return str(value)
    if value is None:
        return "NULL"
    if kind is float:
        spelled = repr(value)
        if spelled in ("inf", "-inf", "nan"):
            return escape(value)  # PyMySQL refuses them, with its own error
        return spelled if "e" in spelled else spelled + "e0"  # a DOUBLE, not a DECIMAL
    if kind is bytes:
        return f"X'{value.hex()}'"
    return escape(value)  # text (its quoting follows the server's NO_BACKSLASH_ESCAPES), and any other type


def _inline(conn: Connection, statement: str, params: Sequence[Any]) -> CursorResult[Any]:
    """Run ``statement`` (``%s`` placeholders) with ``params`` written in as SQL literals.

    PyMySQL escapes each parameter through three calls (its ``escape``,
    ``escape_item``, the type's encoder); the common types are spelled here
    in one, the rest by PyMySQL: a tick's insert of 476 job rows took 5.0 ms
    of Python to build, now 2.6 ms, the same text. ``no_parameters``: the
    text goes to ``cursor.execute`` as it is, not through ``%`` again.
    """
    escape = conn.connection.dbapi_connection.escape  # type: ignore[union-attr]
    spelled = statement % tuple([_literal(v, escape) for v in params])
    return conn.exec_driver_sql(spelled, execution_options={"no_parameters": True})
