"""Submitting below jobs not written yet: a chain goes in with one commit, not one per link.

A future taken as an argument used to be written first (to learn its id
for the payload), so each link of ``f = ex.submit(g, f)`` cost a commit in
the submitting thread. Now the dependent names its upstream as unwritten
(``ArgRef`` in the payload, by position in ``arg_refs``), and the writer
fills in the ids: the upstream's own if an earlier commit wrote it, or
the one its row gets in the same write.
"""

from __future__ import annotations

import pickle
import time

import pytest
from sqlalchemy import select

import jobs
from dbexecutor import serialization
from dbexecutor.records import Earlier, NewJob, Unwritten
from dbexecutor.submitqueue import NotWritten
from seams import scheduler_of

T = 60  # seconds to wait for any one result


def _arguments(payload: bytes) -> tuple:
    """The (fn, args, kwargs) a stored payload unpickles to (unsigned: the tests use no secret)."""
    return pickle.loads(payload)


def _edges(store) -> list[tuple[int, int]]:
    """Every dependency edge, as (job, upstream)."""
    t = store.tables
    with store.engine.connect() as conn:
        return sorted((int(a), int(b)) for a, b in conn.execute(select(t.deps.c.job_id, t.deps.c.depends_on_id)))


def test_a_chain_is_submitted_without_writing_its_links(db):
    ex = db.executor()
    with scheduler_of(ex).hold_writes():
        chain = [ex.submit(jobs.add, 0, 1)]
        for _ in range(29):
            chain.append(ex.submit(jobs.add, chain[-1], 1))
        # Before, reading each upstream's id wrote it (and everything queued before it) here.
        assert db.jobs() == []
        assert not any(f.stored for f in chain)
    assert chain[-1].result(timeout=T) == 30
    assert [f.result(timeout=T) for f in chain] == list(range(1, 31))
    rows = {r.id: r for r in db.jobs()}
    ids = [f.job_id for f in chain]
    assert ids == sorted(ids), "ids follow submission order"
    for up, down in zip(ids, ids[1:]):
        assert rows[down].arg_refs == str(up)
        fn, args, kwargs = _arguments(rows[down].payload)
        assert type(args[0]) is serialization.ArgRef and args[0].index == 0
    assert rows[ids[0]].arg_refs == ""
    assert [rows[i].state for i in ids] == ["done"] * 30
    store = db.store()
    try:
        assert _edges(store) == [(down, up) for up, down in zip(ids, ids[1:])]
    finally:
        store.close()


def test_mixed_written_and_unwritten_upstreams_keep_their_positions(db):
    ex = db.executor()
    written = ex.submit(jobs.identity, 100)
    ex.flush()
    with scheduler_of(ex).hold_writes():
        a = ex.submit(jobs.identity, 1)
        b = ex.submit(jobs.identity, 2)
        # written first (a JobRef by id), then two unwritten ones, one of them twice, with after= too
        out = ex.submit(jobs.total, written, a, b, x=a, after=[a, written])
        nested = ex.submit(jobs.sum_list, [b, a, written])
        assert not out.stored and not a.stored
    assert out.result(timeout=T) == 100 + 1 + 2 + 1
    assert nested.result(timeout=T) == 103
    row = db.row(out.job_id)
    assert row.arg_refs == f"{written.job_id},{a.job_id},{b.job_id}"
    _, args, kwargs = _arguments(row.payload)
    assert type(args[0]) is serialization.JobRef and args[0].job_id == written.job_id
    assert [(type(x).__name__, x.index) for x in (args[1], args[2], kwargs["x"])] == [("ArgRef", 1), ("ArgRef", 2), ("ArgRef", 1)]
    row = db.row(nested.job_id)
    assert row.arg_refs == f"{b.job_id},{a.job_id},{written.job_id}"
    _, (inside,), _ = _arguments(row.payload)
    assert [type(x).__name__ for x in inside] == ["ArgRef", "ArgRef", "JobRef"]
    assert db.states([written, a, b, out, nested]) == {f.job_id: "done" for f in (written, a, b, out, nested)}
    store = db.store()
    try:
        edges = _edges(store)
    finally:
        store.close()
    assert [e for e in edges if e[0] == out.job_id] == sorted((out.job_id, u.job_id) for u in (written, a, b))


