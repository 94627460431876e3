"""PostgreSQL through psycopg 3: ``FOR UPDATE SKIP LOCKED`` at READ COMMITTED, LISTEN/NOTIFY, set-based writes."""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Insert,
    Select,
    String,
    Table,
    Update,
    and_,
    any_,
    bindparam,
    event,
    func,
    insert,
    literal_column,
    select,
    text,
    true,
    update,
)
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from .. import schema
from . import pg_listen, pg_pipeline
from .base import Driver, Rows, _counted_down

if TYPE_CHECKING:
    from ..store.sql import Statements

__all__ = ["PostgreSQLDriver"]


# Built once: a text() built per call costs its parse and a compile-cache key (30-50 us here), per tick.
_NOTIFY = text("SELECT pg_notify(:c, :p)")
_JIT_OFF = text("SET LOCAL jit = off")
_NEXTVALS = text("SELECT nextval(CAST(:s AS regclass)) FROM generate_series(1, :n)")
_ADVISORY_LOCK = text("SELECT pg_advisory_xact_lock(:k)")
# The attempt rows' columns the finish statement takes as arrays (outcome_lost: the outcome if the lease was lost).
_ATTEMPT_ARRAYS = ("job_id", "attempt", "worker", "started_at", "ended_at", "outcome", "outcome_lost", "detail")



