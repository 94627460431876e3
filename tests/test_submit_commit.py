"""When a submitted job's row is committed: grouped by the scheduler, or at once on demand.

``submit`` queues the row and returns; the scheduler writes everything queued
in the transaction of its next tick. ``flush()``, reading ``job_id`` and
``durable_submit=True`` write the queue in the caller's thread. The crash
tests kill a real submitting process and count the rows it left.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

import jobs
from dbexecutor import DBExecutor
from dbexecutor import submitqueue
from polling import until
from seams import scheduler_of, slow_ticks
from test_faults import _kill, _start_driver, _tail

T = 60


def _stored_ids(db) -> list[int]:
    return [int(r.id) for r in db.jobs()]


def test_the_scheduler_commits_queued_submits(db):
    ex = db.executor(2, run_jobs=False)  # nothing runs: the rows stay as written
    futs = [ex.submit(jobs.identity, i) for i in range(30)]
    # Nobody reads an id or flushes: the scheduler's tick writes them.
    assert until(lambda: all(f.stored for f in futs)), [f for f in futs if not f.stored]
    rows = db.jobs()
    assert [int(r.id) for r in rows] == [f.job_id for f in futs]
    assert {r.state for r in rows} == {"ready"}
    assert [f.job_id for f in futs] == sorted(f.job_id for f in futs), "ids follow submission order"


def test_flush_writes_everything_submitted(db):
    ex = db.executor(2, run_jobs=False)
    futs = [ex.submit(jobs.identity, i) for i in range(200)]
    ex.flush()
    assert all(f.stored for f in futs)
    assert _stored_ids(db) == [f.job_id for f in futs]
    ex.flush()  # nothing queued: a no-op
    assert len(_stored_ids(db)) == 200


def test_reading_job_id_writes_the_job(db):
    ex = db.executor(2, run_jobs=False)
    fut = ex.submit(jobs.identity, 1)
    job_id = fut.job_id
    assert isinstance(job_id, int) and fut.stored
    assert _stored_ids(db) == [job_id]


def test_durable_submit_returns_after_the_commit(db):
    ex = db.executor(2, run_jobs=False, durable_submit=True)
    for i in range(5):
        fut = ex.submit(jobs.identity, i)
        assert fut.stored  # no flush, no job_id read
        assert len(_stored_ids(db)) == i + 1


def test_durable_submits_from_several_threads(db):
    """Each durable submit returns with its row committed, while other threads submit and the jobs run."""
    ex = db.executor(2, durable_submit=True)
    store = scheduler_of(ex).store

    def submit_some(t: int) -> list:
        out = []
        for i in range(15):
            fut = ex.submit(jobs.identity, (t, i))
            assert fut.stored and store.existing([fut.job_id]) == {fut.job_id}
            out.append(fut)
        return out

    with ThreadPoolExecutor(4) as pool:
        per_thread = list(pool.map(submit_some, range(4)))
    futs = [f for fs in per_thread for f in fs]
    assert [f.result(timeout=T) for f in futs] == [(t, i) for t in range(4) for i in range(15)]
    for fs in per_thread:
        assert [f.job_id for f in fs] == sorted(f.job_id for f in fs), "one thread's ids follow its submits"
    assert len(db.jobs()) == 60


def test_a_durable_submit_is_written_by_its_own_thread(db):
    """The loop, busy recording and claiming the jobs that run, never takes a durable submit into its own tick.

    Were it queued where the loop could take it, the caller would wait for
    the loop's whole transaction (its claim and dispatch) instead of its own
    write: under a stream of durable submits the loop took about 4 in 10.
    """
    ex = db.executor(2, durable_submit=True)
    writers: list[str] = []
    store = scheduler_of(ex).store
    real, real_leasing = store.insert_jobs, store.insert_leasing

    def insert_jobs(jobs_, now):
        rows = real(jobs_, now)
        writers.extend([threading.current_thread().name] * len(rows))
        return rows

    def insert_leasing(job, *args):  # SQLite: a submit to an executor with a free slot goes in leased
        seen = len(writers)
        out = real_leasing(job, *args)
        if len(writers) == seen:  # not written through insert_jobs (seen there)
            writers.append(threading.current_thread().name)
        return out

    # The loop writes through finish_and_claim: not seen here.
    store.insert_jobs, store.insert_leasing = insert_jobs, insert_leasing
    futs = [ex.submit(jobs.identity, i) for i in range(60)]
    assert [f.result(timeout=T) for f in futs] == list(range(60))
    assert writers == ["MainThread"] * 60


def test_a_one_statement_durable_submit_runs_without_a_transaction_where_that_pays(db):
    """A job without upstreams, key or children is one INSERT: autocommit where the driver says so (PostgreSQL).

    Its BEGIN and COMMIT were two of a durable submit's three round trips.
    A write of several statements (a job and its edge) keeps its
    transaction everywhere, and the pooled connection goes back to
    transactions once the autocommitted write is done.
    """
    ex = db.executor(2, durable_submit=True)
    store = scheduler_of(ex).store
    jobs_table = store.tables.jobs.name
    seen: list[tuple[str, bool]] = []  # (table written, whether in autocommit), in the caller's thread

    @event.listens_for(store.engine, "before_cursor_execute")
    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if threading.current_thread() is threading.main_thread() and statement.lstrip().upper().startswith("INSERT"):
            into = statement.split()[2].strip('"`')
            seen.append((into, conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"))

    first = ex.submit(jobs.identity, 1)  # its group is new: the group's row and the job's, in one transaction
    assert first.result(timeout=T) == 1
    seen.clear()
    plain = ex.submit(jobs.identity, 2)
    assert store.driver.autocommits_one_write == (db.kind == "postgresql")
    assert seen == [(jobs_table, store.driver.autocommits_one_write)]
    seen.clear()
    dependent = ex.submit(jobs.add, plain, 1)  # the row and its edge: one transaction whatever the driver
    assert seen and not any(auto for _, auto in seen), seen
    assert dependent.result(timeout=T) == 3
    event.remove(store.engine, "before_cursor_execute", record)
    with store.engine.connect() as conn:  # whichever pooled connection comes back: not in autocommit
        assert conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT"
        assert conn.get_isolation_level() != "AUTOCOMMIT"
    assert [r.state for r in db.jobs()] == ["done"] * 3


@pytest.mark.parametrize("held", ["finish_and_claim", "look"])
def test_a_tick_that_writes_no_submits_does_not_hold_up_a_durable_submit(db, held):
    """A tick that only records results (``finish_and_claim``) or looks for work (``look``) runs without the
    submit queue's writer: a durable submit from another thread is written meanwhile, not after it."""
    ex = db.executor(1, durable_submit=True, poll_interval=0.2)
    ex.submit(jobs.identity, 0).result(timeout=T)  # the child is up
    sched = scheduler_of(ex)
    inside, release = threading.Event(), threading.Event()
    real = getattr(sched.store, held)

    def holding(*args, **kwargs):
        if threading.current_thread().name == "dbexecutor-scheduler" and not kwargs.get("rows", args[5] if len(args) > 5 else ()):
            inside.set()
            release.wait(T)
        return real(*args, **kwargs)

    setattr(sched.store, held, holding)
    with ThreadPoolExecutor(1) as pool:
        try:
            first = ex.submit(jobs.identity, 1)  # its result is recorded by finish_and_claim; the idle look follows
            assert inside.wait(T), f"the loop never called {held} without rows"
            second = pool.submit(ex.submit, jobs.identity, 2)
            # The loop is held inside its tick: the durable submit returns anyway, its row committed.
            assert second.result(timeout=10).stored
        finally:
            release.set()  # before the pool's exit waits for the submit
    assert first.result(timeout=T) == 1 and second.result().result(timeout=T) == 2


