"""A tick that only records results does not look for work when none can be there.

The store says whether its last look for work left nothing runnable
(``Store.drained``). While that holds, less than a poll interval ago, and
nothing has woken the scheduler since (a submit, a notification of another
process's work, a due time, a release), a tick that records its children's
results skips the claim: an idle executor's round trip is one statement
shorter. Results that themselves make jobs runnable (a released dependent, a
retry) are claimed in the same transaction whatever the caller said.

The executor tests check which path claimed each job: a look wrongly skipped
leaves the work to a later tick that finds it (``Store.look``, the idle
tick's look, at most a few seconds later), instead of the transaction that
made it runnable or that first heard of it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import jobs
from conftest import statements
from dbexecutor.records import NewJob, Report
from dbexecutor.store import Store

TTL = 30.0
T = 30
NO_POLL = {"poll_interval": 60.0}  # fewer idle ticks: work is found by the finishes


def _job(n: int = 0, **options: Any) -> NewJob:
    return NewJob(fn_name=f"tests.job{n}", payload=b"payload %d" % n, deps=options.pop("deps", ()), **options)


def _done(job_id: int, attempt: int = 1) -> Report:
    return Report(job_id, attempt, True, b"result", "ok", ended_at=time.time())


def _failed(job_id: int, attempt: int = 1) -> Report:
    return Report(job_id, attempt, False, b"error", "exception", "RuntimeError: boom", ended_at=time.time(), retry_delay=0.0)


@pytest.fixture
def claim_probes(db: Any) -> Iterator[list[str]]:
    """Every statement of this process that reads this test's groups table (the claim's first look), once armed."""
    table = f"{db.prefix}groups".lower()
    with statements(lambda text: text.startswith("select") and f"from {table}" in text) as seen:
        yield seen


@pytest.fixture
def idle_claims(monkeypatch: Any) -> list[tuple[int, int]]:
    """(job id, attempt) of every job claimed by an idle tick's look (``Store.look``) rather than with a finish."""
    got: list[tuple[int, int]] = []
    real = Store.look

    def look(self: Store, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        got.extend((c.job_id, c.attempt) for c in out[0])
        return out

    monkeypatch.setattr(Store, "look", look)
    return got


def test_drained_says_whether_the_last_look_left_runnable_work(db, store):
    assert store.claim("me", 2, TTL, time.time()) == [] and store.drained
    store.insert_jobs([_job(1), _job(2), _job(3)], time.time())
    assert len(store.claim("me", 2, TTL, time.time())) == 2
    assert not store.drained, "one runnable job was left behind"
    assert len(store.claim("me", 2, TTL, time.time())) == 1
    assert store.drained, "the claim took every runnable job"
    # A tick that writes runnable rows without looking (no free slot) leaves it unknown.
    store.finish_and_claim([], "me", 0, TTL, time.time(), [_job(4)])
    assert not store.drained
    # A submit that goes in leased proves that nothing else was runnable.
    store.claim("me", 2, TTL, time.time())
    (row,) = store.finish_and_claim([], "me", 2, TTL, time.time(), [_job(5)])[0]
    assert row.state == "leased" and store.drained


def test_a_finish_need_not_look_for_work_when_told_nothing_is_there(db, store, claim_probes):
    leased, second = store.finish_and_claim([], "me", 2, TTL, time.time(), [_job(1), _job(2)])[2]
    assert store.drained
    # Work another process added without the caller hearing of it: a finish told
    # not to look leaves it alone (the caller's next look, at most a poll later, finds it).
    (other,) = store.insert_jobs([_job(3)], time.time())
    claim_probes.clear()
    _, done, claimed = store.finish_and_claim([_done(leased.job_id)], "me", 2, TTL, time.time(), look=False)
    assert [f.job_id for f in done.finals] == [leased.job_id] and claimed == []
    assert claim_probes == [], "no claim"
    assert db.row(other.job_id).state == "ready"
    # Told to look (the default), the same kind of tick finds it.
    _, _, claimed = store.finish_and_claim([_done(second.job_id)], "me", 2, TTL, time.time())
    assert [c.job_id for c in claimed] == [other.job_id] and claim_probes
    assert not store.drained or len(claimed) < 2


def test_results_that_make_jobs_runnable_are_claimed_without_being_asked(db, store):
    (upstream,) = store.finish_and_claim([], "me", 2, TTL, time.time(), [_job(1)])[2]
    (dependent,) = store.insert_jobs([_job(2, deps=(upstream.job_id,))], time.time())
    (flaky,) = store.insert_jobs([_job(3, retries=1)], time.time())
    assert [c.job_id for c in store.claim("me", 1, TTL, time.time())] == [flaky.job_id]
    assert db.row(dependent.job_id).state == "waiting"
    # The finish releases the dependent: it is claimed in the same transaction.
    _, done, claimed = store.finish_and_claim([_done(upstream.job_id)], "me", 2, TTL, time.time(), look=False)
    assert done.released == 1 and [c.job_id for c in claimed] == [dependent.job_id]
    # A failure retried at once: claimed again in the same transaction.
    _, done, claimed = store.finish_and_claim([_failed(flaky.job_id)], "me", 2, TTL, time.time(), look=False)
    assert done.retried == [flaky.job_id] and [(c.job_id, c.attempt) for c in claimed] == [(flaky.job_id, 2)]


def test_an_idle_round_trip_records_its_result_without_looking_for_work(db, claim_probes):
    ex = db.executor(2, **NO_POLL)
    assert ex.submit(jobs.add, 1, 1).result(timeout=T) == 2  # the group's row exists from here on
    claim_probes.clear()
    for i in range(5):
        assert ex.submit(jobs.add, i, 1).result(timeout=T) == i + 1
    # Each submit went in leased (nothing else was runnable) and its finish did not look.
    assert claim_probes == []
    assert db.counts().get("done") == 6


def test_a_chain_and_a_retry_are_claimed_by_the_finish_that_made_them_runnable(db, tmp_path, idle_claims):
    # Two slots: each claim leaves one free, so each finish is told that nothing
    # is runnable, and its own results (a released link, a retry) must be claimed anyway.
    ex = db.executor(2, **NO_POLL)
    links = [ex.submit(jobs.add, 0, 1)]
    for _ in range(4):
        links.append(ex.submit(jobs.add, links[-1], 1))
    assert links[-1].result(timeout=T) == 5
    marker = str(tmp_path / "failed-once")
    retried = ex.options(retries=1, retry_delay=0).submit(jobs.fail_first_time, marker, "second time")
    assert retried.result(timeout=T) == "second time"
    assert os.path.exists(marker)
    assert [(a.job_id, a.attempt) for a in db.attempts(retried.job_id)] == [(retried.job_id, 1), (retried.job_id, 2)]
    later = {(f.job_id, 1) for f in links[1:]} | {(retried.job_id, 2)}
    assert later.isdisjoint(idle_claims), "claimed by a later look, not by the finish that made it runnable"


def test_work_submitted_elsewhere_meanwhile_is_claimed_when_a_slot_frees(db, tmp_path, idle_claims):
    # Both slots filled by submits that went in leased (so nothing else was
    # runnable) and then another executor's job arrives: its notification (NOTIFY,
    # or the doorbell) must make the next finish look, though no slot was free to
    # claim it when it came.
    gate, started = str(tmp_path / "gate"), tmp_path / "started"
    started.mkdir()
    busy = db.executor(2, **NO_POLL)
    held = []
    for i in range(2):
        held.append(busy.submit(jobs.hold_until, gate, str(started), i))
        deadline = time.monotonic() + T
        while len(os.listdir(started)) <= i:  # not by its row: reading job_id would write it from this thread
            assert time.monotonic() < deadline, f"job {i} did not start"
            time.sleep(0.02)
    submitter = db.executor(1, run_jobs=False, **NO_POLL)
    other = submitter.submit(jobs.add, 2, 3)
    deadline = time.monotonic() + T
    while db.states([other]) != {other.job_id: "ready"}:
        assert time.monotonic() < deadline, "the other executor's job was not written"
        time.sleep(0.02)
    # Its future would learn of the end by a notification too; not what this test is about.
    submitter.shutdown(wait=False)
    with open(gate, "w") as f:
        f.write("go")
    assert [f.result(timeout=T) for f in held] == [0, 1]
    while db.states([other]) != {other.job_id: "done"}:
        assert time.monotonic() < deadline, "the job submitted elsewhere was not run"
        time.sleep(0.02)
    assert (other.job_id, 1) not in idle_claims, "claimed by a later look, not by the first finish"
