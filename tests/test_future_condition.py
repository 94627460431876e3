"""A ``JobFuture``'s lighter condition: fewer objects for the collector, the same ``Future`` behaviour.

``JobFuture`` sets ``Future.__init__``'s fields itself, with a condition over
a plain lock that keeps no bound methods; these tests hold it to the
standard ``Future``: its fields, waiting from several threads, callbacks
that read the future, cancelling while others wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import gc
import threading

import jobs
from polling import until
from dbexecutor import JobFuture

T = 60


def _own_tracked(fut: cf.Future) -> int:
    """The objects the collector tracks that a future made for itself: it, its condition with the condition's fields, its lists."""
    cond = fut._condition
    mine = [fut, cond, fut._waiters, fut._done_callbacks, *vars(cond).values()]
    return sum(1 for obj in mine if gc.is_tracked(obj))


def test_a_job_future_has_every_field_of_a_future():
    # JobFuture does not call Future.__init__: a Python that adds a field there must fail here.
    fresh, ours = cf.Future(), JobFuture(1)
    assert set(vars(fresh)) <= set(vars(ours))
    for name in vars(fresh):
        if name != "_condition":
            assert getattr(ours, name) == getattr(fresh, name), name
    assert isinstance(ours._condition, threading.Condition)


def test_a_job_future_makes_half_the_tracked_objects_of_a_future_and_no_deque_until_waited_on():
    assert _own_tracked(cf.Future()) >= 10
    fut: JobFuture[int] = JobFuture(1)
    assert _own_tracked(fut) <= 5
    assert set(vars(fut._condition)) == {"_lock", "_waiters"}
    assert fut._condition._waiters == ()
    fut.set_result(3)  # notify_all with no one waiting
    assert fut.result(timeout=0) == 3 and fut._condition._waiters == ()


def test_threads_waiting_on_a_job_future_wake_when_it_resolves():
    fut: JobFuture[int] = JobFuture(1)
    got: list[object] = []

    def waiter() -> None:
        got.append(fut.result(timeout=T))

    def timing_out() -> None:
        try:
            JobFuture(2).result(timeout=0.05)
        except cf.TimeoutError:
            got.append("timeout")

    threads = [threading.Thread(target=fn) for fn in (waiter, waiter, timing_out)]
    for t in threads:
        t.start()
    until(lambda: len(fut._condition._waiters) >= 2, T)  # both in wait(): the queue was made by the first
    assert len(fut._condition._waiters) == 2
    fut.set_result(7)
    for t in threads:
        t.join(T)
    assert sorted(map(str, got)) == ["7", "7", "timeout"]
    assert len(fut._condition._waiters) == 0


def test_asyncio_awaits_a_job_future_resolved_by_another_thread():
    fut: JobFuture[int] = JobFuture(1)

    async def main() -> int:
        threading.Timer(0.05, fut.set_result, (11,)).start()
        return await asyncio.wait_for(asyncio.wrap_future(fut), T)

    assert asyncio.run(main()) == 11


def test_results_reach_threads_waiting_every_way(db):
    ex = db.executor()
    futures = [ex.submit(jobs.sleep, 0.2, i) for i in range(6)]
    got: dict[str, object] = {}

    def by_result() -> None:
        got["result"] = [f.result(timeout=T) for f in futures]

    def by_wait() -> None:
        done, not_done = cf.wait(futures, timeout=T)
        got["wait"] = (len(done), len(not_done))

    def by_as_completed() -> None:
        got["as_completed"] = sorted(f.result() for f in cf.as_completed(futures, timeout=T))

    threads = [threading.Thread(target=fn) for fn in (by_result, by_wait, by_as_completed, by_result)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(T)
    assert got == {"result": list(range(6)), "wait": (6, 0), "as_completed": list(range(6))}


def test_a_callback_may_read_its_future(db):
    # Callbacks run outside the future's lock: one that reads the future (result, repr, done) must not block.
    ex = db.executor()
    seen: list[object] = []
    ran = threading.Event()

    def callback(fut: cf.Future) -> None:
        seen.append((fut.result(), fut.done(), "state=finished" in repr(fut), fut.exception()))
        ran.set()

    fut = ex.submit(jobs.add, 2, 3)
    fut.add_done_callback(callback)
    assert ran.wait(T)
    fut.add_done_callback(callback)  # added once done: runs at once, in this thread
    assert seen == [(5, True, True, None)] * 2


def test_a_cancel_reaches_a_thread_waiting_on_the_future(db):
    ex = db.executor(max_workers=1)
    blocker = ex.submit(jobs.sleep, 1.5)
    queued = ex.submit(jobs.add, 1, 1, after=[blocker])
    outcome: list[str] = []

    def waiter() -> None:
        try:
            queued.result(timeout=T)
            outcome.append("result")
        except cf.CancelledError:
            outcome.append("cancelled")

    t = threading.Thread(target=waiter)
    t.start()
    assert queued.cancel()
    t.join(T)
    assert outcome == ["cancelled"]
    assert cf.wait([queued], timeout=T).done == {queued}
    assert blocker.result(timeout=T) is None
