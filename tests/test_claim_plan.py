"""The claim reads runnable rows through the ready index, not by scanning the jobs table.

The claim is two reads: which groups have runnable work (one probe of the
ready index per group), then the best rows of a group (a range of that index,
already in priority order). Neither may scan the jobs table or sort it. The
UPDATE that leases the rows finds them by primary key (on PostgreSQL and
SQLite it embeds the second read; a semi-join there could scan the table).
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import event, insert, select, text

from conftest import fan_in, insert_done, insert_waiting
from dbexecutor import schema, serialization
from dbexecutor.store.sql import Scope


def test_claim_uses_the_ready_index(db):
    store = db.store()
    j = store.tables.jobs
    now = time.time()
    for name in ("a", "b", "c"):
        store.configure_group(name, weight=2)
    # Many finished and waiting rows, a few ready ones: a plan that scans the
    # table would show up here, and statistics make the planner choose for real.
    rows = [
        {"state": state, "fn_name": "f", "payload": b"x", "created_at": now, "group_key": group}
        for state, n in ((schema.DONE, 3000), (schema.WAITING, 1000), (schema.READY, 20))
        for group in ("default", "a", "b", "c")
        for _ in range(n // 4)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(j), rows)
    with store.engine.connect() as conn:
        conn.execute(text({"sqlite": "ANALYZE", "postgresql": f"ANALYZE {j.name}"}.get(db.kind, f"ANALYZE TABLE {j.name}")))
        conn.commit()
    plans = store.explain_claim()
    index = f"{db.prefix}ix_jobs_ready_g"
    claim, groups, lease, alone = ("\n".join(plans[k]) for k in ("claim", "groups", "lease", "alone"))
    assert index in claim and index in alone, (claim, alone)
    if db.kind == "sqlite":
        assert "USING INDEX" in claim and "TEMP B-TREE" not in claim, claim
        assert f"SCAN {j.name}" not in groups and f"SCAN {j.name}" not in claim, groups
        assert "USING INTEGER PRIMARY KEY" in lease and f"SCAN {j.name}" not in lease, lease
        # The lone group's lease: the same, and the other groups probed as the groups' read probes them.
        assert "USING INTEGER PRIMARY KEY" in alone and "TEMP B-TREE" not in alone, alone
        assert f"SCAN {j.name}" not in alone and "SCAN alone_j" not in alone, alone
    elif db.kind == "postgresql":
        assert "Seq Scan" not in claim and "Sort" not in claim, claim
        assert f"Seq Scan on {j.name}" not in groups, groups
        assert f"{j.name}_pkey" in lease and "Seq Scan" not in lease, lease
        assert f"{j.name}_pkey" in alone and f"Seq Scan on {j.name}" not in alone and "Sort" not in alone, alone
    else:
        # MySQL's EXPLAIN rows: id | select_type | table | partitions | type | ...
        for line in plans["claim"] + plans["groups"] + plans["lease"] + plans["alone"]:
            cells = [c.strip() for c in line.split("|")]
            if cells[2] in (j.name, "alone_j"):
                assert cells[4] != "ALL" and cells[6] != "None" and "filesort" not in line, line
    claimed = store.claim("plan-test", 8, 30.0, time.time())
    assert len(claimed) == 8
    store.close()


@pytest.mark.parametrize("queues", [None, ("default", "other")], ids=["every-queue", "two-queues"])
def test_claim_reads_a_groups_best_ready_rows_in_index_order_without_statistics(db, queues):
    """A worker serving every queue, or an executor serving two, reads the few rows it leases.

    With the ready index led by the queue (schema 5 to 7), a claim serving
    every queue could not search it: SQLite and MariaDB read the group's rows
    of every state through ix_jobs_group, so each claim cost time in
    proportion to every job ever finished, and a claim serving two queues
    sorted its whole backlog. No statistics here (a young table, or
    autovacuum off): the plan must not depend on them.
    """
    store = db.store()
    j = store.tables.jobs
    now = time.time()
    rows = [
        {"state": state, "fn_name": "f", "payload": b"x", "created_at": now, "queue": queue}
        for state, n in ((schema.DONE, 4000), (schema.READY, 600))
        for queue in ("default", "other", "third")
        for _ in range(n // 3)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(j), rows)
    plans = store.explain_claim(scope=Scope(queues))
    index = f"{db.prefix}ix_jobs_ready_g"
    groups, claim = "\n".join(plans["groups"]), "\n".join(plans["claim"])
    assert index in groups and index in claim, (groups, claim)
    assert f"{db.prefix}ix_jobs_group" not in groups + claim, (groups, claim)
    if db.kind == "sqlite":
        assert "TEMP B-TREE" not in claim and f"SCAN {j.name}" not in groups + claim, (groups, claim)
    elif db.kind == "postgresql":
        # The groups' probe stops at each group's first ready row: no hash of every ready row.
        assert "Sort" not in claim and "Seq Scan on " + j.name not in groups + claim, (groups, claim)
        assert "HashAggregate" not in groups and "Hash Semi Join" not in groups, groups
    else:
        for line in plans["claim"] + plans["groups"]:
            cells = [c.strip() for c in line.split("|")]
            if cells[2] == j.name:
                assert index in cells[5:7] and "filesort" not in line, line  # the key chosen
    claimed = store.claim("plan-test", 8, 30.0, time.time(), scope=Scope(queues))
    assert len(claimed) == 8
    assert {row.queue for row in db.jobs() if row.id in {c.job_id for c in claimed}} <= set(queues or ("default", "other", "third"))
    store.close()


def test_edges_out_of_finished_jobs_are_found_by_index_without_statistics(db):
    """Releasing dependents looks each finished job's edges up by index, even before any ANALYZE.

    Without statistics (a young table, or autovacuum off) PostgreSQL took
    "depends_on_id = ANY(300 ids)" to match most of the edge table and
    hash-joined sequential scans of both tables: each finish then cost
    time proportional to every job ever stored.
    """
    store = db.store()
    j, d = store.tables.jobs, store.tables.deps
    with store.engine.begin() as conn:
        ids = insert_done(conn, store, 6000)
        root, uppers, lowers = ids[0], ids[1:3001], ids[3001:]
        # One upstream with 2,999 dependents skews any estimate; the others have one each.
        edges = [{"job_id": x, "depends_on_id": root} for x in lowers] + [
            {"job_id": x, "depends_on_id": u} for u, x in zip(uppers, lowers)
        ]
        conn.execute(insert(d), edges)
    asked = uppers[:300]
    stmt = store.ctx.sql.edges_out
    with store.engine.connect() as conn:
        found = sorted((int(a), int(b)) for a, b, _ in conn.execute(stmt, {"p_ids": asked}))
        plan = store.driver.explain(conn, stmt, {"p_ids": asked})
    store.close()
    assert found == sorted((x, u) for u, x in zip(asked, lowers))
    text_plan = "\n".join(plan)
    if db.kind == "postgresql":
        assert "Seq Scan" not in text_plan and "Hash Join" not in text_plan, text_plan
    elif db.kind == "sqlite":
        assert f"SCAN {d.name}" not in text_plan and f"SCAN {j.name}" not in text_plan, text_plan
    else:
        for line in plan:
            cells = [c.strip() for c in line.split("|")]
            if cells[2] in (d.name, j.name):
                assert cells[4] != "ALL", line


@pytest.mark.parametrize("likely", [False, True], ids=["read-first", "count-down-reads"])
def test_dependents_are_counted_down_through_the_primary_key_without_statistics(db, likely):
    """Finishing upstream jobs counts their waiting dependents down by primary key, however many jobs wait.

    Where ``UPDATE ... RETURNING`` reads the edges and counts down in one
    statement, PostgreSQL without statistics believed few rows waiting and
    read every waiting row through the state index, on each finish (a
    finish's cost would grow with the backlog of waiting jobs). Elsewhere
    the edges are read first. Either way the rows must end the same: a job
    with every upstream done is ready, one with one left waits, a batch
    whose children are all done is rolled up; by either way of counting
    down (the edges read first, or read by the count-down).
    """
    from dbexecutor.store import dag

    store = db.store()
    j, d = store.tables.jobs, store.tables.deps
    now = time.time()
    with store.engine.begin() as conn:
        ups = insert_done(conn, store, 400)
        # 20,000 waiting jobs, most on nothing asked about here: a plan that
        # reads the waiting rows (or the table) shows up as a scan of them.
        plain = insert_waiting(conn, store, 20000, open_deps=1)
        conn.execute(insert(j), [{"state": schema.WAITING, "fn_name": "f", "payload": b"w", "created_at": now,
                                  "batch": 1, "open_deps": 2}])
        batch = int(conn.execute(select(j.c.id).where(j.c.batch == 1)).scalar_one())
        conn.execute(j.update().where(j.c.id.in_(plain[:300])).values(open_deps=2))
        for k in (0, 1):  # the batch's children: results to roll up
            conn.execute(j.update().where(j.c.id == ups[k]).values(result=serialization.dump_result(k, ups[k])))
        # plain[i] (i < 300) waits on ups[i] and ups[i + 1]; the batch on ups[0] and ups[1].
        edges = [{"job_id": plain[i], "depends_on_id": ups[i + k]} for i in range(300) for k in (0, 1)]
        edges += [{"job_id": batch, "depends_on_id": ups[k], "position": k} for k in (0, 1)]
        conn.execute(insert(d), edges)
    asked = ups[:300]  # plain[0..299] lose both upstreams but plain[299] (ups[300] is not asked)
    store.ctx.dependents_likely = likely  # which of the two ways counts down (both where UPDATE returns rows)
    with store.engine.begin() as conn:
        released, finals = dag.release_dependents(store.ctx, conn, asked, now)
    rows = {r.id: r for r in db._select(lambda t: select(t.jobs).where(t.jobs.c.id.in_([*plain[:301], batch])))}
    assert [(rows[x].state, rows[x].open_deps) for x in plain[:299]] == [(schema.READY, 0)] * 299
    assert (rows[plain[299]].state, rows[plain[299]].open_deps) == (schema.WAITING, 1)
    assert (rows[plain[300]].state, rows[plain[300]].open_deps) == (schema.WAITING, 1)  # no edge from those asked
    assert rows[batch].state == schema.DONE and [f.job_id for f in finals] == [batch]
    assert serialization.load_result(rows[batch].result, batch) == [0, 1]
    # Only the jobs made ready, where the UPDATE says which; every one counted down when read first.
    assert released == (299 if likely and store.driver.update_returning else 300)
    assert store.ctx.dependents_likely
    stmt = store.ctx.sql.count_down_returning if store.driver.update_returning else None
    if db.kind == "postgresql":
        with store.engine.connect() as conn:
            plan = "\n".join(store.driver.explain(conn, stmt, {"p_ids": asked}))
        assert "Seq Scan" not in plan and "ix_jobs_state" not in plan and "Hash Join" not in plan, plan
        assert f"{j.name}_pkey" in plan, plan
    elif db.kind == "sqlite":
        with store.engine.connect() as conn:
            plan = "\n".join(_sqlite_plan(conn, stmt, {"p_ids": asked}))
        assert f"SCAN {j.name}" not in plan and f"SCAN {d.name}" not in plan, plan
        assert f"SEARCH {j.name} USING INTEGER PRIMARY KEY" in plan, plan
    store.close()


@pytest.mark.databases("sqlite", "postgresql")
def test_the_dependents_of_what_a_finish_won_are_counted_down_by_primary_key_without_statistics(db):
    """The count-down sent with the finish (``count_down_finished``) finds the won rows and their dependents by key.

    It reads which upstreams are done at the attempts it is given, so a
    lost lease (an attempt no longer the row's) counts nothing down. On
    PostgreSQL, without statistics, the won rows were first read by a scan
    of the jobs table, and each dependent's count probed the edges' index
    once per finished job (3x slower random DAGs of 10,000): the plan must
    show neither.
    """
    store = db.store()
    j, d = store.tables.jobs, store.tables.deps
    with store.engine.begin() as conn:
        ups = insert_done(conn, store, 400)
        plain = insert_waiting(conn, store, 5000, open_deps=2)
        # plain[i] (i < 300) waits on ups[i] and ups[i + 1].
        conn.execute(insert(d), [{"job_id": plain[i], "depends_on_id": ups[i + k]} for i in range(300) for k in (0, 1)])
    # ups[300] is named at an attempt it is not at (its lease was lost): plain[299] keeps one open.
    won = [(u, 0) for u in ups[:300]] + [(ups[300], 1)]
    stmt = store.ctx.sql.count_down_finished
    params = store.driver.pairs("p_done", won)
    with store.engine.begin() as conn:
        (out,) = store.driver.pipelined(conn, [(stmt, params)])
    assert sorted(out.keys) == ["batch", "id", "open_deps"]
    changed = {r[out.keys.index("id")]: r[out.keys.index("open_deps")] for r in out.rows}
    assert changed == {**{x: 0 for x in plain[:299]}, plain[299]: 1}
    rows = {r.id: r for r in db._select(lambda t: select(t.jobs).where(t.jobs.c.id.in_(plain[:301])))}
    assert [(rows[x].state, rows[x].open_deps) for x in plain[:299]] == [(schema.READY, 0)] * 299
    assert (rows[plain[299]].state, rows[plain[299]].open_deps) == (schema.WAITING, 1)
    assert (rows[plain[300]].state, rows[plain[300]].open_deps) == (schema.WAITING, 2)
    if db.kind == "postgresql":
        with store.engine.connect() as conn:
            plan = store.driver.explain(conn, stmt, params)
        text_ = "\n".join(plan)
        assert "Seq Scan" not in text_ and "ix_jobs_state" not in text_ and "Hash Join" not in text_, text_
        assert f"{j.name}_pkey" in text_, text_
        assert not [line for line in plan if "Index Cond" in line and "depends_on_id = ANY" in line], text_
    store.close()


def test_the_edges_out_of_what_a_finish_won_are_read_by_key_without_statistics(db):
    """The edges read sent with a finish (``edges_out_finished``) finds the won rows and their edges by key.

    Only the upstreams done at the attempts it is given: a lost lease's
    edges are not read (its dependents must not be counted down). On
    PostgreSQL, without statistics, neither the jobs nor the edges may be
    scanned or hash-joined (each finish would cost time with the table).
    """
    store = db.store()
    j, d = store.tables.jobs, store.tables.deps
    with store.engine.begin() as conn:
        ups = insert_done(conn, store, 400)
        waiting = insert_waiting(conn, store, 3000, open_deps=1)
        conn.execute(insert(d), [{"job_id": waiting[i], "depends_on_id": ups[i]} for i in range(400)])
    # ups[0:100] won; ups[100] is named at an attempt it is not at (its lease was lost).
    won = [(u, 0) for u in ups[:100]] + [(ups[100], 1)]
    stmt = store.ctx.sql.edges_out_finished
    params = store.driver.pairs("p_done", won)
    with store.engine.begin() as conn:
        (out,) = store.driver.pipelined(conn, [(stmt, params)])
    assert sorted((int(a), int(b), bool(c)) for a, b, c in out.rows) == [(waiting[i], ups[i], False) for i in range(100)]
    if db.kind != "mariadb":
        with store.engine.connect() as conn:
            plan = store.driver.explain(conn, stmt, params) if db.kind == "postgresql" else _sqlite_plan(conn, stmt, params)
        text_ = "\n".join(plan)
        if db.kind == "postgresql":
            assert "Seq Scan" not in text_ and "Hash Join" not in text_, text_
            assert f"{j.name}_pkey" in text_, text_
        else:
            assert f"SCAN {d.name}" not in text_ and f"SCAN {j.name}" not in text_, text_
    store.close()


def _sqlite_plan(conn, stmt, params):
    """SQLite's plan of ``stmt`` run with ``params``: the text and values SQLAlchemy sends (lists expanded or as JSON).

    Read from a run of ``stmt`` in a transaction rolled back afterwards.
    """
    sent: list[tuple[str, object]] = []

    def record(_conn, _cursor, statement, parameters, _context, _many):  # type: ignore[no-untyped-def]
        sent.append((statement, parameters))

    event.listen(conn, "before_cursor_execute", record)
    try:
        with conn.begin_nested() if conn.in_transaction() else conn.begin() as txn:
            conn.execute(stmt, params)
            txn.rollback()
    finally:
        event.remove(conn, "before_cursor_execute", record)
    statement, args = sent[0]
    return [str(row[-1]) for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, tuple(args))]


def _jit(db, conn):  # noqa: ANN001, ANN202
    """PostgreSQL's ``jit`` setting on ``conn`` (None elsewhere)."""
    return conn.exec_driver_sql("SHOW jit").scalar() if db.kind == "postgresql" else None


def test_many_finished_jobs_are_looked_up_without_a_jit_compile(db):
    """The edges out of a batch of finished jobs are read with JIT off, for that transaction only.

    On a table never analyzed, PostgreSQL estimates each id's edges at 1/200
    of the table: with a few hundred ids and some 30,000 edges the lookup
    passed jit_above_cost and the server compiled for 30-100 ms a statement
    that runs in one (a fan-out of 10,000 took 3.3 s instead of 1.9 s from
    its third run on the same tables). ``SET LOCAL`` ends with the
    transaction, so a pooled server connection goes back unchanged.
    """
    from dbexecutor.store import dag

    store = db.store()
    ids = fan_in(store, 100)

    with store.engine.connect() as conn:
        before = _jit(db, conn)
        conn.rollback()
        with conn.begin():
            assert len(dag.dependents(store.ctx, conn, ids[: dag.MANY_IDS - 1])) == dag.MANY_IDS - 1
            assert _jit(db, conn) == before  # a few ids: no extra round trip
        with conn.begin():
            found = dag.dependents(store.ctx, conn, ids[:-1])
            assert _jit(db, conn) == ("off" if db.kind == "postgresql" else None)
        assert sorted(found) == [(ids[-1], u, False) for u in ids[:-1]]
        with conn.begin():
            assert _jit(db, conn) == before  # the setting ended with its transaction
    store.close()


def test_statements_pipelined_for_many_ids_turn_jit_off_with_them(db):
    """A pipelined finish of many jobs sends its ``SET LOCAL jit = off`` in the same pipeline.

    Sent on its own it cost a round trip, and another for the ``BEGIN`` it
    opened: 0.5-0.8 ms of a ``map``'s last transaction.
    """
    from sqlalchemy import literal, select

    store = db.store()

    with store.engine.connect() as conn:
        before = _jit(db, conn)
        conn.rollback()
        with conn.begin():
            answers = store.driver.pipelined(conn, [(select(literal(7)), {}), (select(literal(8)), {})], many=True)
            assert [a.rows for a in answers] == [[(7,)], [(8,)]]
            assert _jit(db, conn) == ("off" if db.kind == "postgresql" else None)
        with conn.begin():
            assert _jit(db, conn) == before  # the setting ended with its transaction
    store.close()


def test_repeated_statements_are_planned_for_the_table_as_it_is_now(db):
    """A statement run many times is not stuck with a plan made when the table was small.

    psycopg prepares a statement on the server after a few runs, and
    PostgreSQL may then keep one generic plan for it: made on a young table,
    that plan scanned the table and went on scanning it as it grew (in the
    random-DAG benchmark, 500 ids by primary key took 129 ms a call; planned
    afresh, 4 ms). The store prepares nothing on the server (which PgBouncer's
    transaction pooling needs too), so every execution is planned afresh.
    """
    store = db.store()
    j = store.tables.jobs
    with store.engine.begin() as conn:
        ids = insert_done(conn, store, 20)
    with store.engine.connect() as conn:
        stmt = select(j.c.id).where(store.driver.in_ids(j.c.id, "p_ids"))
        for _ in range(20):  # past psycopg's threshold (5 runs) and the server's five custom plans
            assert len(conn.execute(stmt, {"p_ids": ids[:5]}).all()) == 5
        insert_done(conn, store, 5000)
        for _ in range(12):
            assert len(conn.execute(stmt, {"p_ids": ids[:5]}).all()) == 5
        if db.kind == "postgresql":
            prepared = conn.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars().all()
            assert prepared == [], prepared
        conn.rollback()
    store.close()


def _plan_of_sent(store, run, starts: str):  # noqa: ANN001
    """Call ``run()``, catch the one statement it sends that starts with ``starts``; ``run()``'s result and that statement's plan."""
    from sqlalchemy import event

    sent: list = []

    def seen(conn, cursor, statement, params, context, executemany):  # noqa: ANN001
        if statement.lstrip().startswith(starts):
            sent.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        out = run()
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    ((statement, params),) = sent
    with store.engine.connect() as conn, conn.begin() as txn:
        plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + statement, params).scalars())
        txn.rollback()
    return out, plan


