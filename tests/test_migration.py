"""Tables written by schema version 2 are upgraded in place when an executor opens them.

Version 3 added three columns to ``jobs``: ``arg_refs`` (which upstream
results a payload takes), ``failed_upstream`` (the structured reason a
dependent failed, which ``retry`` reads) and ``retry_delay``. The test builds
a version-2 database the way the previous release left it (the three columns
absent, ``schema_version`` 2), with rows in every situation the upgrade must
carry over, then opens it with today's code.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from sqlalchemy import Column, Index, Integer, MetaData, String, Table, UniqueConstraint, inspect, insert, select, update
from sqlalchemy.exc import IntegrityError

import jobs
from dbexecutor import DependencyFailed, schema, serialization
from dbexecutor.readmodels import JobFilter
from dbexecutor.store import Store
from dbexecutor.store.migrations import V6_COLUMNS, V6_INDEXES

T = 60
_NEW_COLUMNS = ("arg_refs", "failed_upstream", "retry_delay")


def _drop_index(conn: Any, kind: str, name: str, table: str) -> None:
    """``DROP INDEX``: MySQL names the table in it; the others do not take it."""
    quote = conn.dialect.identifier_preparer.quote
    on = f" ON {quote(table)}" if kind == "mariadb" else ""
    conn.exec_driver_sql(f"DROP INDEX {quote(name)}{on}")


def _set_version(conn: Any, store: Any, version: int) -> None:
    """Say the tables are of schema ``version``."""
    meta = store.tables.meta
    conn.execute(update(meta).where(meta.c.name == "schema_version").values(value=str(version)))


def _with_old_index(db: Any, version: int, drop: str, name: str, columns: str, where: str = "") -> None:
    """Make this test's tables look like ``version``'s: index ``drop`` gone, index ``name`` on ``columns`` (``WHERE where``)."""
    store = db.store()
    try:
        with store.engine.begin() as conn:
            quote = conn.dialect.identifier_preparer.quote
            _drop_index(conn, db.kind, drop, store.tables.jobs.name)
            where_sql = f" WHERE {where}" if where else ""
            conn.exec_driver_sql(f"CREATE INDEX {quote(name)} ON {quote(store.tables.jobs.name)} ({columns}){where_sql}")
            _set_version(conn, store, version)
    finally:
        store.close()


def _upgraded_from(db: Any, version: int) -> Store:
    """Open the tables (which upgrades them) and check they came from ``version`` and are now current."""
    upgraded = db.store()
    assert upgraded.schema_report is not None and upgraded.schema_report.upgraded_from == version
    assert upgraded.console.schema_version() == schema.SCHEMA_VERSION
    return upgraded


def _drop_v6(conn: Any, store: Any, kind: str) -> None:
    """Remove what version 6 added to ``jobs``: its indexes, then its columns."""
    quote = conn.dialect.identifier_preparer.quote
    table = quote(store.tables.jobs.name)
    for name in V6_INDEXES:
        _drop_index(conn, kind, f"{store.prefix}{name}", store.tables.jobs.name)
    for name in V6_COLUMNS:
        conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {quote(name)}")


def _downgrade_to_v2(db: Any) -> None:
    """Make this test's fresh tables look exactly like version 2's."""
    store = db.store()
    try:
        j = store.tables.jobs
        (ready,) = [ix for ix in j.indexes if ix.name.endswith("ix_jobs_ready_g")]
        ready.drop(store.engine)  # version 8's ready index
        with store.engine.begin() as conn:
            quote = conn.dialect.identifier_preparer.quote
            _drop_v6(conn, store, db.kind)
            for name in (*_NEW_COLUMNS, "queue"):
                conn.exec_driver_sql(f"ALTER TABLE {quote(j.name)} DROP COLUMN {quote(name)}")
        # Version 2's ready index, without the queue (on a throwaway table object).
        old = Table(j.name, MetaData(), Column("group_key", String(255)), Column("priority", Integer), Column("id", Integer))
        Index(f"{db.prefix}ix_jobs_ready", old.c.group_key, old.c.priority, old.c.id).create(store.engine)
        with store.engine.begin() as conn:
            meta = store.tables.meta
            conn.execute(update(meta).where(meta.c.name == "schema_version").values(value="2"))
        store.tables.executors.drop(store.engine)  # version 4's table
    finally:
        store.close()


def _v2_row(now: float, **values: Any) -> dict[str, Any]:
    row = {
        "fn_name": "tests.jobs.add", "payload": b"", "group_key": schema.DEFAULT_GROUP, "batch": 0, "priority": 0,
        "retries": 0, "attempt": 0, "open_deps": 0, "created_at": now,
    }
    row.update(values)
    return row


def test_a_version_2_database_is_upgraded_and_its_jobs_run(db):
    _downgrade_to_v2(db)
    now = time.time()
    # create=False: nothing is checked or upgraded; the rows go in through plain SQL first.
    probe = Store(db.url, db.prefix, create=False)
    j, d = probe.tables.jobs, probe.tables.deps
    try:
        with probe.engine.begin() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns(j.name)}
            assert not columns & set(_NEW_COLUMNS), "the fixture did not build a version-2 table"

            def add(**values: Any) -> int:
                # Only the columns version 2 had: the statement names them explicitly.
                res = conn.execute(insert(j).values(**_v2_row(now, **values)))
                return int(res.inserted_primary_key[0])

            done = add(state=schema.DONE, result=serialization.dump_result(40, 0), finished_at=now)
            # A ready job whose payload takes the done job's result as an argument:
            # version 2 did not record which upstream results a payload needs.
            consumer = add(
                state=schema.READY,
                payload=serialization.dump_payload(jobs.add, (serialization.JobRef(done), 2), {}),
            )
            conn.execute(insert(d).values(job_id=consumer, depends_on_id=done))
            # A failed job, and a dependent that failed because of it: version 2 kept
            # that reason only in the error text.
            failed = add(
                state=schema.FAILED,
                fn_name="tests.jobs.fail",
                payload=serialization.dump_payload(jobs.fail, ("again",), {}),
                result=serialization.dump_exception(jobs.CustomError("first try")),
                error="CustomError: first try",
                finished_at=now,
                attempt=1,
            )
            victim = add(
                state=schema.FAILED,
                payload=serialization.dump_payload(jobs.add, (serialization.JobRef(failed), 1), {}),
                result=serialization.dependency_failure(failed, None),
                error=f"DependencyFailed: upstream job {failed} failed",
                finished_at=now,
            )
            conn.execute(insert(d).values(job_id=victim, depends_on_id=failed))
    finally:
        probe.close()

    # Opening the database upgrades it.
    ex = db.executor()
    upgraded = db.store()
    try:
        with upgraded.engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns(j.name)}
            version = conn.execute(
                select(upgraded.tables.meta.c.value).where(upgraded.tables.meta.c.name == "schema_version")
            ).scalar_one()
        assert set(_NEW_COLUMNS) <= columns
        assert version == str(schema.SCHEMA_VERSION)
        with upgraded.engine.connect() as conn:
            assert inspect(conn).has_table(upgraded.tables.executors.name)
            indexes = {ix["name"] for ix in inspect(conn).get_indexes(j.name)}
        assert f"{db.prefix}ix_jobs_ready_g" in indexes
        assert not {f"{db.prefix}ix_jobs_ready", f"{db.prefix}ix_jobs_ready_q"} & indexes
        assert db.row(consumer).queue == "default"
        assert db.row(victim).failed_upstream == failed  # read from the error text, once
        assert db.row(consumer).arg_refs is None  # not recorded: its executor passes every upstream result

        # The job from before the upgrade runs, with its upstream result as its argument.
        assert ex.future(consumer).result(timeout=T) == 42
        # retry revives the dependent that failed because of the retried job, as it did before.
        revived, refused = upgraded.retry([failed], 0, time.time())
    finally:
        upgraded.close()
    assert revived == {failed: schema.READY, victim: schema.WAITING}, (revived, refused)
    # The retried job fails again, and its dependent fails with it, through the structured cause.
    fut = ex.future(victim)
    error = fut.exception(timeout=T)
    assert isinstance(error, DependencyFailed) and error.upstream_job_id == failed
    assert db.row(victim).failed_upstream == failed


def test_new_rows_record_their_refs_and_cause(db):
    ex = db.executor()
    a = ex.submit(jobs.add, 1, 1)
    b = ex.submit(jobs.add, a, 1, after=[ex.submit(jobs.identity, 0)])
    f = ex.submit(jobs.fail, "no")
    g = ex.submit(jobs.add, f, 1)
    assert b.result(timeout=T) == 3
    assert isinstance(g.exception(timeout=T), DependencyFailed)
    assert db.row(b.job_id).arg_refs == str(a.job_id)  # the after= dependency is only ordering
    assert db.row(a.job_id).arg_refs == ""
    assert db.row(g.job_id).failed_upstream == f.job_id
    assert db.row(f.job_id).failed_upstream is None  # its own exception, not an inherited one



def test_a_version_5_database_gets_progress_stop_requests_and_paging_indexes(db):
    """Version 6 adds four columns to ``jobs`` (NULL for the rows there) and the indexes lists page through."""
    ex = db.executor()
    assert ex.submit(jobs.add, 1, 2).result(timeout=T) == 3
    ex.shutdown()
    store = db.store()
    try:
        with store.engine.begin() as conn:
            _drop_v6(conn, store, db.kind)
            _set_version(conn, store, 5)
    finally:
        store.close()
    upgraded = _upgraded_from(db, 5)
    try:
        with upgraded.engine.connect() as conn:
            insp = inspect(conn)
            columns = {c["name"] for c in insp.get_columns(upgraded.tables.jobs.name)}
            indexes = {ix["name"] for ix in insp.get_indexes(upgraded.tables.jobs.name)}
        assert set(V6_COLUMNS) <= columns
        assert {f"{db.prefix}{name}" for name in V6_INDEXES} <= indexes
        (row,) = db.jobs()
        assert (row.state, row.progress, row.terminate_requested) == ("done", None, None)
    finally:
        upgraded.close()
    assert db.executor().submit(jobs.add, 2, 2).result(timeout=T) == 4


def test_a_version_6_database_gets_the_partial_state_index(db):
    """Version 7 keeps in the state index only the states lists look for (where indexes can be partial)."""
    ex = db.executor()
    assert ex.submit(jobs.add, 1, 2).result(timeout=T) == 3
    failed = ex.submit(jobs.fail, "no")
    assert failed.exception(timeout=T) is not None
    ex.shutdown()
    name = f"{db.prefix}ix_jobs_state"
    _with_old_index(db, 6, name, name, "state, id")  # version 6's index: on every row
    upgraded = _upgraded_from(db, 6)
    try:
        with upgraded.engine.connect() as conn:
            (index,) = [ix for ix in inspect(conn).get_indexes(upgraded.tables.jobs.name) if ix["name"] == name]
        where = {k: v for k, v in index.get("dialect_options", {}).items() if k.endswith("_where") and v is not None}
        assert index["column_names"] == ["state", "id"]
        assert bool(where) == (db.kind != "mariadb"), index  # MariaDB has no partial indexes
        if where:
            spelled = str(next(iter(where.values())))
            assert all(f"'{state}'" in spelled for state in schema.LISTED_STATES) and "'done'" not in spelled, spelled
        page = upgraded.console.job_page(JobFilter(states=("failed",)))
        assert [j.id for j in page.jobs] == [failed.job_id]
    finally:
        upgraded.close()
    assert db.executor().submit(jobs.add, 2, 2).result(timeout=T) == 4


def test_a_version_7_database_gets_the_ready_index_in_the_claims_order(db):
    """Version 8 replaces the ready index led by the queue with one in the claim's order (group, priority, age, queue)."""
    ex = db.executor()
    assert ex.submit(jobs.add, 1, 2).result(timeout=T) == 3
    ex.shutdown()
    new, old = f"{db.prefix}ix_jobs_ready_g", f"{db.prefix}ix_jobs_ready_q"
    # Version 7's index, led by the queue (partial where the database can).
    if db.kind == "mariadb":
        _with_old_index(db, 7, new, old, "state, queue, group_key, priority DESC, id")
    else:
        _with_old_index(db, 7, new, old, "queue, group_key, priority DESC, id", "state = 'ready'")
    upgraded = _upgraded_from(db, 7)
    try:
        with upgraded.engine.connect() as conn:
            found = {ix["name"]: ix for ix in inspect(conn).get_indexes(upgraded.tables.jobs.name)}
        assert old not in found
        expected = ["group_key", "priority", "id", "queue"]
        assert found[new]["column_names"] == (["state", *expected] if db.kind == "mariadb" else expected), found[new]
    finally:
        upgraded.close()
    assert db.executor().submit(jobs.add, 2, 2).result(timeout=T) == 4