class PostgreSQLDriver(Driver):
    """PostgreSQL: row locks with ``SKIP LOCKED``, arrays for id lists and set-based writes, LISTEN/NOTIFY."""

    label = "PostgreSQL"
    extra = "postgresql"
    supports_notify = True
    notifies_on_insert = True
    reserves_ids = True
    finishes_recording = True
    pipelines = True
    autocommits_one_write = True  # 0.57 -> 0.34 ms for an INSERT and its COMMIT on a loopback server
    submitters_write_backlog = True
    # Deadlock, serialization failure, lock not available, admin shutdown, crash shutdown, cannot connect now.
    _TRANSIENT = {"40P01", "40001", "55P03", "57P01", "57P02", "57P03"}

    def __init__(self, url: URL) -> None:
        super().__init__(url)
        self._sequences: dict[str, str] = {}

    # -- connecting -------------------------------------------------------------------------------

    def engine_options(self) -> dict[str, Any]:
        # Nothing is prepared on the server (psycopg's prepare_threshold=None:
        # each statement is parsed and planned where it runs, as an unnamed
        # statement), and nothing is SET on a connection. Both are session
        # state, and a transaction pooler (PgBouncer in transaction mode, which
        # before 1.21 knows nothing of prepared statements) hands each
        # transaction whichever server connection is free: a statement psycopg
        # prepared on one is missing on the next, or another client's is
        # already there, and a SET lands on a connection other clients get.
        #
        # What the connect-time settings of earlier versions did is covered
        # without them: an unnamed statement gets a custom plan every time,
        # for its own parameters (no stale generic plan made while a table
        # was small), and JIT is the server's setting (README, "PgBouncer").
        # The cost of never preparing is in docs/benchmarks.md.
        return {**super().engine_options(), "connect_args": {"prepare_threshold": None}}

    def setup_engine(self, engine: Engine) -> None:
        from psycopg.types.array import ListBinaryDumper

        @event.listens_for(engine, "connect")
        def _binary_arrays(dbapi_conn: Any, _record: Any) -> None:
            # Python lists (the arrays that carry a tick's rows to unnest, and
            # id lists) go in binary, on this connection only. psycopg's text
            # format walks the elements in Python and escapes each one: a
            # bytea element costs ~3.3 us, an integer ~0.45; binary, ~0.15
            # each, whatever the type. It was most of the CPU of dumping a
            # tick's inserts and finishes. Every array parameter the store
            # sends is CAST to its column's type, so the element type psycopg
            # picks (int2 for small ints, text for an empty list) is converted
            # where the statement says.
            dbapi_conn.adapters.register_dumper(list, ListBinaryDumper)

    def server_time(self, conn: Connection) -> float:
        # clock_timestamp(), not now(): now() is the transaction's start.
        return float(conn.exec_driver_sql("SELECT EXTRACT(EPOCH FROM clock_timestamp())").scalar_one())

    def database_identity(self, conn: Connection) -> tuple[Any, ...]:
        # The server, told apart by its port setting and when it started (the
        # same seen directly, through a socket, or through PgBouncer, which
        # inet_server_addr() is not), the database, and the schema unqualified
        # table names resolve to. Every one of these is readable by any role.
        row = conn.exec_driver_sql(
            "SELECT current_setting('port'), CAST(pg_postmaster_start_time() AS text), current_database(), current_schema()"
        ).one()
        return ("postgresql", *tuple(row))

    def is_transient(self, error: DBAPIError) -> bool:
        code = getattr(error.orig, "sqlstate", None)
        if code is None:
            # No SQLSTATE: the connection itself failed (refused while the server restarts, reset, ...).
            return isinstance(error, OperationalError)
        return super().is_transient(error) or code in self._TRANSIENT or code.startswith("08")

    # -- schema -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def schema_lock(self, conn: Connection, name: str) -> Iterator[None]:
        # Transaction-scoped advisory lock: released by the commit that publishes the tables.
        conn.execute(_ADVISORY_LOCK, {"k": zlib.crc32(name.encode())})
        yield

    # -- building statements ----------------------------------------------------------------------

    def insert_ignore(self, table: Table) -> Insert:
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()

    def in_ids(self, column: Any, name: str) -> ColumnElement[bool]:
        # One array parameter: the statement's text stays the same whatever the
        # number of ids, so psycopg and the server parse it once (an IN list
        # is a new statement for each length).
        return cast(ColumnElement[bool], column == any_(bindparam(name, type_=ARRAY(BigInteger))))

    def in_names(self, column: Any, name: str) -> ColumnElement[bool]:
        # An array, as in_ids: one statement text whatever the number of names (an
        # expanding IN is written out at execution, which a pipeline cannot do).
        return cast(ColumnElement[bool], column == any_(bindparam(name, type_=ARRAY(String))))

    def in_pairs(self, first: Any, second: Any, name: str) -> ColumnElement[bool]:
        # Two arrays joined as a set (UPDATE ... FROM unnest(...)): psycopg cannot bind
        # a tuple IN list, so SQLAlchemy wrote every pair into the statement's text,
        # in Python: 17 ms for 700 held leases on an idle machine, 60 ms in the loop
        # under load, and a new statement text for every number of pairs.
        # The first array once more as "= ANY": the rows are found through the primary key, whatever
        # the statistics say (else the planner may read every active row of the fleet).
        u = _pairs(name)
        return and_(first == any_(bindparam(f"{name}_1", type_=ARRAY(BigInteger))), first == u.c.a, second == u.c.b)

    def pairs(self, name: str, pairs: Sequence[tuple[int, int]]) -> dict[str, Any]:
        # The two arrays _pairs unnests.
        return {f"{name}_1": [a for a, _ in pairs], f"{name}_2": [b for _, b in pairs]}

    def id_in(self, column: Any, ids: Select[Any]) -> ColumnElement[bool]:
        # id = ANY(ARRAY(subquery)): the subquery runs once and the update finds
        # its rows through the primary key. With IN (subquery) the planner may
        # hash-join against a sequential scan of the whole table.
        return cast(ColumnElement[bool], column == any_(func.array(ids.scalar_subquery())))

    def plan_for_many(self, conn: Connection) -> None:
        # No JIT compile for the rest of this transaction. A table never
        # analyzed (autovacuum off, or the first minute of a fresh table)
        # is estimated at 1/200 of its rows per id looked up: with a few
        # hundred finished ids and some 30,000 edges the edges-out lookup
        # passes the default jit_above_cost of 100,000, and the server
        # spends 30-100 ms compiling a statement that runs in 1 ms. SET
        # LOCAL ends with the transaction, so a pooled server connection
        # (PgBouncer in transaction mode) goes back to the next client as
        # it came; it costs a round trip, paid only for such batches.
        conn.execute(_JIT_OFF)

    def _edges_by_upstream(self, deps: Table, ids: str | ColumnElement[Any], *columns: Any) -> Select[Any]:
        """``columns`` of the edges out of the ids bound as ``ids`` (or that array): one index lookup per upstream id.

        Whatever the planner believes: without statistics (before the first
        ANALYZE, or with autovacuum off) it takes "depends_on_id = ANY(ids)"
        to match a large share of the edge table for a few hundred ids and
        hash-joins sequential scans of both tables, so every finish got
        slower as the tables grew. OFFSET 0 keeps the LATERAL subquery from
        being flattened into that join again.
        """
        array = bindparam(ids, type_=ARRAY(BigInteger)) if isinstance(ids, str) else ids
        u = func.unnest(array).table_valued("id").render_derived(name="u")
        edges = select(*columns).where(deps.c.depends_on_id == u.c.id).offset(literal_column("0")).lateral("e")
        return select(*edges.c).select_from(u).join(edges, true())

    def edges_out(self, deps: Table, jobs: Table, name: str) -> Select[Any]:
        # The dependent's batch flag as a primary-key lookup per edge: joined,
        # the same missing statistics made the planner hash-join a scan of
        # the jobs table once per upstream id.
        return self._edges_and_batch(deps, jobs, name)

    def _edges_and_batch(self, deps: Table, jobs: Table, ids: str | ColumnElement[Any]) -> Select[Any]:
        batch = select(jobs.c.batch).where(jobs.c.id == deps.c.job_id).scalar_subquery()
        return self._edges_by_upstream(deps, ids, deps.c.job_id, deps.c.depends_on_id, batch.label("batch"))

    def count_down_returning(self, jobs: Table, deps: Table, name: str) -> Update:
        # The dependents as in edges_out, each found through the primary key
        # (id = ANY(ARRAY(...))) and counted by a lookup on the edges' primary
        # key. The state is compared with IS NOT DISTINCT FROM (never NULL):
        # the state index cannot serve it, and without statistics the planner
        # believed few rows waiting and read them all through it, each finish.
        # A join with the grouped edges was planned as badly as edges_out once was.
        dependents = self._edges_by_upstream(deps, name, deps.c.job_id)
        k = select(func.count()).where(deps.c.job_id == jobs.c.id, self.in_ids(deps.c.depends_on_id, name)).scalar_subquery()
        waiting = jobs.c.state.is_not_distinct_from(literal_column(f"'{schema.WAITING}'"))
        return _counted_down(update(jobs).where(self.id_in(jobs.c.id, dependents), waiting), jobs, k)

    def _finished(self, jobs: Table, name: str) -> Select[Any]:
        """The ids of the jobs done at the attempts bound as the pairs ``name``: one primary-key lookup per pair.

        LATERAL, kept from being flattened by OFFSET 0: as a join, the planner
        read the whole table for a few hundred ids, having no statistics.
        """
        pairs = _pairs(name)
        up = jobs.alias("up")
        one = (
            select(up.c.id)
            .where(up.c.id == pairs.c.a, up.c.attempt == pairs.c.b, schema.state_is(up.c.state, schema.DONE))
            .offset(literal_column("0"))
            .lateral("f")
        )
        return select(one.c.id).select_from(pairs).join(one, true())

    def edges_out_finished(self, deps: Table, jobs: Table, name: str) -> Select[Any]:
        # edges_out, of the ids the finish before it won (_finished).
        return self._edges_and_batch(deps, jobs, func.array(self._finished(jobs, name).scalar_subquery()))

    def count_down_finished(self, jobs: Table, deps: Table, name: str) -> Update:
        # count_down_returning of the upstream rows that are done at the
        # attempts bound as the pairs ``name`` (id, attempt): the jobs the
        # finish before it in the same transaction won. Read here, by the
        # statement after the finish (its own snapshot, which sees the edges
        # committed while the finish waited for a row), rather than passed
        # in: sent in one pipeline with the finish, it cannot know which
        # leases were lost. A row finished by another attempt is not counted.
        #
        # The rows the finish won (_finished), in a CTE read three times and
        # materialized once. Each dependent's count checks its own edges (by
        # the edges' primary key) against that set; with the set as "=
        # ANY(array)" the planner, not knowing its size, probed the index
        # once per element for every dependent (55 ms against 14 for 100
        # finished jobs of a random DAG).
        finished = self._finished(jobs, name).cte("won")
        ids = func.array(select(finished.c.id).scalar_subquery())
        dependents = self._edges_by_upstream(deps, ids, deps.c.job_id)
        k = select(func.count()).where(deps.c.job_id == jobs.c.id, deps.c.depends_on_id.in_(select(finished.c.id))).scalar_subquery()
        waiting = jobs.c.state.is_not_distinct_from(literal_column(f"'{schema.WAITING}'"))
        return _counted_down(update(jobs).where(self.id_in(jobs.c.id, dependents), waiting).add_cte(finished), jobs, k)

    # -- running statements -----------------------------------------------------------------------
    # Set-based writes: one statement whose parameters are arrays, unnested on
    # the server. Pipelined or not, one statement per row costs the server
    # (and psycopg) several times more than one statement for the batch.

    def _unnest(self, conn: Connection, table: Table, columns: Sequence[str]) -> str:
        types = [table.c[c].type.compile(dialect=conn.dialect) for c in columns]
        return ", ".join(f"CAST(:a{i} AS {t}[])" for i, t in enumerate(types))

    def insert_rows(self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
        """``INSERT ... SELECT FROM unnest(arrays)``: one statement for all rows."""
        if not rows:
            return
        columns = list(rows[0])
        values = {c: [row[c] for row in rows] for c in columns}
        # A column with the same value in every row (the group, the function,
        # the lease of a burst leased on insert, ...) is bound once as a
        # scalar: psycopg dumps array elements one by one in Python.
        same = tuple(len(rows) > 1 and _constant(values[c]) for c in columns)
        if all(same):
            same = (False,) + same[1:]  # unnest needs one array, for the number of rows
        arrays = [c for c, one in zip(columns, same) if not one]
        scalars = [c for c, one in zip(columns, same) if one]

        def build() -> Any:
            quote = conn.dialect.identifier_preparer.quote
            picked = {c: f"u.a{k}" for k, c in enumerate(arrays)}
            picked.update({c: f"CAST(:s{k} AS {table.c[c].type.compile(dialect=conn.dialect)})" for k, c in enumerate(scalars)})
            return text(
                f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) "
                f"SELECT {', '.join(picked[c] for c in columns)} FROM unnest({self._unnest(conn, table, arrays)}) "
                f"AS u({', '.join(f'a{k}' for k in range(len(arrays)))})"
            )

        stmt = self._derived(("insert", table.name, tuple(columns), same), build)
        params = {f"a{k}": values[c] for k, c in enumerate(arrays)}
        params.update({f"s{k}": values[c][0] for k, c in enumerate(scalars)})
        conn.execute(stmt, params)

    def insert_job_rows(
        self, conn: Connection, table: Table, rows: Sequence[dict[str, Any]], notify: tuple[str, str] | None = None
    ) -> list[int]:
        """Ids from the sequence in one round trip, then one set-based insert with them.

        One row with ``notify``: ``INSERT ... RETURNING id, (SELECT pg_notify(...))``,
        the notification sent by the insert (an uncorrelated subquery runs once).
        """
        if notify is not None and len(rows) != 1:
            raise ValueError("a notification goes with a one-row insert")
        if len(rows) == 1:
            # A durable submit's write, alone in autocommit: through pipelined() it skips
            # SQLAlchemy's execution (its statement compiled once per set of columns).
            row = rows[0]
            stmt = self._one_row_insert(table, tuple(row), notify is not None)
            params = row if notify is None else {**row, "n_channel": notify[0], "n_payload": notify[1]}
            return [int(self.pipelined(conn, [(stmt, params)])[0].rows[0][0])]
        # A multi-row INSERT ... RETURNING makes psycopg parse a new long query
        # text on every call; reserving the ids first keeps the insert's text fixed.
        ids = self.reserve_ids(conn, table, len(rows))
        self.insert_rows(conn, table, [{**row, "id": job_id} for row, job_id in zip(rows, ids)])
        return ids

    def _one_row_insert(self, table: Table, columns: tuple[str, ...], notifying: bool) -> Any:
        """``INSERT`` of ``columns`` (each bound by its name) ``RETURNING id``; with ``notifying``, the ``pg_notify`` of ``n_channel``, ``n_payload`` too."""

        def build() -> Any:
            stmt = insert(table).values({c: bindparam(c, type_=table.c[c].type) for c in columns})
            if not notifying:
                return stmt.returning(table.c.id)
            # An uncorrelated subquery runs once: the notification goes with the insert, no statement of its own.
            return stmt.returning(table.c.id, select(func.pg_notify(bindparam("n_channel"), bindparam("n_payload"))).scalar_subquery())

        return self._derived(("insert_one", table.name, columns, notifying), build)

    def reserve_ids(self, conn: Connection, table: Table, n: int) -> list[int]:
        """``n`` values of the ``id`` column's sequence in one round trip, sorted (rows inserted with them keep their order).

        The ids :meth:`run_reserving` reserved on this connection, if it reserved ``n``.
        """
        ahead = conn.info.pop(("dbexecutor.ids", table.name), None)
        if ahead is not None and len(ahead) == n:
            return cast(list[int], ahead)
        # A batch of one: a tick of new rows begins with it (pipelined: the BEGIN goes with it).
        return self._ids(self.pipelined(conn, [self._nextvals(conn, table, n)])[0])

    def run_reserving(self, conn: Connection, stmt: Any, params: dict[str, Any], table: Table, n: int) -> Rows:
        # Pipelined with the statement (and the BEGIN, when it opens the transaction): a burst's
        # look and its ids are one round trip, not three. A sequence's values stay unique
        # whatever becomes of this transaction, so the ids may serve any later insert.
        rows, ids = self.pipelined(conn, [(stmt, params), self._nextvals(conn, table, n)])
        conn.info[("dbexecutor.ids", table.name)] = self._ids(ids)
        return rows

    def _nextvals(self, conn: Connection, table: Table, n: int) -> tuple[Any, dict[str, Any]]:
        """The statement (and its parameters) that draws ``n`` values of ``table``'s id sequence."""
        seq = self._sequences.get(table.name)
        if seq is None:
            seq = conn.execute(text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": table.name}).scalar_one()
            self._sequences[table.name] = seq
        return _NEXTVALS, {"s": seq, "n": n}

    @staticmethod
    def _ids(rows: Rows) -> list[int]:
        return sorted(int(i) for (i,) in rows.rows)

    def finish_recording(
        self,
        conn: Connection,
        sql: Statements,
        rows: Sequence[tuple[int, int, bytes]],
        now: float,
        attempts: Sequence[dict[str, Any]],
    ) -> tuple[Any, dict[str, Any]]:
        """The guarded finish (``UPDATE ... FROM unnest(...) RETURNING``: the ids it returns are the rows it finished) and the attempt rows: one statement (the ``INSERT`` a data-modifying CTE).

        A tick with finishes, or a chain's link, costs one round trip fewer
        (0.4-0.5 ms on a loopback server here: nothing is prepared). The
        edges out are not read here: a statement's snapshot is taken when it
        starts, so an edge committed by a submit that held the upstream row
        while this UPDATE waited for it would not be seen, and its dependent
        would wait forever. Read by the next statement (READ COMMITTED: a new
        snapshot), it is.
        """
        jobs, att = sql.tables.jobs, sql.tables.attempts
        columns = _ATTEMPT_ARRAYS

        def build() -> Any:
            quote = conn.dialect.identifier_preparer.quote
            types = [att.c[c if c != "outcome_lost" else "outcome"].type.compile(dialect=conn.dialect) for c in columns]
            arrays = ", ".join(f"CAST(:b{i} AS {t}[])" for i, t in enumerate(types))
            return text(
                f"WITH fin AS (UPDATE {quote(jobs.name)} AS j SET state = '{schema.DONE}', result = u.result, error = NULL, "
                "finished_at = :now, lease_owner = NULL, lease_expires = NULL "
                f"FROM unnest({self._unnest(conn, jobs, ['id', 'attempt', 'result'])}) AS u(id, attempt, result) "
                f"WHERE j.id = u.id AND j.attempt = u.attempt AND j.state IN ({self.active_states_sql()}) RETURNING j.id), "
                f"att AS (INSERT INTO {quote(att.name)} (job_id, attempt, worker, started_at, ended_at, outcome, detail) "
                "SELECT v.job_id, v.attempt, v.worker, v.started_at, v.ended_at, "
                "CASE WHEN v.job_id IN (SELECT id FROM fin) THEN v.outcome ELSE v.outcome_lost END, v.detail "
                f"FROM unnest({arrays}) AS v({', '.join(columns)})) "
                "SELECT id FROM fin"
            )

        stmt = self._derived(("finish_recording", jobs.name), build)
        params: dict[str, Any] = {"a0": [r[0] for r in rows], "a1": [r[1] for r in rows], "a2": [r[2] for r in rows], "now": now}
        params.update({f"b{i}": [row[c] for row in attempts] for i, c in enumerate(_ATTEMPT_ARRAYS)})
        return stmt, params

    def pipelined(self, conn: Connection, batch: Sequence[tuple[Any, dict[str, Any]]], *, many: bool = False) -> list[Rows]:
        # psycopg's pipeline mode (pg_pipeline): the statements, and the BEGIN
        # before them if they open the transaction, go out together and the
        # answers are read at one sync, so the wait for the server is paid
        # once. A chain's link is three statements (the finish, the
        # count-down, the next link's lease): three waits of 0.3-0.7 ms in
        # the scheduler's process here, where the server's own work for each
        # is 0.1-0.4 ms.
        raw = cast(Any, conn.connection.dbapi_connection)
        if not pg_pipeline.supported():
            return super().pipelined(conn, batch, many=many)  # libpq before 14
        if many:
            # plan_for_many's SET LOCAL goes in the pipeline too: on its own it
            # was a round trip, and one more for the BEGIN it opened.
            batch = [(_JIT_OFF, {}), *batch]
        # One statement with nothing to send with it (no BEGIN) goes out on its own, still
        # past SQLAlchemy's execution: a durable submit took 45 us of CPU less here (401 -> 356).
        out = pg_pipeline.send(conn, raw, [(self._compiled(conn, stmt), params) for stmt, params in batch])
        return out[1:] if many else out

    def _compiled(self, conn: Connection, stmt: Any) -> tuple[str, Any]:
        """``stmt`` compiled for this dialect, once: its text and the compiled form that fills in its parameters."""
        key = ("pipelined", id(stmt))
        hit = self._built.get(key)
        if hit is None or hit[0] is not stmt:
            compiled = stmt.compile(dialect=conn.dialect)
            hit = self._built[key] = (stmt, compiled.string, compiled)
        return hit[1], hit[2]

    # -- notifications ----------------------------------------------------------------------------

    def notify(self, conn: Connection, channel: str, payload: str) -> None:
        # pg_notify() rather than NOTIFY: the payload is a bound parameter.
        conn.execute(_NOTIFY, {"c": channel, "p": payload})

    def listen(
        self,
        engine: Engine,
        channel: str,
        callback: Callable[[str | None], None],
        stop: threading.Event,
        url: URL | None = None,
    ) -> threading.Thread:
        # A connection of its own, outside the pool: it sits in LISTEN for the
        # executor's lifetime, in autocommit (notifications arrive between
        # transactions). ``url`` (listen_url) is a direct one when the pool's
        # goes through a transaction pooler.
        target = url if url is not None else self.url
        cargs, cparams = engine.dialect.create_connect_args(target)
        where = f"{target.host or 'localhost'}:{target.port or 5432}"
        thread = threading.Thread(
            target=pg_listen.listen_loop,
            args=(cargs, cparams, channel, callback, stop, where, url is not None),
            name="dbexecutor-listen",
            daemon=True,
        )
        thread.start()
        return thread


def _pairs(name: str) -> Any:
    """The pairs bound as ``name`` (:meth:`PostgreSQLDriver.pairs`: two arrays) as a table ``name(a, b)``."""
    firsts, seconds = (bindparam(f"{name}_{i}", type_=ARRAY(BigInteger)) for i in (1, 2))
    return func.unnest(firsts, seconds).table_valued("a", "b").render_derived(name=name)


def _constant(values: list[Any]) -> bool:
    """Whether every one of ``values`` equals the first, and is of its type (``1`` and ``True`` differ).

    Both checks loop in C: this ran for each of some 17 columns of every
    multi-row insert, over every row, in Python (5-6% of a submitting thread).
    """
    return values.count(values[0]) == len(values) and len(set(map(type, values))) == 1
