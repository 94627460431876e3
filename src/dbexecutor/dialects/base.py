"""The driver interface every database implements, with the plumbing they share.

A :class:`Driver` answers every question where databases differ, as a method
that each dialect implements or inherits: how to connect and what to check on
the server, how to lock rows for a claim, how to pass a list of ids, how to
insert many rows and learn their ids, how to lease and finish rows in as few
statements as the database allows, how to notify other processes. Real
differences are capability flags (``update_returning``, ``insert_returning``,
``supports_notify``, ``supports_partial_indexes``) that this base class reads
to pick the shared implementation; a subclass overrides only what its database
does better. Nothing outside this package looks at a dialect's name, and no
method answers "not here, do it yourself".
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, cast

from sqlalchemy import ColumnElement, FromClause, Insert, Select, Table, Update, and_, bindparam, case, func, insert, select, tuple_, update
from sqlalchemy.engine import URL, Connection, Engine, Result
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import CreateColumn
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import BindParameter

from .. import schema
from ..errors import DatabaseUnavailable, DBExecutorError
from ..records import Claimed, parse_refs

if TYPE_CHECKING:
    from ..store.sql import Statements

__all__ = ["CLAIMED_COLUMNS", "Driver", "Rows", "leased_from", "packets"]

log = logging.getLogger("dbexecutor.store")

PACKET_BYTES = 4 << 20  # text and bytes per multi-row statement: well under MySQL's max_allowed_packet
ROWS_PER_STATEMENT = 500  # rows per set-based statement (3 to 5 parameters each)


def packets(rows: Sequence[dict[str, Any]], limit: int = PACKET_BYTES) -> Iterator[Sequence[dict[str, Any]]]:
    """``rows`` in runs of at most ``ROWS_PER_STATEMENT`` rows and about ``limit`` bytes of data."""
    start, size = 0, 0
    for n, row in enumerate(rows):
        weight = sum(len(v) for v in row.values() if isinstance(v, (bytes, str)))
        if n > start and (n - start >= ROWS_PER_STATEMENT or size + weight > limit):
            yield rows[start:n]
            start, size = n, 0
        size += weight
    if start < len(rows):
        yield rows[start:]


class Driver:
    """One database's answers to the store's questions (subclassed per database)."""

    #: Human name, for messages.
    label: ClassVar[str] = "database"
    #: ``pip install 'dbexecutor[extra]'`` brings the driver.
    extra: ClassVar[str | None] = None
    #: ``CREATE INDEX ... WHERE`` works (else the ready index is a composite led by ``state``).
    supports_partial_indexes: ClassVar[bool] = True
    #: A query reads a partial index only if its WHERE repeats the index's predicate
    #: (SQLite's rule; PostgreSQL proves it from the values, and a redundant term
    #: would only skew its row estimate).
    repeats_index_predicate: ClassVar[bool] = False
    #: ``ALTER TABLE ... DROP CONSTRAINT`` works (SQLite's constraints live in the table's definition).
    drops_constraints: ClassVar[bool] = True
    #: :meth:`notify` and :meth:`listen` reach other processes (PostgreSQL's LISTEN/NOTIFY).
    supports_notify: ClassVar[bool] = False
    #: :meth:`insert_job_rows` of one row can send a notification with the insert (no statement of its own).
    notifies_on_insert: ClassVar[bool] = False
    #: ``UPDATE ... RETURNING``: a claim leases and reads its rows in one statement.
    update_returning: bool = True
    #: ``INSERT ... RETURNING``: an insert reads back the ids (and states) it made.
    insert_returning: bool = True
    #: The largest payload a row can hold here (bytes; None: no limit worth checking).
    max_payload: int | None = None
    #: Data per multi-row statement (see :func:`packets`).
    packet_bytes: int = PACKET_BYTES
    #: What ``EXPLAIN`` is spelled as here.
    explain_prefix: ClassVar[str] = "EXPLAIN "
    #: One writer at a time for the whole database (SQLite): a transaction that has written holds
    #: every other writer back until it ends, this process's own executor included.
    single_writer: ClassVar[bool] = False
    #: :meth:`reserve_ids` hands out job ids before their rows are inserted.
    reserves_ids: ClassVar[bool] = False
    #: :meth:`finish_done_recording` finishes jobs and writes their attempt rows in one statement.
    finishes_recording: ClassVar[bool] = False
    #: A transaction whose only write is one statement runs in autocommit: no ``BEGIN`` and no
    #: ``COMMIT``, two round trips fewer. Only where switching a pooled connection to autocommit
    #: and back costs nothing (psycopg sets an attribute; PyMySQL would send ``SET AUTOCOMMIT``
    #: both ways, and SQLite's statements cost no round trip).
    autocommits_one_write: ClassVar[bool] = False
    #: A durable submit to an executor with a free slot inserts its row leased (``dbexecutor.lending``),
    #: so the loop needs no claim transaction for it. It pays where writers take turns (SQLite):
    #: there the submit waited for that claim's write lock (+29% durable submits here). On a
    #: server the claim runs beside the submit, on another connection and core, and leasing in the
    #: insert only made each submit longer (-19% PostgreSQL, -27% MariaDB).
    leases_durable_submits: ClassVar[bool] = False
    #: A thread that has queued a backlog of submits (``submit`` in a loop, ``map``) writes it
    #: itself, on the submit queue's connection, when the loop is not writing: the server inserts
    #: those rows while the loop records results and claims on its own connection, instead of the
    #: loop doing both in turn. On a server that overlap is work on another core (+8% one-by-one
    #: submits on PostgreSQL and MariaDB here); SQLite takes writers in turn and gains nothing.
    submitters_write_backlog: ClassVar[bool] = False
    #: :meth:`pipelined` sends its statements together and waits once (psycopg's pipeline mode),
    #: so the scheduler's tick may send the statements that need none of each other's results
    #: together: the finish, the count-down and the lease of a chain's link in one round trip.
    pipelines: ClassVar[bool] = False

    def __init__(self, url: URL) -> None:
        self.url = url
        self._built: dict[Any, Any] = {}  # statements this driver derived from the catalogue's, built once

    def make_tables(self, prefix: str) -> schema.Tables:
        """The table definitions for ``prefix`` on this database: its index forms and its options only."""
        return schema.make_tables(prefix, partial_indexes=self.supports_partial_indexes, dialect=self.url.get_backend_name())

    # -- connecting -------------------------------------------------------------------------------

    def database_missing(self) -> bool:
        """True if connecting would create the database (an SQLite file that is not there yet)."""
        return False

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments for ``create_engine``."""
        # No pre-ping: it would cost a round trip per transaction. A connection that
        # died in the pool fails its first statement, and the store runs the
        # transaction again on a fresh one (SQLAlchemy invalidates the pool).
        return {"pool_size": 4, "max_overflow": 8}

    def setup_engine(self, engine: Engine) -> None:
        """Install connection events (nothing by default)."""

    def check_server(self, conn: Connection) -> None:
        """Raise ``ConfigurationError`` if the server cannot run dbexecutor; learn what it supports."""

    def is_transient(self, error: DBAPIError) -> bool:
        """Whether the failed transaction is worth running again (deadlock, busy, lost connection)."""
        return bool(error.connection_invalidated)

    def connect_failure(self, error: DBAPIError) -> DBExecutorError:
        """What to raise when the first connection (or its setup) fails: where, and why, password masked."""
        url = self.url
        where = f"{url.host or 'localhost'}:{url.port or 'default port'}" if url.host or url.port else url.database
        reason = str(error.orig).strip().splitlines()[0] if error.orig else str(error)
        if url.password:
            reason = reason.replace(url.password, "***")
        masked = url.render_as_string(hide_password=True)
        return DatabaseUnavailable(f"cannot connect to {self.label} at {where} ({masked}): {reason}")

    def server_time(self, conn: Connection) -> float:
        """The server's clock now, as epoch seconds (one round trip)."""
        raise NotImplementedError(self.label)

    def database_identity(self, conn: Connection) -> tuple[Any, ...]:
        """What tells this database apart from every other one, read on ``conn`` (a statement that cannot fail).

        Two connections with equal identities reach the same tables (given the
        same prefix): a caller's connection for a submit inside its
        transaction is checked against the executor's own.
        """
        raise NotImplementedError(self.label)

    # -- schema -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def schema_lock(self, conn: Connection, name: str) -> Iterator[None]:
        """Serialise schema creation and upgrades between processes (inside ``conn``'s transaction)."""
        yield

    def add_column(self, conn: Connection, table: Table, column: Any) -> None:
        """``ALTER TABLE ... ADD COLUMN``: a column a later schema version added to an existing table."""
        quote = conn.dialect.identifier_preparer.quote
        spec = CreateColumn(column).compile(dialect=conn.dialect)
        conn.exec_driver_sql(f"ALTER TABLE {quote(table.name)} ADD COLUMN {spec}")

    # -- building statements ----------------------------------------------------------------------

    def for_claim(self, stmt: Select[Any]) -> Select[Any]:
        """Lock the selected ready rows, skipping rows another claim holds."""
        return stmt.with_for_update(skip_locked=True)

    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        """Lock the selected rows until the transaction ends (waiting if needed)."""
        return stmt.with_for_update()

    def in_ids(self, column: Any, name: str) -> ColumnElement[bool]:
        """``column`` is one of the ids bound to the parameter ``name`` (a list of ints at execution)."""
        return cast(ColumnElement[bool], column.in_(bindparam(name, expanding=True)))

    def in_names(self, column: Any, name: str) -> ColumnElement[bool]:
        """``column`` is one of the strings bound to the parameter ``name`` (a list at execution)."""
        return cast(ColumnElement[bool], column.in_(bindparam(name, expanding=True)))

    def in_pairs(self, first: Any, second: Any, name: str) -> ColumnElement[bool]:
        """``(first, second)`` is one of the pairs bound by :meth:`pairs` as ``name``."""
        return cast(ColumnElement[bool], tuple_(first, second).in_(bindparam(name, expanding=True)))

    def pairs(self, name: str, pairs: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """The parameters that bind ``pairs`` of ints for :meth:`in_pairs` ``name``."""
        return {name: list(pairs)}

    def along_index(self, stmt: Select[Any], table: FromClause, index: str) -> Select[Any]:
        """``stmt`` reading ``table`` along ``index``: as planned by default; told so where the planner chose worse."""
        return stmt

    def bucket(self, offset: Any, width: Any) -> ColumnElement[Any]:
        """The whole number of ``width`` in ``offset`` (both non-negative): which bucket a time falls in."""
        return func.floor(offset / width)

    def id_in(self, column: Any, ids: Select[Any]) -> ColumnElement[bool]:
        """``column`` is one of the ids ``ids`` selects (for an UPDATE that claims them)."""
        return cast(ColumnElement[bool], column.in_(ids))

    def insert_ignore(self, table: Table) -> Insert:
        """An ``INSERT`` that silently skips rows whose primary key exists."""
        return insert(table).prefix_with("IGNORE")

    def plan_for_many(self, conn: Connection) -> None:
        """Before a lookup of many ids in this transaction: keep its plan cheap to make (nothing by default).

        Called by the store before it reads the edges out of a batch of
        finished jobs, where a cost estimate made without statistics grows
        with the table and the number of ids.
        """

    def edges_out(self, deps: Table, jobs: Table, name: str) -> Select[Any]:
        """``(job_id, depends_on_id, batch)`` of every edge out of the jobs bound to ``name`` (``batch``: the dependent's)."""
        stmt = select(deps.c.job_id, deps.c.depends_on_id, jobs.c.batch).join(jobs, jobs.c.id == deps.c.job_id)
        return stmt.where(self.in_ids(deps.c.depends_on_id, name))

    def edges_out_finished(self, deps: Table, jobs: Table, name: str) -> Select[Any]:
        """:meth:`edges_out` of the jobs that are done at the attempts bound by :meth:`pairs` as ``name``.

        As :meth:`count_down_finished`: the jobs a finish earlier in the same
        transaction won, read by this statement, which can then be sent with
        the finish (:meth:`pipelined`).
        """
        up = jobs.alias("up")
        finished = select(up.c.id).where(self.in_pairs(up.c.id, up.c.attempt, name), schema.state_is(up.c.state, schema.DONE))
        stmt = select(deps.c.job_id, deps.c.depends_on_id, jobs.c.batch).join(jobs, jobs.c.id == deps.c.job_id)
        return stmt.where(deps.c.depends_on_id.in_(finished))

    def count_down_returning(self, jobs: Table, deps: Table, name: str) -> Update:
        """The waiting dependents of the jobs bound to ``name``, each counted down by its edges from them; ``(id, batch, open_deps)`` after.

        Only where :attr:`update_returning`. SET reads the old values there
        (PostgreSQL, SQLite), so ``state`` sees ``open_deps`` before its
        count-down. The base form reads each dependent's count once, then
        finds the dependent through the primary key (``UPDATE ... FROM``:
        as correlated subqueries in SET, SQLite unpacked the id list again
        for every row, 21 ms for a tick's 200 finishes against 1 ms; as
        ``IN`` and a scalar subquery on the grouped edges, it grouped them
        again for every row). :meth:`explain` cannot show this form with
        its values (they sit in a FROM it does not reach: NULL there).
        """
        edges = select(deps.c.job_id).where(self.in_ids(deps.c.depends_on_id, name)).subquery("e")
        counts = select(edges.c.job_id, func.count().label("k")).group_by(edges.c.job_id).subquery("c")
        return _counted_down(update(jobs).where(jobs.c.id == counts.c.job_id, schema.state_is(jobs.c.state, schema.WAITING)), jobs, counts.c.k)

    def count_down_finished(self, jobs: Table, deps: Table, name: str) -> Update:
        """:meth:`count_down_returning` of the jobs that are done at the attempts bound by :meth:`pairs` as ``name``.

        That is, of the jobs a finish earlier in the same transaction won (a
        job whose lease was lost is done at another attempt, or not done):
        the count-down need not wait for the finish's answer to be sent
        (:meth:`pipelined`). Only where :attr:`update_returning`.
        """
        up = jobs.alias("up")
        finished = select(up.c.id).where(self.in_pairs(up.c.id, up.c.attempt, name), schema.state_is(up.c.state, schema.DONE))
        edges = select(deps.c.job_id).where(deps.c.depends_on_id.in_(finished)).subquery("e")
        counts = select(edges.c.job_id, func.count().label("k")).group_by(edges.c.job_id).subquery("c")
        return _counted_down(update(jobs).where(jobs.c.id == counts.c.job_id, schema.state_is(jobs.c.state, schema.WAITING)), jobs, counts.c.k)

    def explain(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> list[str]:
        """The query plan of ``stmt`` with ``params``, one text line per plan row."""

        def bind(element: Any) -> Any:
            if isinstance(element, BindParameter) and element.key in params:
                return element._with_value(params[element.key], maintain_key=True, required=False)  # type: ignore[no-untyped-call]
            return None

        # The values go into the text: EXPLAIN plans the statement as it would
        # run with them (the planner sees the values, as with custom plans).
        literal = visitors.replacement_traverse(stmt, {}, bind)  # type: ignore[call-overload]
        sql = str(literal.compile(conn, compile_kwargs={"literal_binds": True}))
        return [" | ".join(str(v) for v in row) for row in conn.exec_driver_sql(self.explain_prefix + sql)]

    def _derived(self, key: Any, build: Callable[[], Any]) -> Any:
        stmt = self._built.get(key)
        if stmt is None:
            stmt = self._built[key] = build()
        return stmt

    # -- running statements -----------------------------------------------------------------------

    def pipelined(self, conn: Connection, batch: Sequence[tuple[Any, dict[str, Any]]], *, many: bool = False) -> list[Rows]:
        """Run each ``(statement, parameters)`` of ``batch`` in order, in the caller's transaction; their rows.

        No statement may need another's result to be written. The base form
        runs them one after another; where :attr:`pipelines`, they are sent
        together and the database's answers read once. ``many``: they look
        up many ids (:meth:`plan_for_many` first, in the same round trip where
        the database pipelines).
        """
        if many:
            self.plan_for_many(conn)
        out: list[Rows] = []
        for stmt, params in batch:
            result = conn.execute(stmt, params)
            out.append(Rows(list(result.keys()), [tuple(r) for r in result]) if result.returns_rows else Rows([], []))
        return out

    def executemany(
        self, conn: Connection, stmt: Any, params: Sequence[dict[str, Any]], columns: tuple[str, ...] | None = None
    ) -> int:
        """Run ``stmt`` once per parameter set (the same keys each); the number of rows it changed.

        ``columns``: for an ``INSERT``, the columns every set gives.
        """
        return int(conn.execute(stmt, list(params) if len(params) > 1 else params[0]).rowcount)

    def insert_rows(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
        """Insert ``rows`` (the same keys each) with as few statements as the database allows."""
        if rows:
            self.executemany(conn, self._derived(("insert", table.name), lambda: insert(table)), rows, tuple(rows[0]))

    def insert_job_rows(
        self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]], notify: tuple[str, str] | None = None
    ) -> list[int]:
        """Insert job ``rows`` (the same keys each) and return their new ids, in row order.

        ``notify``: ``(channel, payload)`` to send with a one-row insert (only if :attr:`notifies_on_insert`).
        """
        if notify is not None:
            raise NotImplementedError(f"{self.label} sends no notification with an insert")
        if len(rows) > 1 and self.insert_returning:
            stmt = self._derived(("insert_returning", table.name), lambda: insert(table).returning(table.c.id, sort_by_parameter_order=True))
            return [int(x) for x in conn.execute(stmt, list(rows)).scalars()]
        # Without RETURNING (MySQL), one statement per row: each reports its own id.
        return [self._insert_one(conn, table, row) for row in rows]

    def reserve_ids(self, conn: Connection, table: Table, n: int) -> list[int]:
        """``n`` new ids of ``table``, ascending, for rows this transaction inserts with them (``reserves_ids``).

        Rows that depend on each other in one write then go in with one
        statement: each knows its upstream's id before anything is inserted.
        """
        raise NotImplementedError(f"{self.label} does not hand out ids before the insert")

    def run_reserving(self, conn: Connection, stmt: Any, params: dict[str, Any], table: Table, n: int) -> Rows:
        """Run ``stmt``; its rows. Where ids come from a sequence, also draw ``n`` of ``table``'s in the same round trip.

        They are what :meth:`reserve_ids` hands out next on this connection
        if it is asked for ``n``: a burst of new jobs looks whether anything
        else is runnable and reserves its ids at once. Elsewhere (ids counted
        under the transaction's write lock) nothing is reserved ahead.
        """
        return self.pipelined(conn, [(stmt, params)])[0]

    def _insert_one(self, conn: Connection, table: Table, row: dict[str, Any]) -> int:
        # One statement object per table: SQLAlchemy keeps its cache key on it (a new
        # insert() per call built the key again: 23 -> 17.5 us of CPU a row, measured on SQLite).
        stmt = self._derived(("insert", table.name), lambda: insert(table))
        key = conn.execute(stmt, row).inserted_primary_key
        assert key is not None
        return int(key[0])

    def insert_reading_state(self, conn: Connection, stmt: Insert, params: dict[str, Any], table: Table) -> tuple[int, str]:
        """Run a one-row ``INSERT ... SELECT`` and return the new row's id and the state it went in with."""
        if self.insert_returning:
            returning = self._derived(("returning_state", id(stmt)), lambda: stmt.returning(table.c.id, table.c.state))
            # A batch of one: a submit's tick begins with it (pipelined: the BEGIN goes with it).
            ((job_id, state),) = self.pipelined(conn, [(returning, params)])[0].rows
            return int(job_id), str(state)
        # No RETURNING: the id the insert made, and its state read back.
        job_id = int(conn.execute(stmt, params).lastrowid)
        return job_id, str(conn.execute(select(table.c.state).where(table.c.id == job_id)).scalar_one())

    def lease_rows(
        self,
        conn: Connection,
        sql: Statements,
        params: dict[str, Any],
        scope: tuple[bool, bool] = (False, False),
        *,
        alone: bool = False,
    ) -> list[Claimed]:
        """Lease the ``p_limit`` best runnable rows of group ``p_group`` in the claim's scope (skipping rows another claim holds).

        With ``UPDATE ... RETURNING`` one statement leases the rows the pick
        selects and reads them back; otherwise the pick locks them and an
        ``UPDATE`` by id leases them. ``alone``: only if the group is the
        claim's only choice (``Statements.pick_alone``); else nothing.
        """
        if self.update_returning:
            lease = sql.lease_picked_alone(scope) if alone else sql.lease_picked(scope)
            # A batch of one: where the lease is the transaction's first statement
            # (an idle executor's claim), a pipeline sends the BEGIN with it.
            # RETURNING has no order: sort as the pick did.
            leased = sorted(_claimed_rows(self.pipelined(conn, [(lease, params)])[0]), key=_claim_order)
            return [_claimed(r, 0) for r in leased]
        picked = _claimed_rows(conn.execute(sql.pick_alone(scope) if alone else sql.pick(scope), params))
        if picked:
            conn.execute(sql.lease_ids, {**params, "p_ids": [int(r[_ID]) for r in picked]})
        return [_claimed(r, 1) for r in picked]

    def finish_done(self, conn: Connection, sql: Statements, rows: Sequence[tuple[int, int, bytes]], now: float) -> set[int]:
        """Mark ``(id, attempt, result)`` done where that attempt still holds an active lease; the ids it finished.

        The base form is an executemany of the guarded ``mark_done`` statement,
        then, if the count falls short (a lease was lost), a read of which
        rows this transaction finished.
        """
        params = [{"p_id": i, "p_attempt": a, "p_result": blob, "p_now": now} for i, a, blob in rows]
        if self.executemany(conn, sql.mark_done, params) == len(rows):
            return {i for i, _, _ in rows}
        return self.finished_by(conn, sql, rows)

    def finish_done_recording(
        self,
        conn: Connection,
        sql: Statements,
        rows: Sequence[tuple[int, int, bytes]],
        now: float,
        attempts: Sequence[dict[str, Any]],
    ) -> set[int]:
        """:meth:`finish_done` and the attempt rows of those attempts in one statement; the ids it finished.

        Only where :attr:`finishes_recording`; elsewhere the store finishes,
        then writes the attempt rows. ``attempts``: one row of the attempts
        table per entry of ``rows``, in the same order, with two outcomes
        instead of one: ``outcome`` if the row was finished, ``outcome_lost``
        if its attempt had lost the lease.
        """
        stmt, params = self.finish_recording(conn, sql, rows, now, attempts)
        return {int(i) for i in conn.execute(stmt, params).scalars()}

    def finish_recording(
        self,
        conn: Connection,
        sql: Statements,
        rows: Sequence[tuple[int, int, bytes]],
        now: float,
        attempts: Sequence[dict[str, Any]],
    ) -> tuple[Any, dict[str, Any]]:
        """:meth:`finish_done_recording`'s statement and its parameters (the statement returns the ids it finished)."""
        raise NotImplementedError(f"{self.label} finishes and writes attempt rows one after the other")

    def finished_by(self, conn: Connection, sql: Statements, rows: Sequence[tuple[int, int, bytes]]) -> set[int]:
        """Which of ``(id, attempt, _)`` are done with that attempt as their token (read back after a short count)."""
        mine = {(i, a) for i, a, _ in rows}
        found = conn.execute(sql.done_tokens, {"p_ids": sorted(i for i, _ in mine)}).all()
        return {int(r.id) for r in found if (int(r.id), r.attempt) in mine}

    # -- notifications ----------------------------------------------------------------------------

    def notify(self, conn: Connection, channel: str, payload: str) -> None:
        """Queue a notification, delivered when ``conn``'s transaction commits (only if :attr:`supports_notify`)."""
        raise NotImplementedError(f"{self.label} has no notifications")

    def listen(
        self,
        engine: Engine,
        channel: str,
        callback: Callable[[str | None], None],
        stop: threading.Event,
        url: URL | None = None,
    ) -> threading.Thread:
        """Start a thread that calls ``callback(payload)`` per notification until ``stop`` is set (only if :attr:`supports_notify`).

        ``callback(None)`` means notifications may have been missed (the
        listening connection was (re)opened): look at everything. ``url``:
        where to listen, if not at the engine's URL (``listen_url``).
        """
        raise NotImplementedError(f"{self.label} has no notifications")

    # -- used by subclasses -----------------------------------------------------------------------

    @staticmethod
    def active_states_sql() -> str:
        """``'leased', 'running'`` for statements written as text."""
        return ", ".join(f"'{s}'" for s in schema.ACTIVE_STATES)


class Rows(NamedTuple):
    """What one statement of :meth:`Driver.pipelined` returned: its column names and its rows, as tuples."""

    keys: list[str]
    rows: list[tuple[Any, ...]]


#: What a claim reads of each row it leases (the claim's statements select these, in this order).
CLAIMED_COLUMNS = ("id", "attempt", "payload", "fn_name", "timeout", "arg_refs", "retry_delay", "priority")


def _claimed_rows(result: Result[Any] | Rows) -> list[tuple[Any, ...]]:
    """The rows of a claim's ``result`` as plain tuples in :data:`CLAIMED_COLUMNS`' order.

    A row's attributes are looked up by name on every access (5.6 us a
    claimed job for the eight, here); positions found once per result are not.
    """
    keys, rows = (result.keys, result.rows) if isinstance(result, Rows) else (list(result.keys()), result)
    return list(map(itemgetter(*(keys.index(name) for name in CLAIMED_COLUMNS)), rows))


def leased_from(rows: Rows) -> list[Claimed]:
    """The jobs a lease statement returned (``UPDATE ... RETURNING``, through :meth:`Driver.pipelined`), in the claim's order."""
    return [_claimed(r, 0) for r in sorted(_claimed_rows(rows), key=_claim_order)]


_PRIORITY, _ID = CLAIMED_COLUMNS.index("priority"), CLAIMED_COLUMNS.index("id")


def _claim_order(row: tuple[Any, ...]) -> tuple[int, int]:
    """A :func:`_claimed_rows` row's place in the claim's order: highest priority first, then oldest (lowest id)."""
    return -row[_PRIORITY], row[_ID]


def _claimed(row: tuple[Any, ...], bump: int) -> Claimed:
    """A :func:`_claimed_rows` row as held: its ``attempt`` plus ``bump`` (1 if leased after it was read)."""
    job_id, attempt, payload, fn_name, timeout, refs, retry_delay, _ = row
    return Claimed(int(job_id), attempt + bump, payload, fn_name, timeout, parse_refs(refs), retry_delay)


def _counted_down(stmt: Update, jobs: Table, k: Any) -> Update:
    """``stmt`` (an UPDATE of the waiting dependents) counting each down by ``k``; plain jobs at zero become ready."""
    return stmt.values(
        state=case((and_(jobs.c.batch == 0, jobs.c.open_deps <= k), schema.READY), else_=jobs.c.state),
        open_deps=jobs.c.open_deps - k,
    ).returning(jobs.c.id, jobs.c.batch, jobs.c.open_deps)
