"""Dependencies: ``after=``, futures as arguments, chains, fan-out/in, failure and cancel propagation."""

from __future__ import annotations

import concurrent.futures as cf
import os
import time

import pytest

import jobs
from dbexecutor import DBExecutor, DependencyFailed, serialization
from dbexecutor.store import Store

T = 60  # seconds to wait for any one result


def _lines(path) -> list[str]:
    with open(path) as f:
        return f.read().split()


# -- ordering -----------------------------------------------------------------


def test_after_orders_jobs(db, tmp_path):
    ex = db.executor(3)
    path = str(tmp_path / "order.txt")
    # Without the edges, b and c (instant) would finish long before a (slow).
    a = ex.submit(jobs.sleep_record, path, "a", 0.5)
    b = ex.submit(jobs.record, path, "b", after=[a])
    c = ex.submit(jobs.record, path, "c", after=[b])
    assert c.result(timeout=T) == "c"
    assert a.result(timeout=T) == "a" and b.result(timeout=T) == "b"
    assert _lines(path) == ["a", "b", "c"]


def test_after_start_and_finish_times(db):
    ex = db.executor(2)
    first = ex.submit(jobs.timed, 0.4, "first")
    second = ex.submit(jobs.timed, 0.0, "second", after=[first])
    s1, e1, v1 = first.result(timeout=T)
    s2, e2, v2 = second.result(timeout=T)
    assert (v1, v2) == ("first", "second")
    assert e1 - s1 >= 0.35
    assert s2 >= e1, "the dependent started before its upstream finished"


def test_after_does_not_pass_the_result(db):
    ex = db.executor(2)
    up = ex.submit(jobs.identity, 41)
    down = ex.submit(jobs.echo_args, 1, after=[up])
    assert down.result(timeout=T) == ((1,), {})
    assert up.result(timeout=T) == 41


# -- futures among the arguments ------------------------------------------------


def test_future_as_positional_argument(db):
    ex = db.executor()
    a = ex.submit(jobs.identity, 5)
    b = ex.submit(jobs.add, a, 10)
    assert b.result(timeout=T) == 15


def test_future_as_keyword_value(db):
    ex = db.executor()
    a = ex.submit(jobs.identity, "value")
    b = ex.submit(jobs.echo_kwargs, x=a, y=2)
    assert b.result(timeout=T) == {"x": "value", "y": 2}


def test_future_inside_list_tuple_and_dict_arguments(db):
    ex = db.executor()
    a = ex.submit(jobs.identity, 5)
    b = ex.submit(jobs.identity, "b")
    fut = ex.submit(jobs.echo_args, [a, 1, b], (b, 2, a), {"k": a, "other": 3}, kw=[a, b], d={"z": b})
    args, kwargs = fut.result(timeout=T)
    assert args == ([5, 1, "b"], ("b", 2, 5), {"k": 5, "other": 3})
    assert type(args[1]) is tuple
    assert kwargs == {"kw": [5, "b"], "d": {"z": "b"}}


def test_fan_in_from_a_list_argument(db):
    ex = db.executor()
    ups = [ex.submit(jobs.square, i) for i in range(10)]
    assert ex.submit(jobs.sum_list, ups).result(timeout=T) == sum(i * i for i in range(10))


def test_same_future_twice(db):
    ex = db.executor()
    a = ex.submit(jobs.identity, 7)
    b = ex.submit(jobs.total, a, a, x=a, after=[a])
    assert b.result(timeout=T) == 21


# -- shapes ---------------------------------------------------------------------


def test_chain_of_twenty(db):
    ex = db.executor()
    futs = [ex.submit(jobs.add, 0, 1)]
    for _ in range(19):
        futs.append(ex.submit(jobs.add, futs[-1], 1))
    assert futs[-1].result(timeout=T) == 20
    assert [f.result(timeout=T) for f in futs] == list(range(1, 21))
    assert set(db.states(futs).values()) == {"done"}


def test_fan_out(db):
    ex = db.executor()
    root = ex.submit(jobs.sleep, 0.2, 100)
    leaves = [ex.submit(jobs.add, root, i) for i in range(30)]
    assert [f.result(timeout=T) for f in leaves] == [100 + i for i in range(30)]


def test_fan_in(db):
    ex = db.executor()
    ups = [ex.submit(jobs.square, i) for i in range(30)]
    total = ex.submit(jobs.total, *ups)
    assert total.result(timeout=T) == sum(i * i for i in range(30))
    # ordering-only fan-in
    last = ex.submit(jobs.identity, "end", after=ups)
    assert last.result(timeout=T) == "end"
    assert all(f.done() for f in ups)