def test_a_chain_longer_than_one_tick_names_written_upstreams_by_id(db, monkeypatch):
    import dbexecutor.tickcommit as tickcommit_module

    # Three rows per tick: most links' upstreams were written by the tick before.
    monkeypatch.setattr(tickcommit_module, "_PENDING_PER_TICK", 3)
    ex = db.executor()
    with scheduler_of(ex).hold_writes():
        f = ex.submit(jobs.add, 0, 1)
        chain = [f]
        for _ in range(10):
            f = ex.submit(jobs.add, f, 1)
            chain.append(f)
    assert f.result(timeout=T) == 11
    rows = {r.id: r for r in db.jobs()}
    assert [rows[d.job_id].arg_refs for d in chain[1:]] == [str(u.job_id) for u in chain[:-1]]


def test_a_dependent_of_a_row_the_database_refused_fails_with_it(db):
    ex = db.executor()
    gone = ex.submit(jobs.identity, 0)
    assert gone.result(timeout=T) == 0
    store = db.store()
    try:
        assert store.purge(time.time() + 60) == 1  # its row is gone: a job after it cannot be stored
    finally:
        store.close()
    with scheduler_of(ex).hold_writes():
        orphan = ex.submit(jobs.identity, 1, after=[gone])
        below = ex.submit(jobs.add, orphan, 1)
        fine = ex.submit(jobs.identity, 2)
    assert fine.result(timeout=T) == 2
    with pytest.raises(ValueError, match="do not exist"):
        orphan.result(timeout=T)
    with pytest.raises(NotWritten, match="never stored"):
        below.result(timeout=T)
    assert below.job_id is None
    assert [r.state for r in db.jobs()] == ["done"]


def test_a_durable_chain_and_a_batch_map_over_queued_futures(db):
    ex = db.executor(durable_submit=True)
    f = ex.submit(jobs.add, 0, 1)
    for _ in range(9):
        f = ex.submit(jobs.add, f, 1)
        assert f.stored  # durable: written before submit returns
    assert f.result(timeout=T) == 10
    plain = db.executor()
    with scheduler_of(plain).hold_writes():
        ups = [plain.submit(jobs.identity, i) for i in range(3)]
        with plain.batch() as batch:
            batch.map(jobs.add, ups, [10, 20, 30])  # written at once: the queued upstreams first
    assert batch.result(timeout=T) == [10, 21, 32]


def test_map_over_futures_not_written_yet(db):
    ex = db.executor()
    with scheduler_of(ex).hold_writes():
        ups = [ex.submit(jobs.identity, i) for i in range(5)]
        results = ex.map(jobs.add, ups, range(5))  # queued behind their upstreams, nothing written yet
        assert db.jobs() == []
    assert list(results) == [0, 2, 4, 6, 8]
    assert {r.state for r in db.jobs()} == {"done"}


def test_the_store_inserts_rows_that_depend_on_rows_of_the_same_write(store):
    now = store.now()
    a = NewJob("tests.a", b"a", ())
    b = NewJob("tests.b", b"b", (Earlier(0),), refs=(Earlier(0),))
    c = NewJob("tests.c", b"c", (Earlier(1), Earlier(0)), refs=(Earlier(1),))
    d = NewJob("tests.d", b"d", ())
    rows = store.insert_jobs([a, b, c, d], now)
    ids = [r.job_id for r in rows]
    assert [r.state for r in rows] == ["ready", "waiting", "waiting", "ready"]
    t = store.tables
    with store.engine.connect() as conn:
        refs = {int(i): r for i, r in conn.execute(select(t.jobs.c.id, t.jobs.c.arg_refs))}
        opens = {int(i): n for i, n in conn.execute(select(t.jobs.c.id, t.jobs.c.open_deps))}
    assert refs == {ids[0]: "", ids[1]: str(ids[0]), ids[2]: str(ids[1]), ids[3]: ""}
    assert _edges(store) == sorted([(ids[1], ids[0]), (ids[2], ids[1]), (ids[2], ids[0])])
    assert [opens[i] for i in ids] == [0, 1, 2, 0]
    with pytest.raises(ValueError, match="not inserted before"):
        store.insert_jobs([NewJob("tests.e", b"e", (Earlier(0),))], now)
    with pytest.raises(TypeError, match="not named"):
        store.insert_jobs([NewJob("tests.f", b"f", (Unwritten(object()),))], now)