def _create_v8_tables(db: Any) -> None:
    """Create this test's tables as version 8 did: the key unique by a constraint, the retention index on every row."""
    store = Store(db.url, db.prefix, create=False)
    try:
        tables = store.driver.make_tables(db.prefix)
        j = tables.jobs
        key, finished = f"{db.prefix}uq_jobs_key", f"{db.prefix}ix_jobs_finished"
        for index in [ix for ix in j.indexes if ix.name in (key, finished)]:
            j.indexes.discard(index)
        if not any(isinstance(c, UniqueConstraint) and c.name == key for c in j.constraints):
            j.append_constraint(UniqueConstraint("job_key", name=key))
        Index(finished, j.c.finished_at)
        with store.engine.begin() as conn:
            tables.metadata.create_all(conn)
            conn.execute(insert(tables.meta), [{"name": "schema_version", "value": "8"}, {"name": "vtime", "value": "0"}])
            conn.execute(insert(tables.groups).values(name=schema.DEFAULT_GROUP))
    finally:
        store.close()


def _partial(index: dict[str, Any]) -> bool:
    return any(k.endswith("_where") and v is not None for k, v in index.get("dialect_options", {}).items())


def test_a_version_8_database_keeps_unfinished_and_unkeyed_rows_out_of_two_indexes(db):
    """Version 9: the retention index holds finished rows, the key's unique index keyed rows (where indexes can be partial).

    PostgreSQL swaps the key's constraint for a partial unique index; SQLite
    cannot drop a table's constraint and keeps it; MariaDB has no partial
    indexes. Wherever the key is unique, a keyed submit still finds its job
    and a second row with the same key is refused.
    """
    _create_v8_tables(db)
    upgraded = _upgraded_from(db, 8)
    key, finished = f"{db.prefix}uq_jobs_key", f"{db.prefix}ix_jobs_finished"
    try:
        with upgraded.engine.connect() as conn:
            insp = inspect(conn)
            found = {ix["name"]: ix for ix in insp.get_indexes(upgraded.tables.jobs.name)}
            uniques = {uc["name"] for uc in insp.get_unique_constraints(upgraded.tables.jobs.name)}
        assert found[finished]["column_names"] == ["finished_at"]
        assert _partial(found[finished]) == (db.kind != "mariadb"), found[finished]
        if db.kind == "postgresql":
            assert key not in uniques and found[key]["unique"] and _partial(found[key]), found[key]
        else:
            assert key in uniques  # SQLite: the table's own constraint; MariaDB: as before
            assert key not in found or not _partial(found[key])
        assert upgraded.migrate().created_indexes == []  # the constraint stands for the index: none twice
    finally:
        upgraded.close()

    ex = db.executor()
    first = ex.options(key="once").submit(jobs.add, 1, 2)
    again = ex.options(key="once").submit(jobs.add, 5, 5)
    assert again.job_id == first.job_id and again.result(timeout=T) == 3
    plain = [ex.submit(jobs.add, i, 0) for i in range(3)]
    assert [f.result(timeout=T) for f in plain] == [0, 1, 2]
    ex.shutdown()
    store = db.store()
    try:
        (row,) = [r for r in db.jobs() if r.id == first.job_id]
        copy = {c.name: getattr(row, c.name) for c in store.tables.jobs.columns if c.name != "id"}
        with pytest.raises(IntegrityError):
            with store.engine.begin() as conn:
                conn.execute(insert(store.tables.jobs).values(**copy))
        # Retention's range on finished_at (the partial index's rows) deletes every finished job.
        assert store.purge(time.time() + 60) == 4
        assert db.jobs() == []
    finally:
        store.close()