# -- failure propagation --------------------------------------------------------------


def test_failure_propagates_transitively(db):
    ex = db.executor()
    root = ex.submit(jobs.fail, "root broke")
    d1 = ex.submit(jobs.add, root, 1)  # argument
    d1b = ex.submit(jobs.identity, 1, after=[root])  # ordering only
    d2 = ex.submit(jobs.add, d1, 1)  # transitively
    d3 = ex.submit(jobs.identity, 3, after=[d2])
    d4 = ex.submit(jobs.echo_kwargs, x=[d1b])  # inside a keyword list
    ok = ex.submit(jobs.identity, "unrelated")

    with pytest.raises(jobs.CustomError, match="root broke"):
        root.result(timeout=T)
    for fut in (d1, d1b, d2, d3, d4):
        with pytest.raises(DependencyFailed) as info:
            fut.result(timeout=T)
        err = info.value
        assert isinstance(err.__cause__, jobs.CustomError), repr(err.__cause__)
        assert "root broke" in str(err.__cause__)
        assert err.root_job_id == root.job_id
    assert d1.exception().upstream_job_id == root.job_id
    assert d1b.exception().upstream_job_id == root.job_id
    assert d2.exception().upstream_job_id == d1.job_id
    assert d3.exception().upstream_job_id == d2.job_id
    assert ok.result(timeout=T) == "unrelated"

    states = db.states([root, d1, d1b, d2, d3, d4])
    assert set(states.values()) == {"failed"}
    # The dependents never ran: only the root has an attempt.
    ran = [r.job_id for r in db.attempts()]
    assert root.job_id in ran
    assert not {d1.job_id, d1b.job_id, d2.job_id, d3.job_id, d4.job_id} & set(ran)


def test_fan_out_failure(db):
    ex = db.executor()
    root = ex.submit(jobs.fail, "fan")
    leaves = [ex.submit(jobs.add, root, i) for i in range(30)]
    for f in leaves:
        assert isinstance(f.exception(timeout=T), DependencyFailed)
        assert isinstance(f.exception().__cause__, jobs.CustomError)
    assert set(db.states(leaves).values()) == {"failed"}


def test_submit_after_upstream_already_failed(db):
    ex = db.executor()
    root = ex.submit(jobs.fail, "early")
    assert isinstance(root.exception(timeout=T), jobs.CustomError)
    late_arg = ex.submit(jobs.add, root, 1)
    late_after = ex.submit(jobs.identity, 1, after=[root])
    for fut in (late_arg, late_after):
        with pytest.raises(DependencyFailed) as info:
            fut.result(timeout=T)
        assert isinstance(info.value.__cause__, jobs.CustomError)
        assert "early" in str(info.value.__cause__)
        assert info.value.upstream_job_id == root.job_id
    assert set(db.states([late_arg, late_after]).values()) == {"failed"}
    # And further down from a failed late job.
    later = ex.submit(jobs.identity, 2, after=[late_arg])
    with pytest.raises(DependencyFailed) as info:
        later.result(timeout=T)
    assert isinstance(info.value.__cause__, jobs.CustomError)


# -- cancel propagation -----------------------------------------------------------------


def test_cancel_propagates_to_dependents(db, tmp_path):
    ex = db.executor(2)
    flag = str(tmp_path / "release")
    holder = ex.submit(jobs.wait_for_file, flag, "held", 30)
    try:
        up = ex.submit(jobs.identity, 1, after=[holder])  # waiting: not started
        d1 = ex.submit(jobs.add, up, 1)
        d2 = ex.submit(jobs.add, d1, 1)
        d3 = ex.submit(jobs.identity, 3, after=[d2])
        d4 = ex.submit(jobs.echo_args, [up])
        assert up.cancel() is True
        assert up.cancelled()
        for fut in (up, d1, d2, d3, d4):
            assert fut.cancelled(), fut
            assert fut.done()
            with pytest.raises(cf.CancelledError):
                fut.result(timeout=5)
    finally:
        open(flag, "w").close()
    assert holder.result(timeout=T) == "held"
    states = db.states([up, d1, d2, d3, d4])
    assert set(states.values()) == {"cancelled"}, states
    assert db.states([holder]) == {holder.job_id: "done"}
    # None of the cancelled jobs ran.
    assert not {f.job_id for f in (up, d1, d2, d3, d4)} & set([r.job_id for r in db.attempts()])
    # The executor is still healthy.
    assert ex.submit(jobs.add, 1, 1).result(timeout=T) == 2


