"""The standard library's ``Executor.map`` contract: results are not kept alive, ``buffersize`` bounds reading ahead.

In the spirit of CPython's ``test_free_reference`` and of Python 3.14's
``map(..., buffersize=N)``, which dbexecutor offers on every Python it supports.
"""

from __future__ import annotations

import gc
import itertools
import time
import weakref

import pytest

import jobs
import more_jobs

T = 60


def _dies(ref: weakref.ref, within: float = 10.0) -> bool:
    """Whether the referent is collected within ``within`` seconds.

    The scheduler thread may still hold a future for a moment after it
    resolved it (it is inside ``resolve``); it must let go soon after.
    """
    end = time.monotonic() + within
    while True:
        gc.collect()
        if ref() is None:
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.01)


@pytest.mark.parametrize("chunksize", [1, 3])
def test_map_does_not_keep_results_alive(db, chunksize):
    ex = db.executor()
    seen = []
    for obj in ex.map(more_jobs.make_token, range(10), chunksize=chunksize):
        assert isinstance(obj, more_jobs.Token)
        seen.append(obj.value)
        ref = weakref.ref(obj)
        del obj
        assert _dies(ref), f"result {seen[-1]} is still alive while the map iterator is suspended"
    assert seen == list(range(10))


@pytest.mark.parametrize("chunksize", [1, 3])
def test_buffered_map_does_not_keep_results_alive(db, chunksize):
    ex = db.executor()
    seen = []
    # Not enumerate(): it keeps its last (index, item) tuple for reuse, and so the item.
    for obj in ex.map(more_jobs.make_token, range(7), chunksize=chunksize, buffersize=2):
        seen.append(obj.value)
        ref = weakref.ref(obj)
        del obj
        assert _dies(ref), f"result {seen[-1]} is still alive while the map iterator is suspended"
    assert seen == list(range(7))


def test_finished_futures_and_their_results_are_not_kept(db):
    ex = db.executor()
    fut = ex.submit(more_jobs.make_token, 1)
    result = fut.result(timeout=T)
    refs = weakref.ref(fut), weakref.ref(result)
    del fut, result
    assert all(_dies(r) for r in refs), "the executor keeps a finished future or its result"


def test_a_map_timeout_cancels_the_job_it_waited_for(db):
    ex = db.executor()
    results = ex.options(delay="1h").map(jobs.identity, [1, 2], timeout=0.5)
    with pytest.raises(TimeoutError):
        next(results)
    assert db.counts() == {"cancelled": 2}


# -- buffersize -------------------------------------------------------------------------------


@pytest.mark.parametrize("chunksize", [1, 3])
def test_buffersize_reads_an_endless_iterator_as_results_are_consumed(db, chunksize):
    ex = db.executor()
    source = more_jobs.Counted(itertools.count())
    buffersize = 4
    results = ex.map(jobs.square, source, chunksize=chunksize, buffersize=buffersize)
    first = list(itertools.islice(results, 25))
    assert first == [i * i for i in range(25)]
    jobs_read = -(-source.taken // chunksize)
    # CPython's bound: the consumed jobs, plus buffersize submitted ahead, plus the one being refilled.
    assert jobs_read <= -(-25 // chunksize) + buffersize + 1, (source.taken, jobs_read)
    assert sum(db.counts().values()) <= jobs_read
    results.close()  # leaving early cancels what has not started
    time.sleep(0.2)
    assert set(db.counts()) <= {"done", "cancelled"}


def test_buffersize_keeps_order_and_reaches_the_end(db):
    ex = db.executor(3)
    # A slow first job: later results must not overtake it, nor the buffer grow while it runs.
    pauses = more_jobs.Counted([0.5] + [0.0] * 11)
    results = ex.map(jobs.sleep, pauses, range(12), buffersize=2)
    assert next(results) == 0
    assert pauses.taken <= 3
    assert list(results) == list(range(1, 12))
    assert pauses.taken == 12


def test_buffersize_with_options_and_timeout(db):
    ex = db.executor()
    results = ex.options(group="buffered").map(jobs.identity, range(5), buffersize=1, timeout=T)
    assert list(results) == list(range(5))
    assert {r.group_key for r in db.jobs()} == {"buffered"}


def test_buffersize_is_checked_like_cpython(db):
    ex = db.executor()
    for buffersize, error in [(0, ValueError), (-1, ValueError), (1.5, TypeError), ("2", TypeError)]:
        with pytest.raises(error, match="buffersize must be"):
            ex.map(jobs.identity, range(3), buffersize=buffersize)
        with pytest.raises(error, match="buffersize must be"):
            ex.options(priority=1).map(jobs.identity, range(3), buffersize=buffersize)
    assert db.counts() == {}
    assert list(ex.map(jobs.identity, range(3), buffersize=None)) == [0, 1, 2]