def test_queued_submits_run_and_keep_their_order(db):
    ex = db.executor(1)
    futs = [ex.submit(jobs.identity, i) for i in range(100)]
    assert [f.result(timeout=T) for f in futs] == list(range(100))
    rows = db.jobs()
    assert [r.state for r in rows] == ["done"] * 100
    assert [int(r.id) for r in rows] == [f.job_id for f in futs]


def test_a_dependency_on_a_queued_job_writes_it_first(db):
    ex = db.executor(2)
    a = ex.submit(jobs.identity, 20)
    b = ex.submit(jobs.add, a, 1)  # a's id goes into b's edges and payload
    c = ex.submit(jobs.add, b, 1, after=[a])
    assert c.result(timeout=T) == 22
    assert a.job_id < b.job_id < c.job_id


def test_a_refused_row_fails_only_its_own_future(db, tmp_path):
    """A job whose upstream was purged after it finished is refused; the rest of its commit goes in."""
    ex = db.executor(2)
    gate = str(tmp_path / "gate")
    held = ex.submit(jobs.wait_for_file, gate, 10)  # not finished: never purged
    gone = ex.submit(jobs.identity, 0)
    assert gone.result(timeout=T) == 0
    assert held.job_id is not None
    store = db.store()
    try:
        assert store.purge(time.time() + 60) == 1  # deletes the finished upstream row
    finally:
        store.close()
    with scheduler_of(ex).hold_writes():  # hold the writer so that all go in one commit
        before = [ex.submit(jobs.identity, 1), ex.submit(jobs.add, held, 1)]
        orphan = ex.submit(jobs.identity, 2, after=[gone])
        after = [ex.submit(jobs.add, held, 3), ex.submit(jobs.identity, 3)]
    open(gate, "w").close()
    assert [f.result(timeout=T) for f in before + after] == [1, 11, 13, 3]
    assert before[0].job_id > gone.job_id, "a purged job's id is never handed out again"
    with pytest.raises(ValueError, match="do not exist"):
        orphan.result(timeout=T)
    assert orphan.job_id is None
    assert sorted(r.state for r in db.jobs()) == ["done"] * 5