_SQLALCHEMY_DIALECTS = {"sqlite": "sqlite", "postgresql": "postgresql", "mariadb": "mysql"}


def test_a_version_9_database_gets_the_functions_table_and_its_payloads_run_as_before(db):
    store = db.store()
    try:
        with store.engine.begin() as conn:
            store.tables.functions.drop(conn)
            _set_version(conn, store, 9)
        assert not inspect(store.engine).has_table(store.tables.functions.name)
    finally:
        store.close()
    upgraded = _upgraded_from(db, 9)
    try:
        assert inspect(upgraded.engine).has_table(upgraded.tables.functions.name)
    finally:
        upgraded.close()
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec("def job(x):\n    return x + 100\n", namespace)  # noqa: S102 - a script's function: by value only
    ex = db.executor(1)
    assert [ex.submit(namespace["job"], i).result(timeout=60) for i in range(3)] == [100, 101, 102]
    assert len(db._select(lambda t: select(t.functions))) == 1


def test_a_store_builds_its_tables_for_its_own_database_only(db):
    # A table option of another database (mysql_engine, sqlite_autoincrement)
    # makes SQLAlchemy import that dialect to check it: a PostgreSQL worker
    # loaded MySQL's and SQLite's dialects at every start (about 17 ms).
    code = (
        "import sys; from dbexecutor.store import Store; "
        f"s = Store({db.url!r}, {db.prefix!r}); s.close(); "
        "print(' '.join(sorted({m.split('.')[2] for m in sys.modules if m.startswith('sqlalchemy.dialects.') "
        "and not m.split('.')[2].startswith('_')})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [_SQLALCHEMY_DIALECTS[db.kind]], out.stderr


def test_payloads_and_long_texts_have_room_on_every_database(db):
    # MySQL's BLOB and TEXT stop at 64 KiB: its columns are LONGBLOB and MEDIUMTEXT.
    store = db.store()
    try:
        store.ensure_schema()
        cols = {c["name"]: str(c["type"]).upper() for c in inspect(store.engine).get_columns(store.tables.jobs.name)}
        functions = {c["name"]: str(c["type"]).upper() for c in inspect(store.engine).get_columns(store.tables.functions.name)}
    finally:
        store.close()
    if db.kind == "mariadb":
        assert cols["payload"] == cols["result"] == functions["data"] == "LONGBLOB"
        assert cols["error"] == cols["arg_refs"] == "MEDIUMTEXT"
    ex = db.executor(1)
    big = "x" * 300_000  # past 64 KiB as a pickle, as an error text
    assert ex.submit(jobs.identity, big).result(timeout=60) == big
    with pytest.raises(jobs.CustomError, match="x{1000}"):
        ex.submit(jobs.fail, big).result(timeout=60)
    assert len(db.jobs()[-1].error) > 65_536  # the error text, whole
