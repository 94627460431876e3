"""What operators read from the store, on every database: pages of jobs by index, throughput, ETA, graphs, health.

The lists page through indexes (keyset paging on the id within a state, a
group or a function): the plans are checked with EXPLAIN on a table of
tens of thousands of rows with fresh statistics, as the claim's are.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import insert, text

import jobs
from dbexecutor import hosts, schema
from dbexecutor.readmodels import JobFilter
from dbexecutor.records import NewJob, Registration

T = 60
ROWS = 20_000
GROUPS = ("default", "ingest", "reports", "api")
FUNCTIONS = ("app.load", "app.clean", "app.report", "app.mail")
_MYSQL_ACCESS = {"ALL", "index", "range", "ref", "eq_ref", "const", "system", "ref_or_null", "index_merge", "fulltext"}


def _fill(store, now: float) -> None:
    """ROWS jobs: mostly done, a few failed, waiting and ready, spread over groups, functions and a day of ages."""
    j = store.tables.jobs
    for g in GROUPS:
        store.configure_group(g)
    rows = []
    for i in range(ROWS):
        state = schema.FAILED if i % 97 == 0 else schema.WAITING if i % 89 == 0 else schema.READY if i % 83 == 0 else schema.DONE
        rows.append({
            "state": state, "fn_name": FUNCTIONS[i % 4], "payload": b"x", "group_key": GROUPS[i % 3],
            "job_key": f"k:{i}" if i % 10 == 0 else None, "created_at": now - 86400 + i * 86400 / ROWS,
            "finished_at": now - 3000 + i * 0.1 if state in (schema.DONE, schema.FAILED) else None,
        })
    with store.engine.begin() as conn:
        for start in range(0, ROWS, 5000):
            conn.execute(insert(j), rows[start:start + 5000])


def _analyze(db, store) -> None:
    j = store.tables.jobs
    with store.engine.connect() as conn:
        conn.execute(text({"sqlite": "ANALYZE", "postgresql": f"ANALYZE {j.name}"}.get(db.kind, f"ANALYZE TABLE {j.name}")))
        conn.commit()


def test_pages_of_jobs_are_read_through_indexes(db, store):
    now = time.time()
    _fill(store, now)
    _analyze(db, store)
    table = store.tables.jobs.name
    cases = {
        "everything": (JobFilter(), None, False),
        "a state": (JobFilter(states=("failed",)), None, False),
        "a common state, deep": (JobFilter(states=("done",)), ROWS // 2, False),
        # Not in the partial state index (SQLite, PostgreSQL): the primary key backwards, or the ready index and a sort.
        "ready": (JobFilter(states=("ready",)), None, True),
        "waiting or failed": (JobFilter(states=("waiting", "failed")), None, True),
        "a group": (JobFilter(group="reports"), None, False),
        "a group, deep": (JobFilter(group="reports"), ROWS // 2, False),
        "a function": (JobFilter(function="app.mail", exact_function=True), None, False),
        "a group and a state": (JobFilter(group="ingest", states=("failed",)), None, False),
        "a key": (JobFilter(key="k:100"), None, True),  # unique: a sort of one row at most
        "newer than an hour": (JobFilter(created_after=now - 3600), None, True),
        "older than an hour, deep": (JobFilter(created_before=now - 3600), ROWS // 3, True),
    }
    # ``age``: may sort what an index range found (a unique key, or an age range the planner finds small).
    for name, (f, before, age) in cases.items():
        plan = store.console.explain_page(f, before=before)
        lines = "\n".join(plan)
        if db.kind == "postgresql":
            assert f"Seq Scan on {table}" not in lines, (name, lines)
            if not age:
                assert "Sort" not in lines, (name, lines)
        elif db.kind == "sqlite":
            # An age alone may be read newest first along the primary key ("SCAN jobs"), stopping at a page.
            if f != JobFilter() and not age or f.key:
                assert "USING" in lines, (name, lines)
            if not age:
                assert "TEMP B-TREE" not in lines, (name, lines)
        else:
            for line in plan:
                cells = [c.strip() for c in line.split("|")]
                if cells[2] != table:
                    continue
                # id | select_type | table | [partitions (MySQL)] | type | possible_keys | key | key_len | ref | rows | Extra
                at = 3 if cells[3] in _MYSQL_ACCESS else 4
                kind, rows = cells[at], int(cells[at + 5]) if cells[at + 5].isdigit() else 0
                assert kind not in ("ALL", "index") or f == JobFilter() or (age and "filesort" not in line), (name, line)
                # A filesort is fine over the few rows an index lookup found, not over a table.
                assert age or "filesort" not in line or rows <= 1000, (name, line)
                if before is not None and not age:  # deep: a range of the filter's index, not every newer row
                    assert kind == "range", (name, line)
    # The pages themselves: every failed job, newest first, walked page by page.
    failed = [i for i in range(ROWS) if i % 97 == 0]
    seen, before = [], None
    while True:
        page = store.console.job_page(JobFilter(states=("failed",)), before=before, limit=50)
        seen += [j.id for j in page.jobs]
        if page.older is None:
            break
        before = page.older
    assert len(seen) == len(failed) and seen == sorted(seen, reverse=True)
    # And back: the page newer than the last one's first row is the one before it.
    last = store.console.job_page(JobFilter(states=("failed",)), before=seen[-60], limit=50)
    back = store.console.job_page(JobFilter(states=("failed",)), after=last.newer, limit=50)
    assert last.newer == seen[-59] and [j.id for j in back.jobs] == seen[-109:-59]


def test_keyset_pages_cover_a_filter_exactly_once(db, store):
    ex = db.executor(2)
    futs = [ex.options(group="g1" if i % 2 else "g2").submit(jobs.add, i, 1) for i in range(23)]
    assert [f.result(timeout=T) for f in futs] == [i + 1 for i in range(23)]
    want = sorted((f.job_id for i, f in enumerate(futs) if i % 2), reverse=True)
    f = JobFilter(group="g1", function="jobs.add", exact_function=True)
    first = store.console.job_page(f, limit=5)
    assert first.newer is None and [j.id for j in first.jobs] == want[:5]
    pages, page = [first], first
    while page.older is not None:
        page = store.console.job_page(f, before=page.older, limit=5)
        pages.append(page)
    assert [j.id for p in pages for j in p.jobs] == want
    assert pages[-1].older is None and pages[1].newer == want[5]
    again = store.console.job_page(f, after=pages[1].newer, limit=5)  # the "newer" link of page 2 shows page 1
    assert [j.id for j in again.jobs] == want[:5] and again.newer is None
    assert store.console.job_page(JobFilter(function="add"), limit=100).jobs  # a substring, as `list --function`
    assert store.console.job_page(JobFilter(function="add", exact_function=True), limit=100).jobs == []
    assert "jobs.add" in store.console.recent_functions()
    assert [j for p in pages for j in p.jobs][0].group == "g1"


def test_throughput_eta_and_overview(db, store):
    ex = db.executor(2)
    assert [f.result(timeout=T) for f in [ex.submit(jobs.add, i, i) for i in range(12)]] == [2 * i for i in range(12)]
    with pytest.raises(jobs.CustomError):
        ex.submit(jobs.fail, "no").result(timeout=T)
    later = [ex.options(delay=3600).submit(jobs.add, 1, i) for i in range(4)]
    ex.flush()
    view = store.console.overview()
    flow = view.throughput
    assert len(flow.done) == 15 and flow.done[-1] == 12 and flow.failed[-1] == 1 and sum(flow.done[:-1]) == 0
    assert abs(flow.since + 15 * flow.bucket - view.now) < 1e-6
    assert view.queued == len(later)
    assert view.eta is not None and abs(view.eta - len(later) / flow.rate(5)) < 1e-6
    assert flow.rate(5) == pytest.approx(13 / 300)
    assert view.status.states.done == 12 and view.as_dict()["throughput"]["done"][-1] == 12
    # Nothing finished lately: no ETA rather than a guess.
    with store.engine.begin() as conn:
        j = store.tables.jobs
        conn.execute(j.update().values(finished_at=j.c.finished_at - 7200).where(j.c.finished_at.is_not(None)))
    assert store.console.overview().eta is None


def test_graph_of_a_batch_a_chain_and_keys(db, store):
    ex = db.executor(2)
    a = ex.options(key=f"{db.prefix}etl:a").submit(jobs.add, 1, 1)
    b = ex.options(key=f"{db.prefix}etl:b").submit(jobs.add, a, 1)
    c = ex.submit(jobs.add, b, a)
    with ex.batch() as batch:
        kids = [batch.submit(jobs.square, i) for i in range(4)]
    assert c.result(timeout=T) == 5 and batch.result(timeout=T) == [0, 1, 4, 9]
    chain = store.console.graph(job_id=b.job_id)
    assert {n.id for n in chain.nodes} == {a.job_id, b.job_id, c.job_id}
    assert set(chain.edges) == {(a.job_id, b.job_id), (b.job_id, c.job_id), (a.job_id, c.job_id)}
    assert not chain.truncated and {n.state for n in chain.nodes} == {"done"}
    whole = store.console.graph(job_id=batch.job_id)
    assert {n.id for n in whole.nodes} == {batch.job_id, *(k.job_id for k in kids)}
    assert [n.batch for n in whole.nodes if n.id == batch.job_id] == [True]
    keyed = store.console.graph(key_prefix=f"{db.prefix}etl:")
    assert {n.id for n in keyed.nodes} == {a.job_id, b.job_id, c.job_id}
    small = store.console.graph(job_id=batch.job_id, limit=3)
    assert small.truncated and len(small.nodes) == 3
    assert store.console.graph(job_id=987654).nodes == []


def test_bulk_operations_walk_the_matching_jobs(db, store):
    ex = db.executor(2)
    bad = [ex.options(group="bulk").submit(jobs.fail_on, i, i) for i in range(7)]
    other = ex.submit(jobs.fail, "elsewhere")
    for f in bad + [other]:
        with pytest.raises(jobs.CustomError):
            f.result(timeout=T)
    revived, refused = store.console.retry_matching(JobFilter(states=("failed",), group="bulk"), 0, batch=3)
    assert sorted(revived) == sorted(f.job_id for f in bad) and refused == {}
    assert db.row(other.job_id).state == "failed"
    for f in bad:
        assert isinstance(ex.future(f.job_id).exception(timeout=T), jobs.CustomError)
    held = [ex.options(group="later", delay=3600).submit(jobs.add, i, 1) for i in range(5)]
    ex.flush()
    stopped = store.console.stop_matching(JobFilter(group="later"), running=False, batch=2)
    assert stopped.cancelled == sorted(f.job_id for f in held) and stopped.terminating == []
    assert {db.row(f.job_id).state for f in held} == {"cancelled"}


def test_health_report(db, store):
    report = store.console.health()
    assert report.schema_current and report.runnable_groups == [] and report.starved == []
    store.insert_jobs([NewJob("tests.f", b"x", ())], store.now())
    store.configure_group("paused", limit=0)
    store.insert_jobs([NewJob("tests.f", b"x", (), group="paused")], store.now())
    report = store.console.health()
    assert report.runnable_groups == ["default"] and report.starved == ["default"]  # a paused group starves nobody
    me = Registration(hosts.owner_name(), "worker", hosts.hostname(), __import__("os").getpid(), hosts.process_started(), "test", 2)
    store.register(me, 30.0)
    report = store.console.health()
    assert report.workers_alive == 1 and report.starved == []
    submitter = Registration(hosts.owner_name(), "submitter", hosts.hostname(), __import__("os").getpid(), hosts.process_started(), "t", 0)
    store.unregister(me.name)
    store.register(submitter, 30.0)
    assert store.console.health().starved == ["default"]  # a submit-only process runs nothing
    meta = store.tables.meta
    with store.engine.begin() as conn:
        conn.execute(meta.update().where(meta.c.name == "schema_version").values(value=str(schema.SCHEMA_VERSION - 1)))
    report = store.console.health()
    assert not report.schema_current and report.schema_version == schema.SCHEMA_VERSION - 1