def test_submit_below_a_cancelled_job(db, tmp_path):
    ex = db.executor(2)
    flag = str(tmp_path / "release")
    holder = ex.submit(jobs.wait_for_file, flag, "held", 30)
    try:
        up = ex.submit(jobs.identity, 1, after=[holder])
        assert up.cancel() is True
        # Submitting below a cancelled job gives a cancelled job.
        late_arg = ex.submit(jobs.add, up, 1)
        late_after = ex.submit(jobs.identity, 2, after=[up])
        for fut in (late_arg, late_after):
            assert fut.cancelled(), fut
            with pytest.raises(cf.CancelledError):
                fut.result(timeout=5)
    finally:
        open(flag, "w").close()
    assert holder.result(timeout=T) == "held"
    # The executor keeps working after resolving those futures (and polling their rows).
    time.sleep(0.3)
    assert ex.submit(jobs.add, 1, 1).result(timeout=T) == 2
    assert set(db.states([up, late_arg, late_after]).values()) == {"cancelled"}
    assert not {late_arg.job_id, late_after.job_id} & set([r.job_id for r in db.attempts()])


# -- whose futures are valid dependencies --------------------------------------------------


def test_future_of_a_second_executor_on_the_same_tables(db):
    ex1 = db.executor(1)
    ex2 = db.executor(1)
    a = ex1.submit(jobs.sleep, 0.2, 20)
    b = ex2.submit(jobs.add, a, 1)
    c = ex1.submit(jobs.add, b, 1, after=[a])
    assert b.result(timeout=T) == 21
    assert c.result(timeout=T) == 22


def test_plain_future_is_rejected(db):
    ex = db.executor()
    plain: cf.Future = cf.Future()
    with pytest.raises(TypeError):
        ex.submit(jobs.identity, plain)
    with pytest.raises(TypeError):
        ex.submit(jobs.echo_kwargs, x=plain)
    with pytest.raises(TypeError):
        ex.submit(jobs.identity, [1, plain])
    with pytest.raises(TypeError):
        ex.submit(jobs.identity, 1, after=[plain])
    done: cf.Future = cf.Future()
    done.set_result(1)
    with pytest.raises(TypeError):
        ex.submit(jobs.identity, 1, after=[done])
    store = db.store()
    try:
        assert store.count_states() == {}, "a rejected submit wrote a row"
    finally:
        store.close()


def test_future_from_another_prefix_is_rejected(db):
    ex = db.executor()
    other_prefix = f"{db.prefix}o_"
    other = DBExecutor(db.url, 1, prefix=other_prefix, poll_interval=0.05)
    try:
        foreign = other.submit(jobs.identity, 1)
        assert foreign.result(timeout=T) == 1
        with pytest.raises(TypeError):
            ex.submit(jobs.identity, foreign)
        with pytest.raises(TypeError):
            ex.submit(jobs.identity, 1, after=[foreign])
        with pytest.raises(TypeError):
            ex.submit(jobs.echo_kwargs, x={"k": foreign})
        store = db.store()
        try:
            assert store.count_states() == {}
        finally:
            store.close()
    finally:
        other.shutdown(wait=True)
        s = Store(db.url, other_prefix, create=False)
        s.drop_schema()
        s.close()


def test_future_from_another_database_is_rejected(db, tmp_path):
    ex = db.executor()
    other = DBExecutor(f"sqlite:///{tmp_path / 'other.db'}", 1, poll_interval=0.05)
    try:
        foreign = other.submit(jobs.identity, 1)
        assert foreign.result(timeout=T) == 1
        with pytest.raises(TypeError):
            ex.submit(jobs.add, foreign, 1)
        with pytest.raises(TypeError):
            ex.submit(jobs.identity, 1, after=[foreign])
    finally:
        other.shutdown(wait=True)
    store = db.store()
    try:
        assert store.count_states() == {}
    finally:
        store.close()
    assert os.path.exists(tmp_path / "other.db")


def test_only_futures_reach_the_dependency_check_and_containers_without_one_are_kept_as_they_are():
    # A map chunk's argument tuples, or a list of a million numbers, cost no Python call per item.
    seen: list[object] = []

    def to_ref(x: object) -> str:
        seen.append(x)
        return "ref"

    f, big, t = cf.Future(), list(range(1000)), (4, "x")
    args, kwargs = serialization.map_arguments((big, [1, f], 3, f), {"d": {"a": f, "b": 2}, "t": t}, to_ref, (cf.Future,))
    assert args[0] is big and args[1:] == ([1, "ref"], 3, "ref")
    assert kwargs == {"d": {"a": "ref", "b": 2}, "t": t} and kwargs["t"] is t
    assert seen == [f, f, f]

