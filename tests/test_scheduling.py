"""Scheduling: weighted fair share, group limits across executors, priorities, delays, wake-up.

Start order is what the children saw: the ``started_at`` each child reported
for the job's first attempt. (The row's own ``started_at`` is the claim's
time, shared by every job one claim leased; those jobs then start one after
another, in the order the claim handed them out.)
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import wait
from types import SimpleNamespace

import pytest
from sqlalchemy import event

import jobs

GATE = 1.5  # seconds: jobs submitted behind a common run_after become runnable together


def _wait_done(db, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while db.counts().get("done", 0) < n:
        assert time.monotonic() < deadline, f"fewer than {n} jobs done after {timeout} s: {db.counts()}"
        time.sleep(0.05)


def _starts(db) -> list:
    """Jobs that ran, in the order their children started them (``started_at``: the child's clock)."""
    first: dict[int, float] = {}
    for a in db.attempts():
        if a.started_at is not None:
            first[a.job_id] = min(first.get(a.job_id, a.started_at), a.started_at)
    rows = [
        SimpleNamespace(**{**r._mapping, "started_at": first[r.id]}) for r in db.jobs() if r.id in first and not r.batch
    ]
    return sorted(rows, key=lambda r: (r.started_at, r.id))


@pytest.mark.parametrize("executors", [1, 2])
def test_weights_3_to_1_share_one_slot_per_executor(db, executors):
    exs = [db.executor(max_workers=1) for _ in range(executors)]
    exs[0].configure_group("heavy", weight=3)
    gate = time.time() + GATE
    for g in ("heavy", "light"):
        for k, ex in enumerate(exs):
            # map() queues the rows and the ticks write them: both backlogs are in before the gate
            # opens. The light group's weight comes with its options (stored on submit).
            ex.options(group=g, weight=1 if g == "light" else None, run_after=gate).map(jobs.identity, range(k, 200, executors))
    _wait_done(db, 200)
    first = _starts(db)[:200]
    assert min(r.started_at for r in first) >= gate
    share = Counter(r.group_key for r in first)
    ratio = share["heavy"] / share["light"]
    assert 3 * 0.85 <= ratio <= 3 * 1.15, share
    weights = {g.name: g.weight for g in exs[0].groups()}
    assert weights["heavy"] == 3 and weights["light"] == 1


def test_more_groups_than_slots_every_group_starts_early(db):
    ex = db.executor(max_workers=2)
    # Both children up first: the order under test is the claim's, and a child
    # still starting (seen once in CI, >120 ms) would hold its job back.
    assert list(ex.map(jobs.identity, range(4))) == [0, 1, 2, 3]
    assert len({r.worker for r in db.attempts()}) == 2
    gate = time.time() + GATE
    groups = [f"g{i}" for i in range(5)]
    for g in groups:
        ex.options(group=g, run_after=gate).map(jobs.sleep, [0.02] * 10)
    _wait_done(db, 4 + 50)
    # Two slots: the five groups start in the first three rounds of two. Within
    # a round the two children start microseconds apart, in either order, so
    # the fifth start may already be g0's second job, by a hair.
    first = [r for r in _starts(db) if r.group_key in groups][:6]
    assert {r.group_key for r in first} == set(groups), [(r.group_key, r.started_at) for r in first]


def test_a_group_back_from_idle_does_not_get_a_backlog_of_turns(db):
    # "old" runs alone for a while; "new" then arrives. Its virtual time starts at the
    # global one, so the two alternate instead of "new" taking every slot to catch up.
    ex = db.executor(max_workers=1)
    ex.configure_group("old")
    ex.configure_group("new")
    list(ex.options(group="old").map(jobs.identity, range(60)))
    gate = time.time() + GATE
    ex.options(group="old", run_after=gate).map(jobs.identity, range(40))
    ex.options(group="new", run_after=gate).map(jobs.identity, range(40))
    _wait_done(db, 60 + 40)
    later = [r for r in _starts(db) if r.started_at >= gate][:40]
    share = Counter(r.group_key for r in later)
    assert 15 <= share["new"] <= 25, share


def _max_overlap(rows) -> int:
    events = sorted([(r.started_at, 1) for r in rows] + [(r.finished_at, -1) for r in rows], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def test_group_limit_holds_across_three_executors(db):
    exs = [db.executor(max_workers=2) for _ in range(3)]
    exs[0].configure_group("api", limit=2)
    api = [exs[i % 3].options(group="api").submit(jobs.sleep, 0.3, i) for i in range(12)]
    other = [exs[i % 3].submit(jobs.sleep, 0.3, i) for i in range(12)]
    done, not_done = wait(api + other, timeout=60)
    assert not not_done
    assert [f.result() for f in api] == list(range(12))
    rows = db.jobs()
    api_rows = [r for r in rows if r.group_key == "api"]
    assert _max_overlap(api_rows) == 2  # never three at once, and the limit is used
    assert _max_overlap(rows) >= 4  # the other group used the remaining slots meanwhile


def test_limit_zero_pauses_a_group_and_lifting_it_resumes(db):
    ex = db.executor(max_workers=2)
    ex.configure_group("paused", limit=0)
    held = ex.options(group="paused").submit(jobs.identity, "held")
    free = ex.submit(jobs.identity, "free")
    assert free.result(timeout=30) == "free"
    time.sleep(0.3)
    assert db.row(held.job_id).state == "ready"
    info = ex.configure_group("paused", limit=None)
    assert info.limit is None
    assert held.result(timeout=30) == "held"


def test_priorities_run_highest_first_within_a_group(db):
    ex = db.executor(max_workers=1)
    gate = time.time() + GATE
    priorities = [3, -1, 7, 0, 7, 2, 9, -5, 4, 1, 5, 6, 8, 0, 2]
    futs = [ex.options(priority=p, run_after=gate).submit(jobs.identity, i) for i, p in enumerate(priorities)]
    wait(futs, timeout=60)
    order = [r.priority for r in _starts(db)]
    assert order == sorted(priorities, reverse=True)
    # Same priority: oldest first.
    sevens = [r.id for r in _starts(db) if r.priority == 7]
    assert sevens == sorted(sevens)


def test_delay_and_run_after_hold_a_job_back(db):
    # A long poll interval: the executor must wake for its own delayed job by itself.
    ex = db.executor(max_workers=2, poll_interval=5.0)
    list(ex.map(jobs.sleep, [0.2, 0.2]))  # both children started
    t0 = time.time()
    late = ex.options(delay=0.8).submit(jobs.timed, 0, "late")
    at = ex.options(run_after=t0 + 0.4).submit(jobs.timed, 0, "at")
    now = ex.submit(jobs.timed, 0, "now")
    start_now, _, _ = now.result(timeout=30)
    start_at, _, _ = at.result(timeout=30)
    start_late, _, _ = late.result(timeout=30)
    assert start_now < t0 + 0.4
    assert t0 + 0.4 <= start_at < t0 + 0.4 + 1.0
    assert t0 + 0.8 <= start_late < t0 + 0.8 + 1.0
    row = db.row(late.job_id)
    assert row.run_after is not None and row.started_at >= row.run_after


def test_in_process_submit_wakes_an_idle_executor_at_once(db):
    ex = db.executor(max_workers=1, poll_interval=10.0)
    assert ex.submit(jobs.identity, 0).result(timeout=30) == 0  # child started
    time.sleep(0.3)
    t0 = time.time()
    start, _, _ = ex.submit(jobs.timed, 0).result(timeout=5)
    assert start - t0 < 1.0


def test_other_executors_wake_on_notify_or_poll(db, tmp_path):
    """B submits while its only child is busy; A runs the job and B's future follows.

    On PostgreSQL both poll only every 10 s, so only NOTIFY can make this quick;
    elsewhere polling (0.3 s here) is the mechanism.
    """
    poll = 10.0 if db.kind == "postgresql" else 0.3
    b = db.executor(max_workers=1, poll_interval=poll)
    gate = tmp_path / "busy-may-end"
    busy = b.submit(jobs.wait_for_file, str(gate), "busy")  # busy until the test has seen what it needs
    try:
        while db.row(busy.job_id).state not in ("leased", "running"):
            time.sleep(0.02)
        a = db.executor(max_workers=1, poll_interval=poll)
        assert a.submit(jobs.identity, 0).result(timeout=30) == 0  # run by A: B has no free slot
        time.sleep(0.3)
        t0 = time.time()
        fut = b.submit(jobs.timed, 0, "elsewhere")
        start, end, value = fut.result(timeout=8)
        resolved = time.time()
        assert value == "elsewhere"
        assert start - t0 < 2.0, start - t0  # A woke up for it
        assert resolved - end < 1.5, resolved - end  # and B's future followed the row
        assert not busy.done()
    finally:
        gate.touch()
    assert busy.result(timeout=30) == "busy"


def test_an_idle_executor_costs_one_cheap_read_per_poll(db):
    ex = db.executor(max_workers=1, poll_interval=0.2)
    ex.submit(jobs.identity, 0).result(timeout=30)
    statements: list[str] = []

    @event.listens_for(ex._store.engine, "before_cursor_execute")
    def count(conn, cursor, statement, *args):  # noqa: ANN001
        if not statement.lstrip().upper().startswith(("BEGIN", "SAVEPOINT", "RELEASE")):
            statements.append(statement)

    time.sleep(1.0)
    event.remove(ex._store.engine, "before_cursor_execute", count)
    writes = [s for s in statements if s.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE"))]
    # Five polls in a second, plus a lease reclaim check at most.
    assert len(statements) <= 5 + 3, statements
    assert not writes, writes
