"""Jobs start while the transaction that leased them commits, and a failed commit takes them back.

A tick's transaction hands the jobs it claimed to idle children after its
last statement and before its ``COMMIT`` (``Store.finish_and_claim``'s
``before_commit``): the children start while the commit is flushed to disk.
If the commit then fails, the leases never existed (the rows went back, or
were never inserted) and the next claim may hand out the same token again:
the children running those attempts are killed and nothing they report is
recorded. Only jobs whose arguments need no read go early, to idle
children only, each as many as it may hold. A job that opens a transaction (``dbexecutor.transaction()``)
begins it only once the parent says the lease committed: its child asks
(``AwaitCommit``), holding no lock, and the parent answers (``Committed``)
once the commit is done; before that, its fenced completion would find the
lease lost. A job that opens none is told nothing.

The commits of the claiming transactions are found by wrapping that hook,
and delayed or failed with a SQLAlchemy ``commit`` event.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

import jobs
import txn_jobs
from dbexecutor.messages import Committed
from dbexecutor.records import Report
from dbexecutor.store import Store
from dbexecutor.supervisor import Supervisor
from polling import until
from seams import pin_pace, scheduler_of
from test_job_transactions import _values, items  # noqa: F401 - items is a fixture

T = 60


class ClaimingCommits:
    """Delays or fails the commits of the transactions that claimed jobs of one function, once armed."""

    def __init__(self) -> None:
        self.function = ""
        self.delay = 0.0
        self.fail = 0
        self.entered: list[float] = []  # wall clock at each matching commit
        self._next: threading.local = threading.local()

    def claimed(self, names: list[str]) -> None:
        """Called by the wrapped hook: the next commit in this thread is a claiming one."""
        self._next.match = any(n.endswith(self.function) for n in names) if self.function else False

    def on_commit(self, conn: Any) -> None:
        if not getattr(self._next, "match", False):
            return
        self._next.match = False
        self.entered.append(time.time())
        if self.fail > 0:
            self.fail -= 1
            # As a commit the server refused: the transaction is over, and nothing of it stays.
            conn.connection.dbapi_connection.rollback()
            raise OperationalError("COMMIT", None, Exception("injected commit failure"))
        if self.delay:
            time.sleep(self.delay)


@pytest.fixture
def commits(monkeypatch: Any) -> Iterator[ClaimingCommits]:
    hooks = ClaimingCommits()

    def wrapped(real: Any) -> Any:
        def method(self: Store, *args: Any, before_commit: Any = None, **kwargs: Any) -> Any:
            def hook(claimed: Any, done: Any, again: bool) -> Any:
                late = before_commit(claimed, done, again)
                hooks.claimed([c.fn_name for c in claimed])
                return late

            return real(self, *args, before_commit=hook if before_commit is not None else None, **kwargs)

        return method

    # A tick that writes rows or results claims with them; an idle tick that looks claims alone.
    monkeypatch.setattr(Store, "finish_and_claim", wrapped(Store.finish_and_claim))
    monkeypatch.setattr(Store, "look", wrapped(Store.look))
    event.listen(Engine, "commit", hooks.on_commit)
    try:
        yield hooks
    finally:
        event.remove(Engine, "commit", hooks.on_commit)


def _lines(path: str) -> list[str]:
    return open(path).read().split() if os.path.exists(path) else []


def _check_runs(path: str, attempts: list[Any]) -> None:
    """The run handed out before the failed commit was killed before its end; the next one ran through and was recorded.

    Rolled back, the next claim hands out the same attempt number (and, on
    SQLite, the same id): had the first run lived, its result would have
    passed the fence in the second run's place.
    """
    time.sleep(1.5)  # longer than a run: a first run left alive would have ended by now
    lines = _lines(path)
    ends = [line for line in lines if line.startswith("end:")]
    assert len(ends) == 1, lines
    pid = ends[0].split(":")[1]
    # The early run may have been killed before it wrote anything (a loaded machine): then one start.
    assert lines in (["start:" + pid, ends[0]], [lines[0], "start:" + pid, ends[0]]), lines
    [attempt] = attempts
    assert (attempt.attempt, attempt.outcome) == (1, "ok")
    assert attempt.worker.endswith(":" + pid)


@pytest.mark.timeout(T)
def test_a_claimed_job_starts_before_its_lease_commits(db, commits):
    ex = db.executor(2)
    ex.submit(jobs.identity, 0).result(timeout=T)  # children started and idle
    commits.function, commits.delay = "timed", 0.6
    start, _, value = ex.submit(jobs.timed, 0.0, "x").result(timeout=T)
    assert value == "x"
    assert commits.entered, "no claiming transaction of the job was seen"
    # Dispatched after the commit, it would have started 0.6 s after the commit began.
    assert start < commits.entered[0] + 0.3, (start - commits.entered[0])


@pytest.mark.timeout(T)
def test_a_job_whose_lease_did_not_commit_is_killed_and_runs_again(db, commits, tmp_path, caplog):
    path = str(tmp_path / "runs")
    ex = db.executor(2)
    ex.submit(jobs.identity, 0).result(timeout=T)
    commits.function, commits.fail = "record_start_end", 1
    fut = ex.submit(jobs.record_start_end, path, "v", 1.0)
    assert fut.result(timeout=T) == "v"
    assert commits.fail == 0, "the claiming commit was never failed"
    _check_runs(path, db.attempts(fut.job_id))
    assert db.row(fut.job_id).state == "done"
    assert "before its lease committed" in caplog.text
    assert len(db.jobs()) == 2, [(r.id, r.state, r.attempt, r.fn_name) for r in db.jobs()]  # the rolled-back insert left no row


@pytest.mark.timeout(T)
def test_a_released_dependent_whose_claim_did_not_commit_is_killed_and_runs_again(db, commits, tmp_path):
    path = str(tmp_path / "runs")
    ex = db.executor(2)
    ex.submit(jobs.identity, 0).result(timeout=T)
    commits.function, commits.fail = "record_start_end", 1
    up = ex.submit(jobs.identity, 7)
    dep = ex.submit(jobs.record_start_end, path, up, 1.0)  # released and claimed by the finish of `up`
    assert dep.result(timeout=T) == 7
    assert commits.fail == 0, "the claiming commit was never failed"
    assert [a.outcome for a in db.attempts(up.job_id)] == ["ok"]
    _check_runs(path, db.attempts(dep.job_id))


@pytest.mark.timeout(T)
def test_jobs_queued_early_on_a_child_whose_lease_did_not_commit_are_not_given_back(db, commits, tmp_path, monkeypatch):
    # While jobs are short each idle child takes several before the COMMIT;
    # when it fails, the child running the first is killed and the others it
    # held were never leased. Giving them back (as a dead child's queued jobs
    # are) would be a transaction each for nothing, and on SQLite, which
    # hands out the same ids and attempts again, could release the leases
    # the transaction's next try takes.
    ex = db.executor(2)
    assert list(ex.map(jobs.identity, range(50))) == list(range(50))  # short jobs seen: deep prefetch
    assert scheduler_of(ex).pace.depth() >= 2
    early: list[int] = []
    real_early = Supervisor.dispatch_early
    monkeypatch.setattr(Supervisor, "dispatch_early", lambda self, js: (early.append(len(js)), real_early(self, js))[1])
    released: list[tuple[int, int]] = []
    real_release = Store.release
    monkeypatch.setattr(Store, "release", lambda self, j, a: (released.append((j, a)), real_release(self, j, a))[1])
    commits.function, commits.fail = "record_start_end", 1
    paths = [str(tmp_path / f"runs{i}") for i in range(4)]
    with scheduler_of(ex).hold_writes():  # the four go in together, and are leased together
        futs = [ex.submit(jobs.record_start_end, path, i, 0.5) for i, path in enumerate(paths)]
    assert [f.result(timeout=T) for f in futs] == [0, 1, 2, 3]
    assert commits.fail == 0, "the claiming commit was never failed"
    assert early and early[0] == 4, early  # two for each idle child
    assert released == []
    for f, path in zip(futs, paths):
        lines = _lines(path)
        ends = [line for line in lines if line.startswith("end:")]
        assert len(ends) == 1, lines  # a run handed out before the failed commit never ended
        [attempt] = db.attempts(f.job_id)
        assert (attempt.attempt, attempt.outcome) == (1, "ok")
        assert db.row(f.job_id).state == "done"


@pytest.mark.timeout(T)
def test_a_job_transaction_completes_only_once_its_early_lease_committed(db, commits, items, caplog):
    ex = db.executor(2)
    ex.submit(jobs.identity, 0).result(timeout=T)
    # The job writes and returns well within the 0.5 s its lease takes to commit.
    commits.function, commits.delay = "insert", 0.5
    futs = [ex.submit(txn_jobs.insert, items, i) for i in range(3)]
    assert [f.result(timeout=T) for f in futs] == [0, 1, 2]
    assert commits.entered, "no claiming transaction of the jobs was seen"
    assert _values(db, items) == ["0", "1", "2"]  # committed with their completions, none rolled back as lost
    assert not [r for r in caplog.records if "lost its lease" in r.getMessage()]
    for f in futs:
        assert [a.outcome for a in db.attempts(f.job_id)] == ["ok"]


@pytest.fixture
def told(monkeypatch: Any) -> list[tuple[int, int]]:
    """The leases the parent (this process) said committed to a child, in order (``Committed`` messages sent)."""
    sent: list[tuple[int, int]] = []
    real = Connection.send

    def send(self: Connection, obj: Any) -> None:
        if isinstance(obj, Committed):
            sent.append((obj.job_id, obj.attempt))
        real(self, obj)

    monkeypatch.setattr(Connection, "send", send)
    return sent


@pytest.mark.timeout(T)
def test_only_a_job_that_opened_a_transaction_is_told_its_early_lease_committed(db, commits, items, told):
    ex = db.executor(2)
    ex.submit(jobs.identity, 0).result(timeout=T)
    # A job with no transaction, started early: its child waits for nothing, and is told nothing.
    commits.function, commits.delay = "timed", 0.6
    start, _, _ = ex.submit(jobs.timed, 0.0).result(timeout=T)
    assert commits.entered and start < commits.entered[-1] + 0.3, "the job did not start before its lease committed"
    time.sleep(0.2)
    assert told == []
    # Asked before the commit (the job opens its transaction at once; its lease takes 0.5 s): answered once it is done.
    commits.function, commits.delay, commits.entered[:] = "insert", 0.5, []
    before = ex.submit(txn_jobs.insert, items, "before")
    assert before.result(timeout=T) == "before"
    assert commits.entered, "no claiming transaction of the job was seen"
    # Asked after the commit (the job sleeps past it before opening its transaction): answered at once.
    commits.function, commits.delay = "", 0.0
    after = ex.submit(txn_jobs.sleep_then_insert, items, "after", 0.5)
    assert after.result(timeout=T) == "after"
    assert told == [(before.job_id, 1), (after.job_id, 1)]
    assert _values(db, items) == ["after", "before"]
    for f in (before, after):
        assert [a.outcome for a in db.attempts(f.job_id)] == ["ok"]


@pytest.fixture
def idle_claims(monkeypatch: Any) -> list[str]:
    """The functions of the jobs an idle tick's look claimed (``Store.look``, not with a finish or a submit)."""
    got: list[str] = []
    real = Store.look

    def look(self: Store, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        got.extend(c.fn_name for c in out[0])
        return out

    monkeypatch.setattr(Store, "look", look)
    return got


@pytest.mark.timeout(T)
def test_work_from_another_process_starts_before_its_lease_commits(db, idle_claims, commits, tmp_path):
    runner = db.executor(2)
    runner.submit(jobs.identity, 0).result(timeout=T)
    submitter = db.executor(1, run_jobs=False)
    commits.function, commits.delay = "timed", 0.6
    start, _, value = submitter.submit(jobs.timed, 0.0, "x").result(timeout=T)
    assert value == "x"
    until(lambda: len(idle_claims) >= 1)  # the submitter may hear of the look's commit before the look has returned
    assert idle_claims == ["jobs.timed"], idle_claims  # the runner's look claimed it, not a tick of its own writes
    assert start < commits.entered[0] + 0.3, (start - commits.entered[0])
    # And a look whose commit fails takes its early run back, as a finish's does.
    path = str(tmp_path / "runs")
    commits.function, commits.delay, commits.fail = "record_start_end", 0.0, 1
    time.sleep(0.3)  # the runner idle again: its next claim is a look's
    fut = submitter.submit(jobs.record_start_end, path, "v", 1.0)
    assert fut.result(timeout=T) == "v"
    assert commits.fail == 0, "the claiming commit was never failed"
    until(lambda: len(idle_claims) >= 2)
    assert idle_claims == ["jobs.timed", "jobs.record_start_end"]  # the failed look raised; the next one claimed it
    _check_runs(path, db.attempts(fut.job_id))


@pytest.mark.timeout(T)
def test_what_was_reported_or_given_back_for_a_void_lease_is_dropped(db):
    # A wait for one round's early jobs reads the reports of an earlier
    # round's (several jobs a child); a child that died gave its queue back.
    # If the COMMIT then fails, those leases never existed: nothing of them
    # may reach the next tick, whose statements SQLite's next try could
    # match (the same ids and attempts again).
    ex = db.executor(2, poll_interval=30.0)
    assert ex.submit(jobs.identity, 0).result(timeout=T) == 0
    sup = scheduler_of(ex)._supervisor  # an idle loop: it takes nothing before the poll
    void, kept = (10_001, 1), (10_002, 1)
    for lease in (void, kept):
        sup._report(Report(*lease, True, b"", "ok"))
        sup._releases.append(lease)
    sup.void({void})
    assert [(r.job_id, r.attempt) for r in sup.take_reports()] == [kept]
    assert sup.take_releases() == [kept]


# -- a transaction that waits for the jobs it started, and records them ------------------------------


def _hold(ex: Any) -> None:
    """Warm ``ex`` up (short jobs seen) and let its transactions wait up to 30 s for the jobs they start early."""
    for i in range(5):
        assert ex.submit(jobs.identity, i).result(timeout=T) == i
    pin_pace(ex, tick_cost=30.0, hold_max=30.0)


@pytest.mark.timeout(T)
def test_a_job_recorded_before_a_commit_that_failed_runs_again_and_is_recorded_once(db, commits, tmp_path):
    # The job ends while the transaction that leased it waits, is recorded
    # in it, and that COMMIT fails: the lease and the record go together,
    # and the job runs again (its first run was not killed: it had ended).
    path = str(tmp_path / "runs")
    ex = db.executor(2)
    _hold(ex)
    commits.function, commits.fail = "record_start_end", 1
    fut = ex.submit(jobs.record_start_end, path, "v", 0.0)
    assert fut.result(timeout=T) == "v"
    assert commits.fail == 0, "the claiming commit was never failed"
    lines = _lines(path)
    assert [line.split(":")[0] for line in lines] == ["start", "end", "start", "end"], lines
    [attempt] = db.attempts(fut.job_id)
    assert (attempt.attempt, attempt.outcome) == (1, "ok")
    assert attempt.worker.endswith(":" + lines[-1].split(":")[1])
    assert db.row(fut.job_id).state == "done"
    assert len(db.jobs()) == 6  # the warm-up's five and this one: the rolled-back insert left no row


@pytest.mark.timeout(T)
def test_a_job_that_opens_a_transaction_does_not_wait_for_the_hold_of_the_commit_it_needs(db, items):
    # Its child asks whether the lease committed (AwaitCommit) before the job
    # begins its transaction: the parent stops waiting for the job and commits.
    ex = db.executor(2)
    _hold(ex)
    start = time.monotonic()
    futs = [ex.submit(txn_jobs.insert, items, i) for i in range(3)]
    assert [f.result(timeout=T) for f in futs] == [0, 1, 2]
    assert time.monotonic() - start < 10.0  # not the 30 s a transaction may wait
    assert _values(db, items) == ["0", "1", "2"]
    for f in futs:
        assert [a.outcome for a in db.attempts(f.job_id)] == ["ok"]