@pytest.mark.databases("postgresql")
def test_finishing_and_writing_the_attempt_rows_is_planned_by_index_without_statistics(db):
    """PostgreSQL finishes a tick's jobs and writes their attempt rows in one statement: it reaches jobs by primary key only."""
    from dbexecutor.records import NewJob

    store = db.store()
    now = time.time()
    ups = [s.job_id for s in store.insert_jobs([NewJob("f", b"x", ()) for _ in range(3000)], now)]
    store.insert_jobs([NewJob("f", b"y", (u,)) for u in ups], now)
    (c,) = store.claim("plan-test", 1, 30.0, now)
    attempt = {"job_id": c.job_id, "attempt": c.attempt, "worker": "w", "started_at": now, "ended_at": now,
               "outcome": "ok", "outcome_lost": "lease lost (ok)", "detail": None}

    def finish() -> set[int]:
        with store.engine.connect() as conn, conn.begin() as txn:
            won = store.driver.finish_done_recording(conn, store.ctx.sql, [(c.job_id, c.attempt, b"r")], now, [attempt])
            txn.rollback()
        return won

    won, plan = _plan_of_sent(store, finish, "WITH fin")
    store.close()
    assert won == {c.job_id}
    assert f"Index Scan using {store.tables.jobs.name}_pkey" in plan, plan
    assert "Seq Scan" not in plan and "ix_jobs_state" not in plan, plan


@pytest.mark.databases("postgresql")
def test_a_single_submit_looks_for_other_work_once(db):
    """A job submitted to an idle executor goes in leased by one INSERT that first asks whether anything else is runnable.

    That question (two EXISTS, in a subquery ``f``) was pulled up into the
    INSERT's SELECT and copied into each of the five places that read
    ``f.free``: PostgreSQL planned both subqueries five times (0.33 ms of
    planning per submit, 0.10 with the subquery kept apart).
    """
    from dbexecutor.records import NewJob

    store = db.store()
    (inserted, _, claimed), plan = _plan_of_sent(
        store,
        lambda: store.finish_and_claim([], "plan-test", 2, 30.0, time.time(), [NewJob("f", b"x", ())]),
        "INSERT INTO " + store.tables.jobs.name,
    )
    store.close()
    assert [c.job_id for c in claimed] == [inserted[0].job_id]  # it went in leased
    assert plan.count("ix_jobs_ready_g") + plan.count(f"Seq Scan on {store.tables.jobs.name}") == 1, plan
    assert plan.count(f"on {store.tables.groups.name}") == 1, plan