def test_shutdown_writes_and_runs_what_was_queued(db):
    ex = db.executor(2)
    futs = [ex.submit(jobs.identity, i) for i in range(50)]
    ex.shutdown(wait=True)
    assert [f.result(timeout=0) for f in futs] == list(range(50))
    assert len(_stored_ids(db)) == 50


def test_shutdown_cancel_futures_leaves_no_future_pending(db):
    ex = db.executor(1)
    blocker = ex.submit(jobs.sleep, 0.5, "b")
    assert until(blocker.running)
    with scheduler_of(ex).hold_writes():  # these stay queued until after the shutdown request
        futs = [ex.submit(jobs.identity, i) for i in range(20)]
        ex.shutdown(wait=False, cancel_futures=True)
    ex.shutdown(wait=True)
    assert blocker.result(timeout=T) == "b"
    assert all(f.cancelled() for f in futs)
    # Written, then cancelled: every cancelled job has its row, as the stored ones do.
    assert db.states(futs) == {f.job_id: "cancelled" for f in futs}


def test_cancel_of_a_queued_job(db):
    ex = db.executor(1)
    blocker = ex.submit(jobs.sleep, 0.5, "b")
    assert until(blocker.running)
    queued = ex.submit(jobs.identity, 1)
    below = ex.submit(jobs.add, queued, 1)
    assert queued.cancel() is True
    assert queued.cancelled() and below.cancelled()
    assert blocker.result(timeout=T) == "b"
    assert db.states([queued, below]) == {queued.job_id: "cancelled", below.job_id: "cancelled"}


@pytest.mark.parametrize("how", ["flush", "durable_submit"])
def test_a_killed_submitter_loses_nothing_it_flushed(db, tmp_path, how):
    """SIGKILL right after the jobs were flushed (or durably submitted): every row is there."""
    options = {**db.options, "max_workers": 1, "run_jobs": False, "durable_submit": how == "durable_submit"}
    import json

    n = 40
    proc, log = _start_driver(tmp_path, "submitter", "submitted", db.url, json.dumps(options), n, int(how == "flush"))
    try:
        assert until(lambda: "submitted" in _tail(log), T), _tail(log)
    finally:
        _kill(proc)
    rows = db.jobs()
    assert len(rows) == n, _tail(log)
    assert {r.state for r in rows} == {"ready"}
    # Another executor picks them up. Their futures by id: ex.futures() lists the
    # unfinished jobs only, and the first may be done before it reads the list.
    ex = DBExecutor.attach(db.url, max_workers=2, **db.options)
    db.executors.append(ex)
    assert sorted(ex.future(int(r.id)).result(timeout=T) for r in rows) == list(range(n))


def test_a_burst_of_large_payloads_is_written(db):
    """Eight 3 MB payloads queued together: more than one MySQL packet (16 MB) holds, so the rows go in several statements."""
    ex = db.executor(2)
    blob = b"\x00\xff" * (3 << 19)  # 3 MB, not valid text in any encoding
    with scheduler_of(ex).hold_writes():  # all eight go in one tick
        futs = [ex.submit(len, blob + bytes([i])) for i in range(8)]
    assert [f.result(timeout=T) for f in futs] == [len(blob) + 1] * 8


@pytest.mark.databases("mariadb")
def test_a_payload_over_the_servers_packet_limit_fails_its_future(db):
    """A row MySQL cannot take would make the server drop the connection (an outage to the retry loop)."""
    ex = db.executor(1)
    limit = ex._store.driver.max_payload
    assert limit is not None
    too_big = ex.submit(len, b"x" * (limit + 1))
    with pytest.raises(ValueError, match="max_allowed_packet"):
        too_big.result(timeout=T)
    assert ex.submit(len, b"x" * 10).result(timeout=T) == 10
    assert len(db.jobs()) == 1


