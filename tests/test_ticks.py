"""How the scheduler groups work into transactions.

A short ``map`` reaches the scheduler whole, so one transaction writes and
claims all of it. A tick that would only record results first lets the
children finish the short jobs they hold, when that takes less than a
transaction, and records them together; any wake-up (a submit) ends that wait.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import jobs
from dbexecutor import DBExecutor
from dbexecutor.pace import HOLD_MAX_ONE_WRITER, Pace
from polling import until
from seams import pin_pace, scheduler_of, slow_lease_renewal


def _record_ticks(ex: DBExecutor) -> list[tuple[int, int]]:
    """(rows inserted, results recorded) of each of the scheduler's transactions from now on.

    Results recorded: the reports it was given, and those of the jobs it
    started that ended before its ``COMMIT`` (``before_commit`` returns them).
    """
    calls: list[tuple[int, int]] = []
    store = ex._store
    real = store.finish_and_claim

    def recorded(reports: Any, owner: Any, limit: Any, ttl: Any, now: Any, new: Any = (), *rest: Any, **options: Any) -> Any:
        late: list[Any] = []
        hook = options.get("before_commit")
        if hook is not None:
            def counted(claimed: Any, done: Any, again: bool) -> Any:
                ended = hook(claimed, done, again) or []
                if not again:
                    late.clear()  # a try again replaces what the last one recorded
                late.extend(ended)
                return ended

            options["before_commit"] = counted
        out = real(reports, owner, limit, ttl, now, new, *rest, **options)
        calls.append((len(new), len(reports) + len(late)))
        return out

    store.finish_and_claim = recorded  # type: ignore[method-assign]
    return calls


def _warm(ex: DBExecutor) -> None:
    # Children started, and the scheduler has seen enough results to know the jobs are short.
    assert list(ex.map(jobs.identity, range(100))) == list(range(100))


def test_a_short_map_is_written_and_claimed_by_one_transaction(db):
    ex = db.executor(2)
    _warm(ex)
    ticks = _record_ticks(ex)
    assert list(ex.map(jobs.identity, range(200))) == list(range(200))
    assert [n for n, _ in ticks if n] == [200]
    assert sum(r for _, r in ticks) == 200


def test_short_jobs_are_prefetched_and_their_results_recorded_in_few_transactions(db):
    ex = db.executor(2)
    _warm(ex)
    assert scheduler_of(ex).pace.depth() >= 2  # recent jobs are short: each child holds several
    ticks = _record_ticks(ex)
    n = 400
    assert list(ex.map(jobs.identity, range(n))) == list(range(n))
    recorded = [r for _, r in ticks if r]
    assert sum(recorded) == n
    assert len(recorded) < n / 2, recorded  # many results per transaction, not one each


def _pin_linger(ex: DBExecutor) -> None:
    # As if a transaction took 30 s, and a tick may wait that long: wait for any short job.
    pin_pace(ex, tick_cost=30.0, linger_max=30.0)


def test_results_of_short_jobs_are_recorded_together(db):
    ex = db.executor(2)
    _warm(ex)
    _pin_linger(ex)
    ticks = _record_ticks(ex)
    # Nine jobs return at once and one sleeps: the results wait for the
    # tenth (expected short from the history), and one transaction records
    # them. The map's own transaction may record the first jobs it started
    # (see test_a_job_that_ends_before_its_lease_commits_is_recorded_by_that_commit).
    assert list(ex.map(jobs.sleep_if, range(10), [9] * 10, [0.5] * 10)) == list(range(10))
    [inserting] = [r for n, r in ticks if n]
    recording = [r for n, r in ticks if r and not n]
    assert len(recording) == 1 and inserting + recording[0] == 10, ticks


def _pin_hold(ex: DBExecutor) -> None:
    # As if a transaction took 30 s, and may stay open that long: it waits for any job it started early.
    pin_pace(ex, tick_cost=30.0, hold_max=30.0)


def test_a_job_that_ends_before_its_lease_commits_is_recorded_by_that_commit(db):
    # An idle executor's submit: one transaction inserts the row leased and
    # hands the job to an idle child before its COMMIT; the job ends while
    # the transaction waits for it, and the same COMMIT records it.
    ex = db.executor(2)
    _warm(ex)
    _pin_hold(ex)
    ticks = _record_ticks(ex)
    futures = []
    for i in range(3):  # one at a time: each on an idle executor
        futures.append(ex.submit(jobs.identity, i))
        assert futures[-1].result(timeout=30) == i
    assert ticks[:3] == [(1, 1)] * 3, ticks
    for f in futures:
        assert [a.outcome for a in db.attempts(f.job_id)] == ["ok"]
        assert db.row(f.job_id).state == "done"


def test_a_chain_of_short_jobs_goes_through_several_links_per_commit(db):
    # Written in one transaction, the chain's first link is leased and
    # handed out before its COMMIT; each link that ends while it waits is
    # recorded there, and the next one, released by that finish, is leased
    # and handed out in the same transaction.
    ex = db.executor(2)
    _warm(ex)
    _pin_hold(ex)
    ticks = _record_ticks(ex)
    with scheduler_of(ex).hold_writes():  # the ten rows go in together
        futures = [ex.submit(jobs.identity, 0)]
        for _ in range(9):
            futures.append(ex.submit(jobs.identity, futures[-1]))
    assert [f.result(timeout=60) for f in futures] == [0] * 10
    assert ticks[0] == (10, 10), ticks
    for f in futures:
        assert [a.outcome for a in db.attempts(f.job_id)] == ["ok"]


def test_a_short_map_is_run_and_recorded_by_the_transaction_that_writes_it(db):
    # Each idle child is handed as many of the new rows as it may hold
    # (several, while jobs are short) before the COMMIT, and the transaction
    # records them all: with one job per idle child it recorded two, and the
    # rest waited for the COMMIT and a second transaction.
    ex = db.executor(2)
    _warm(ex)
    assert scheduler_of(ex).pace.depth() >= 20
    _pin_hold(ex)
    ticks = _record_ticks(ex)
    assert list(ex.map(jobs.identity, range(40))) == list(range(40))
    assert ticks[0] == (40, 40), ticks


def test_dependents_released_before_a_commit_and_not_leased_by_it_are_claimed_at_once(db):
    # The root ends while its transaction waits and releases three
    # dependents; that transaction leases only as many as ended (one, for
    # the child that ran the root). The other two must be claimed by the next
    # tick at once, not a poll interval later.
    ex = db.executor(2, poll_interval=30.0, lease_ttl=120.0)
    _warm(ex)
    _pin_hold(ex)
    start = time.monotonic()
    with scheduler_of(ex).hold_writes():
        root = ex.submit(jobs.identity, 1)
        kids = [ex.submit(jobs.identity, root) for _ in range(3)]
    assert [k.result(timeout=60) for k in kids] == [1, 1, 1]
    # A few transactions here; a dependent left for the next wake-up waits
    # for the lease upkeep (about 5 s) or the poll (30 s).
    assert time.monotonic() - start < 4.0


def test_work_from_another_process_is_recorded_by_the_look_that_claims_it(db):
    # A submit-only executor writes the rows; the runner's idle look claims
    # each, hands it to an idle child before its COMMIT, waits for it and
    # records it: one transaction a job, as for its own submits. The
    # submitter hears of each result at that commit (it would poll for it
    # only every 30 s: a look that recorded without telling took that long).
    ex = db.executor(2, poll_interval=0.05)
    _warm(ex)
    _pin_hold(ex)
    looks: list[tuple[int, list[int]]] = []  # (jobs leased, jobs it recorded) of each look that leased some
    store = ex._store
    real = store.look

    def look(*args: Any, **kwargs: Any) -> Any:
        claimed, done = real(*args, **kwargs)
        if claimed:
            looks.append((len(claimed), [f.job_id for f in done.finals]))
        return claimed, done

    store.look = look  # type: ignore[method-assign]
    ticks = _record_ticks(ex)
    submitter = db.executor(1, run_jobs=False, poll_interval=30.0)
    for i in range(3):  # one at a time: each claimed by a look of the idle runner
        fut = submitter.submit(jobs.identity, i)
        assert fut.result(timeout=10) == i
        # The submitter may hear of the commit before the look has returned to the loop.
        until(lambda: len(looks) >= i + 1)
        assert looks[-1] == (1, [fut.job_id]), (looks, ticks)
        assert [a.outcome for a in db.attempts(fut.job_id)] == ["ok"]
    assert not [r for _, r in ticks if r], ticks  # nothing left for a tick to record


def test_where_one_writer_holds_the_database_back_a_transaction_waits_for_its_jobs_at_most_a_millisecond(db):
    # On SQLite a transaction that waits holds every other writer back (another
    # thread's durable submits waited 25 ms at the median beside a chain held
    # 10 ms at a time); on the servers it holds only its own rows.
    ex = db.executor(1)
    pace = scheduler_of(ex).pace
    if ex._store.driver.single_writer:
        assert pace.hold_max == HOLD_MAX_ONE_WRITER == 0.001
    else:
        assert pace.hold_max == Pace().hold_max == 0.01


def test_a_submit_ends_the_wait_for_running_jobs(db, tmp_path):
    ex = db.executor(2)
    _warm(ex)
    _pin_linger(ex)
    gate = str(tmp_path / "gate")  # holds the tenth job until the nine are checked
    results = ex.map(jobs.wait_if, range(10), [9] * 10, [gate] * 10)
    time.sleep(0.5)  # the nine short jobs have reported to the parent, which waits for the tenth
    start = time.monotonic()
    extra = ex.submit(jobs.identity, "x")
    # The submit wakes the scheduler: it writes the nine results with the new row.
    assert [next(results) for _ in range(9)] == list(range(9))
    assert time.monotonic() - start < 5.0
    open(gate, "w").close()  # before extra's result: extra may be queued behind the held job
    assert extra.result(timeout=30) == "x"
    assert next(results) == 9


def test_map_keeps_order_around_an_item_that_cannot_be_pickled(db):
    ex = db.executor(2)
    items: list[Any] = list(range(300))
    items[257] = threading.Lock()  # in map's second slice of 256
    results = ex.map(jobs.identity, items)
    assert [next(results) for _ in range(257)] == list(range(257))
    with pytest.raises(TypeError, match="pickle"):
        next(results)
    assert list(results) == []  # as ProcessPoolExecutor.map: the iterator ends at the first error
    # Nothing was stored for the item that failed; every other item has its row.
    assert len(db.jobs()) == 299


def test_a_result_read_by_the_lease_renewal_is_written_without_waiting_for_a_poll(db):
    # A job's first beat (0.1 s after it starts) makes the next tick renew
    # the leases, and the renewal reads the children's pipes. When the job
    # has answered by then, its result is read there, and the pipe is quiet
    # by the time the loop waits again. The wait must not sleep on it: a
    # worker's first job once took one poll interval longer this way.
    ex = db.executor(2, poll_interval=30.0, lease_ttl=120.0)
    assert ex.submit(jobs.identity, 0).result(timeout=60) == 0  # children up; the next reclaim is ~5 s away
    slow_lease_renewal(ex, 0.5)  # the job answers while the renewal after its first beat sleeps
    start = time.monotonic()
    assert ex.submit(jobs.sleep, 0.2, 1).result(timeout=60) == 1
    assert time.monotonic() - start < 2.5  # not the next reclaim (5 s) or poll (30 s)
