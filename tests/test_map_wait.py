"""``map``, ``concurrent.futures.wait``, ``as_completed`` and done callbacks."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import pytest

import jobs
from dbexecutor import JobTimeoutError

T = 60


# -- map ----------------------------------------------------------------------------


@pytest.mark.parametrize("chunksize, rows", [(1, 50), (7, 8)])
def test_map_results_in_order(db, chunksize, rows):
    ex = db.executor(2)
    results = list(ex.map(jobs.square, range(50), chunksize=chunksize, timeout=T))
    assert results == [i * i for i in range(50)]
    # chunksize decides how many jobs (rows) there are: ceil(50 / chunksize)
    assert db.counts() == {"done": rows}


def test_map_order_is_submission_order_not_completion_order(db):
    ex = db.executor(3)
    # Earlier items sleep longer, so they finish last.
    delays = [0.6, 0.3, 0.0, 0.0]
    assert list(ex.map(jobs.sleep, delays, range(4), timeout=T)) == [0, 1, 2, 3]


@pytest.mark.parametrize("chunksize", [1, 4])
def test_map_multiple_iterables(db, chunksize):
    ex = db.executor(2)
    assert list(ex.map(jobs.add, range(10), range(100, 110), chunksize=chunksize)) == [
        a + b for a, b in zip(range(10), range(100, 110))
    ]
    # Like zip, the shortest iterable decides the length.
    assert list(ex.map(jobs.add, range(3), range(100), chunksize=chunksize)) == [0, 2, 4]


def test_map_empty(db):
    ex = db.executor()
    assert list(ex.map(jobs.square, [])) == []
    assert db.counts() == {}


@pytest.mark.parametrize("chunksize", [0, -1])
def test_map_bad_chunksize(db, chunksize):
    ex = db.executor()
    with pytest.raises(ValueError):
        ex.map(jobs.square, range(5), chunksize=chunksize)
    assert db.counts() == {}, "map with a bad chunksize submitted jobs"


def test_map_timeout_raises_and_cancels_pending_jobs(db):
    ex = db.executor(2)
    n = 6
    start = time.monotonic()
    it = ex.map(jobs.sleep, [3] * n, timeout=0.5)
    with pytest.raises(cf.TimeoutError) as info:
        next(it)
    elapsed = time.monotonic() - start
    assert not isinstance(info.value, JobTimeoutError)  # the wait timed out, not a job
    assert elapsed < 2.5, f"map's timeout fired after {elapsed:.1f} s"
    # The jobs that had not started are cancelled at once; at most max_workers run.
    counts = db.counts()
    assert counts.get("ready", 0) == 0 and counts.get("waiting", 0) == 0, counts
    assert counts.get("cancelled", 0) >= n - 2, counts
    assert counts.get("leased", 0) + counts.get("running", 0) <= 2, counts
    ex.shutdown(wait=True)
    counts = db.counts()
    assert set(counts) <= {"done", "cancelled"}, counts
    assert sum(counts.values()) == n


def test_map_exception_keeps_its_type(db):
    ex = db.executor(2)
    it = ex.map(jobs.fail_on, range(6), [3] * 6, timeout=T)
    assert [next(it), next(it), next(it)] == [0, 1, 2]
    with pytest.raises(jobs.CustomError, match="bad item 3"):
        next(it)


def test_map_exception_with_chunks(db):
    ex = db.executor(2)
    with pytest.raises(jobs.CustomError, match="bad item 9"):
        list(ex.map(jobs.fail_on, range(20), [9] * 20, chunksize=4, timeout=T))


# -- wait -------------------------------------------------------------------------------


def test_wait_first_completed(db, tmp_path):
    ex = db.executor(2)
    flag = str(tmp_path / "release")
    try:
        slow = ex.submit(jobs.wait_for_file, flag, "slow", 30)
        fast = ex.submit(jobs.identity, "fast")
        done, not_done = cf.wait([slow, fast], timeout=T, return_when=cf.FIRST_COMPLETED)
        assert fast in done
        assert slow in not_done and not slow.done()
    finally:
        open(flag, "w").close()
    assert slow.result(timeout=T) == "slow"


def test_wait_first_exception(db, tmp_path):
    ex = db.executor(3)
    flag = str(tmp_path / "release")
    try:
        slow = ex.submit(jobs.wait_for_file, flag, "slow", 30)
        ok = ex.submit(jobs.identity, 1)
        bad = ex.submit(jobs.fail, "first exception")
        done, not_done = cf.wait([slow, ok, bad], timeout=T, return_when=cf.FIRST_EXCEPTION)
        assert bad in done
        assert isinstance(bad.exception(), jobs.CustomError)
        assert slow in not_done
    finally:
        open(flag, "w").close()
    assert slow.result(timeout=T) == "slow"


def test_wait_first_exception_without_exceptions_waits_for_all(db):
    ex = db.executor(2)
    fs = [ex.submit(jobs.sleep, 0.1 * i, i) for i in range(4)]
    done, not_done = cf.wait(fs, timeout=T, return_when=cf.FIRST_EXCEPTION)
    assert done == set(fs) and not not_done


def test_wait_all_completed(db):
    ex = db.executor(2)
    fs = [ex.submit(jobs.sleep, 0.05, i) for i in range(8)] + [ex.submit(jobs.fail)]
    done, not_done = cf.wait(fs, timeout=T, return_when=cf.ALL_COMPLETED)
    assert done == set(fs) and not_done == set()
    assert [f.result() for f in fs[:-1]] == list(range(8))


def test_wait_timeout_returns_not_done(db, tmp_path):
    ex = db.executor(2)
    flag = str(tmp_path / "release")
    try:
        slow = ex.submit(jobs.wait_for_file, flag, "slow", 30)
        start = time.monotonic()
        done, not_done = cf.wait([slow], timeout=0.3)
        assert time.monotonic() - start < 2
        assert not done and not_done == {slow}
    finally:
        open(flag, "w").close()
    assert slow.result(timeout=T) == "slow"


# -- as_completed -----------------------------------------------------------------------


def test_as_completed_yields_every_future(db):
    ex = db.executor(2)
    fs = [ex.submit(jobs.sleep, 0.02 * (i % 3), i) for i in range(12)]
    seen = list(cf.as_completed(fs, timeout=T))
    assert len(seen) == len(fs) and set(seen) == set(fs)
    assert sorted(f.result() for f in seen) == list(range(12))


def test_as_completed_order_follows_completion(db, tmp_path):
    ex = db.executor(2)
    slow = ex.submit(jobs.sleep, 0.8, "slow")
    fast = ex.submit(jobs.identity, "fast")
    assert [f.result() for f in cf.as_completed([slow, fast], timeout=T)] == ["fast", "slow"]


def test_as_completed_timeout(db, tmp_path):
    ex = db.executor(2)
    flag = str(tmp_path / "release")
    try:
        slow = [ex.submit(jobs.wait_for_file, flag, i, 30) for i in range(2)]
        start = time.monotonic()
        with pytest.raises(cf.TimeoutError):
            for _ in cf.as_completed(slow, timeout=0.3):
                pass
        assert time.monotonic() - start < 2
    finally:
        open(flag, "w").close()
    assert [f.result(timeout=T) for f in slow] == [0, 1]


# -- callbacks ------------------------------------------------------------------------------


def test_add_done_callback(db):
    ex = db.executor(2)
    called = threading.Event()
    seen: list = []

    def callback(fut):
        seen.append(fut.result())
        called.set()

    fut = ex.submit(jobs.add, 20, 22)
    fut.add_done_callback(callback)
    assert fut.result(timeout=T) == 42
    assert called.wait(10), "done callback was not called"
    assert seen == [42]

    # Added after the future is done: called at once, in this thread.
    late: list = []
    fut.add_done_callback(lambda f: late.append(f))
    assert late == [fut]


def test_done_callback_on_failure_and_cancel(db, tmp_path):
    ex = db.executor(1)
    got: list = []
    lock = threading.Lock()

    def callback(fut):
        with lock:
            got.append(fut)

    bad = ex.submit(jobs.fail, "cb")
    bad.add_done_callback(callback)
    assert isinstance(bad.exception(timeout=T), jobs.CustomError)

    flag = str(tmp_path / "release")
    try:
        holder = ex.submit(jobs.wait_for_file, flag, "held", 30)
        queued = ex.submit(jobs.identity, 1, after=[holder])
        queued.add_done_callback(callback)
        assert queued.cancel()
    finally:
        open(flag, "w").close()
    assert holder.result(timeout=T) == "held"
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got.count(bad) == 1 and got.count(queued) == 1


def test_leaving_map_early_cancels_pending_jobs(db):
    ex = db.executor(1)
    it = ex.map(jobs.sleep, [0.2] * 6, range(6))
    assert next(it) == 0
    it.close()
    counts = db.counts()
    assert counts.get("ready", 0) == 0 and counts.get("waiting", 0) == 0, counts
    assert counts.get("cancelled", 0) >= 4, counts  # at most one more was running
    ex.shutdown(wait=True)
    counts = db.counts()
    assert set(counts) <= {"done", "cancelled"} and sum(counts.values()) == 6, counts


def test_wait_and_as_completed_count_cancelled_futures(db, tmp_path):
    ex = db.executor(1)
    flag = str(tmp_path / "release")
    try:
        holder = ex.submit(jobs.wait_for_file, flag, "held", 30)
        queued = [ex.submit(jobs.identity, i, after=[holder]) for i in range(3)]
        assert all(f.cancel() for f in queued)
        done, not_done = cf.wait(queued, timeout=5)
        assert done == set(queued) and not not_done
        done, not_done = cf.wait(queued + [holder], timeout=5, return_when=cf.FIRST_COMPLETED)
        assert done == set(queued) and not_done == {holder}
        assert set(cf.as_completed(queued, timeout=5)) == set(queued)
    finally:
        open(flag, "w").close()
    assert holder.result(timeout=T) == "held"