def _inserts_by_thread(ex, monkeypatch) -> collections.Counter:
    """Rows the executor's submit queue writes from now on (flush and backlog writes), by the writing thread's name."""
    store = scheduler_of(ex).store
    real = store.insert_jobs
    rows: collections.Counter = collections.Counter()

    def insert_jobs(jobs_, *args, **kwargs):
        out = real(jobs_, *args, **kwargs)
        rows[threading.current_thread().name] += len(jobs_)
        return out

    monkeypatch.setattr(store, "insert_jobs", insert_jobs)
    return rows


def test_a_submitting_thread_writes_its_own_backlog_on_a_server(db, monkeypatch):
    # Where the driver says so (the servers), a thread that has queued a backlog
    # writes it itself when the loop is not writing; on SQLite only the loop writes.
    monkeypatch.setattr(submitqueue, "BACKLOG", 16)
    ex = db.executor(2)
    by_thread = _inserts_by_thread(ex, monkeypatch)
    slow_ticks(ex, 0.03)
    futs = [ex.submit(jobs.identity, i) for i in range(600)]
    assert [f.result(timeout=T) for f in futs] == list(range(600))
    assert [f.job_id for f in futs] == sorted(f.job_id for f in futs), "ids follow submission order"
    assert _stored_ids(db) == [f.job_id for f in futs]
    mine = by_thread[threading.current_thread().name]
    if db.kind == "sqlite":
        assert mine == 0, by_thread
    else:
        assert mine >= 16, by_thread  # at least one backlog went in from this thread


def test_a_thread_holding_the_writer_keeps_its_backlog_queued(db, monkeypatch):
    monkeypatch.setattr(submitqueue, "BACKLOG", 4)
    ex = db.executor(2, run_jobs=False)
    with scheduler_of(ex).hold_writes():
        futs = [ex.submit(jobs.identity, i) for i in range(40)]
        time.sleep(0.2)
        assert not any(f.stored for f in futs)
    assert until(lambda: all(f.stored for f in futs))
    assert _stored_ids(db) == [f.job_id for f in futs]


def test_a_backlog_the_database_cannot_take_now_is_left_to_the_loop(db, monkeypatch):
    # The submitting thread's write fails as if the server were restarting:
    # submit() does not raise, and the loop writes the rows later.
    monkeypatch.setattr(submitqueue, "BACKLOG", 8)
    ex = db.executor(2)
    store = scheduler_of(ex).store
    real = store.insert_jobs
    me = threading.current_thread()
    failed: list[int] = []

    def insert_jobs(jobs_, *args, **kwargs):
        if threading.current_thread() is me and not failed:
            failed.append(len(jobs_))
            raise OperationalError("INSERT", None, Exception("injected: server restarting"))
        return real(jobs_, *args, **kwargs)

    monkeypatch.setattr(store, "insert_jobs", insert_jobs)
    slow_ticks(ex, 0.03)
    futs = [ex.submit(jobs.identity, i) for i in range(200)]
    assert [f.result(timeout=T) for f in futs] == list(range(200))
    assert _stored_ids(db) == [f.job_id for f in futs]
    if db.kind != "sqlite":
        assert failed, "the submitting thread never tried to write its backlog"


def test_a_backlog_with_dependencies_is_left_to_the_loop(db, monkeypatch):
    # Jobs with upstreams lock those rows as they go in, and the loop's finishes
    # count them down: written beside the loop, on a second connection, the two
    # transactions waited on each other. While such a job is queued, only the loop writes.
    monkeypatch.setattr(submitqueue, "BACKLOG", 8)
    ex = db.executor(2)
    by_thread = _inserts_by_thread(ex, monkeypatch)
    me = threading.current_thread().name
    futs = [ex.submit(jobs.identity, 0)]
    for i in range(1, 300):
        futs.append(ex.submit(jobs.identity, i, after=[futs[i // 2]]))
    assert [f.result(timeout=T) for f in futs] == list(range(300))
    assert by_thread[me] == 0, by_thread
    # Once the loop has taken them, a backlog of independent jobs goes in from here again.
    slow_ticks(ex, 0.03)
    more = [ex.submit(jobs.identity, i) for i in range(300)]
    assert [f.result(timeout=T) for f in more] == list(range(300))
    assert (by_thread[me] == 0) == (db.kind == "sqlite"), by_thread
