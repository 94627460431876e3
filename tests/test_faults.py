"""Fault injection: killed executors and children, timeouts, frozen children, server restarts.

Most tests run a workload in a separate process (``fault_driver.py``) so that
it can be SIGKILLed, then check the rows: every job ends exactly once with the
right result, and nothing a dead process started stays alive.

Leases here are short (2 s) so that reclaims happen within the tests' time;
tests that need no reclaim use a 10 s lease, so a slow child start on a busy
machine cannot cause a spurious one.
The server-restart test restarts the shared PostgreSQL / MariaDB server: it
runs under ``CI=true`` or with ``DBEXECUTOR_TEST_RESTART_SERVERS=1`` only.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import gc
import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import psutil
import pytest
from sqlalchemy import func, select

import fault_driver
import jobs
from clitools import cli_env
from dbexecutor import DBExecutor, JobTimeoutError, WorkerDied
from dbexecutor import serialization

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_driver.py")
FAULT = {"lease_ttl": 2.0, "heartbeat_interval": 0.3, "poll_interval": 0.05, "retry_delay": 0.1}
# For tests that need no reclaim: a fresh child takes about a second from claim
# to its first heartbeat on a loaded 2-core machine, too close to a 2 s lease.
LONG_LEASE = {"lease_ttl": 10.0, "heartbeat_interval": 1.0}
T = 60  # seconds to wait for any one result
ORPHAN_GRACE = 10.0  # seconds the orphans of a killed process get to exit by themselves


# -- helpers --------------------------------------------------------------------


def _executor(db, max_workers: int = 2, **options: Any) -> DBExecutor:
    return db.executor(max_workers, **{**FAULT, **options})


def _driver_options(db, max_workers: int = 2, **options: Any) -> dict[str, Any]:
    return {**db.options, **FAULT, "max_workers": max_workers, **options}


def _warm_up(ex: DBExecutor, children: int) -> None:
    """Start ``children`` children now, so later jobs do not wait for a child to start under a short lease."""
    assert [f.result(timeout=T) for f in [ex.submit(jobs.sleep, 0.3, i) for i in range(children)]] == list(
        range(children)
    )


def _start_driver(tmp_path, name: str, *args: Any) -> tuple[subprocess.Popen, str]:
    log = str(tmp_path / f"{name}.log")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, DRIVER, *[str(a) for a in args]], stdout=out, stderr=subprocess.STDOUT, cwd=str(tmp_path),
            env=cli_env(),  # the worktree's src importable from another working directory
        )
    return proc, log


def _tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path) as f:
            return f.read()[-chars:]
    except OSError:
        return "(no log)"


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (``is_running`` also notices a reused pid)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_dead(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until none of ``procs`` is alive; return those still alive after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if _alive(p)]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.05)


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {p.status()} {' '.join(p.cmdline())[:120]}")
        except psutil.Error as error:
            out.append(f"{p.pid} ({type(error).__name__})")
    return out


def _read_pids(path: str, timeout: float = 30.0) -> list[int]:
    """The pids a job wrote to ``path`` (written atomically), waiting for the file."""
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise AssertionError(f"the job never wrote {path}")
        time.sleep(0.02)
    with open(path) as f:
        return [int(x) for x in f.read().split()]


def _attempts(db, job_id: int | None = None) -> list[tuple[int, int, str]]:
    """(job_id, attempt, outcome) of the attempt rows, in the order they were written."""
    return [(int(r.job_id), int(r.attempt), r.outcome) for r in db.attempts(job_id)]


def _done_count(store) -> int:
    j = store.tables.jobs
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(j).where(j.c.state == "done")).scalar())


# -- 1. the executor is SIGKILLed mid-run, then resumed ---------------------------------------

DAG_N = 500


@pytest.mark.parametrize("seed,resume", [(1, "attach"), (2, "rerun"), (3, "attach")])
def test_executor_killed_mid_dag_resumes(db, tmp_path, seed, resume):
    store = db.store()  # the tables exist before the driver and the poll below start
    options = _driver_options(db, max_workers=3)
    kill_at = random.Random(seed * 7919).randint(30, 150)
    proc, log = _start_driver(tmp_path, "dag", "dag", db.url, json.dumps(options), seed, DAG_N)
    try:
        end = time.monotonic() + 90
        # attach resumes only the jobs in the table, so the whole DAG must be in
        # it first; the rerun submits it again, so that driver may die mid-submit.
        while resume == "attach" and "submitted" not in _tail(log):
            assert proc.poll() is None, f"the driver exited early ({proc.returncode}):\n{_tail(log)}"
            assert time.monotonic() < end, f"the DAG was not submitted after 90 s:\n{_tail(log)}"
            time.sleep(0.01)
        while _done_count(store) < kill_at:
            assert proc.poll() is None, f"the driver exited early ({proc.returncode}):\n{_tail(log)}"
            assert time.monotonic() < end, f"fewer than {kill_at} jobs done after 90 s:\n{_tail(log)}"
            time.sleep(0.01)
        orphans = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        _kill(proc)
    done_at_kill = _done_count(store)
    store.close()
    assert kill_at <= done_at_kill < DAG_N, "the driver was not killed mid-run; the test proved nothing"
    # The forkserver and every child of the killed executor go away on their own.
    assert len(orphans) >= 2, _describe(orphans)
    left = _wait_dead(orphans, ORPHAN_GRACE)
    assert not left, f"children of the killed executor still alive after {ORPHAN_GRACE} s: {_describe(left)}"

    want = fault_driver.expected_values(seed, DAG_N)
    if resume == "attach":
        ex = DBExecutor.attach(db.url, **{**db.options, **FAULT, "max_workers": 3})
        db.executors.append(ex)
        futs = ex.futures()
        assert 0 < len(futs) <= DAG_N - done_at_kill
        by_id = {r.id: int(r.job_key[1:]) for r in db.jobs()}
        for fut in futs:
            assert fut.result(timeout=T) == want[by_id[fut.job_id]]
    else:
        proc, log = _start_driver(tmp_path, "dag-rerun", "dag", db.url, json.dumps(options), seed, DAG_N)
        try:
            assert proc.wait(120) == 0, _tail(log)
        finally:
            _kill(proc)
        assert "all results right" in _tail(log)

    rows = db.jobs()
    assert sorted(r.job_key for r in rows) == sorted(f"n{i}" for i in range(DAG_N)), "a key was lost or duplicated"
    states = collections.Counter(r.state for r in rows)
    assert states == {"done": DAG_N}, states
    for r in rows:
        assert serialization.loads(r.result) == want[int(r.job_key[1:])], r.job_key
        assert r.lease_owner is None and r.lease_expires is None, r.job_key
    # Every job's final attempt is recorded as "ok", and only the final one.
    attempts = _attempts(db)
    ok = collections.Counter(jid for jid, _, outcome in attempts if outcome == "ok")
    assert all(ok[r.id] == 1 for r in rows), [r.id for r in rows if ok[r.id] != 1]
    final_ok = {(jid, att) for jid, att, outcome in attempts if outcome == "ok"}
    assert all((r.id, r.attempt) in final_ok for r in rows)


# -- 2. a child dies mid-job --------------------------------------------------------------------


def _kill_child_job(ex, tmp_path, how: str) -> tuple[cf.Future, str]:
    if how == "sigkill":
        pid_path = str(tmp_path / "pid")
        fut = ex.submit(jobs.fault_pid_then_sleep, pid_path, 60)
        (pid,) = _read_pids(pid_path)
        os.kill(pid, signal.SIGKILL)
        return fut, "signal 9 (SIGKILL)"
    if how == "exit":
        return ex.submit(jobs.exit_now, 3), "exit code 3"
    return ex.submit(jobs.fault_segfault), "signal 11 (SIGSEGV)"


@pytest.mark.parametrize("how", ["sigkill", "exit", "segfault"])
def test_child_death_fails_the_job_with_worker_died(db, tmp_path, how):
    ex = _executor(db, 2, **LONG_LEASE)
    fut, expected = _kill_child_job(ex, tmp_path, how)
    with pytest.raises(WorkerDied) as info:
        fut.result(timeout=T)
    assert isinstance(info.value, BrokenProcessPool)
    assert expected in str(info.value), str(info.value)
    row = db.row(fut.job_id)
    assert row.state == "failed" and row.lease_owner is None
    assert expected in (row.error or ""), row.error
    assert [(a, o) for _, a, o in _attempts(db, fut.job_id)] == [(1, expected)]
    # One dead child costs one job, never the executor.
    assert ex.submit(jobs.add, 20, 22).result(timeout=T) == 42
    assert [f.result(timeout=T) for f in [ex.submit(jobs.square, i) for i in range(6)]] == [0, 1, 4, 9, 16, 25]


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_child_death_is_retried(db, tmp_path, how):
    ex = _executor(db, 2, **LONG_LEASE)
    marker = str(tmp_path / "died-once")
    fut = ex.options(retries=1).submit(jobs.fault_die_first_time, marker, how, "survived")
    assert fut.result(timeout=T) == "survived"
    assert os.path.exists(marker)
    expected = "signal 9 (SIGKILL)" if how == "kill" else "exit code 3"
    assert [(a, o) for _, a, o in _attempts(db, fut.job_id)] == [(1, expected), (2, "ok")]
    row = db.row(fut.job_id)
    assert (row.state, row.attempt) == ("done", 2)


# -- 3. timeouts ------------------------------------------------------------------------------------


def test_timeout_fails_a_job_that_never_ends(db):
    ex = _executor(db, 2, **LONG_LEASE)
    start = time.monotonic()
    fut = ex.options(timeout=1).submit(jobs.sleep, 10_000)
    with pytest.raises(JobTimeoutError) as info:
        fut.result(timeout=30)
    elapsed = time.monotonic() - start
    assert isinstance(info.value, TimeoutError)
    assert 1.0 <= elapsed < 5.0, elapsed
    assert [(a, o) for _, a, o in _attempts(db, fut.job_id)] == [(1, "timeout")]
    assert db.row(fut.job_id).state == "failed"
    assert ex.submit(jobs.add, 1, 2).result(timeout=T) == 3


def test_timeout_kills_the_whole_process_tree(db, tmp_path):
    ex = _executor(db, 2, **LONG_LEASE)
    pid_path = str(tmp_path / "pids")
    fut = ex.options(timeout=3).submit(jobs.fault_spawn_and_hang, pid_path, 2)
    pids = _read_pids(pid_path)
    assert len(pids) == 3
    procs = [psutil.Process(p) for p in pids]
    assert all(_alive(p) for p in procs), _describe(procs)
    with pytest.raises(JobTimeoutError):
        fut.result(timeout=30)
    left = _wait_dead(procs, 1.0)
    assert not left, f"still alive after the timeout: {_describe(left)}"
    assert [(a, o) for _, a, o in _attempts(db, fut.job_id)] == [(1, "timeout")]


def test_a_timed_out_job_with_a_subprocess_fails_promptly(db, tmp_path):
    # The subprocess is orphaned when its parent dies and nothing may ever
    # reap it: a zombie has ended all the same, and the kill does not wait for it.
    ex = _executor(db, 2, **LONG_LEASE)
    _warm_up(ex, 1)
    pid_path = str(tmp_path / "pids")
    fut = ex.options(timeout=1).submit(jobs.fault_spawn_and_hang, pid_path, 1)
    procs = [psutil.Process(p) for p in _read_pids(pid_path)]
    started = time.monotonic()
    with pytest.raises(JobTimeoutError):
        fut.result(timeout=30)
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, f"failed {elapsed:.1f} s after the job started, with a timeout of 1 s"
    assert not _wait_dead(procs, 1.0), _describe(procs)


def _stubborn(ex: DBExecutor, tmp_path, name: str) -> tuple[cf.Future, list[psutil.Process], str]:
    """A job (timeout 1 s) whose subprocess ignores SIGTERM and notes when it came: its kill waits out the grace."""
    pid_path, term_path = str(tmp_path / f"{name}.pids"), str(tmp_path / f"{name}.term")
    fut = ex.options(timeout=1).submit(jobs.fault_spawn_stubborn, pid_path, term_path)
    return fut, [psutil.Process(p) for p in _read_pids(pid_path)], term_path


def _sigterm_at(term_path: str) -> float:
    with open(term_path) as f:
        (when,) = [float(x) for x in f.read().split()]
    return when


def test_the_loop_goes_on_while_a_timed_out_tree_is_killed(db, tmp_path):
    ex = _executor(db, 2, **LONG_LEASE)
    _warm_up(ex, 2)
    fut, procs, term_path = _stubborn(ex, tmp_path, "stubborn")
    ended: list[float] = []  # when each short job ended, in its child
    while not fut.done():
        ended.append(ex.submit(jobs.timed, 0.01).result(timeout=T)[1])
    failed = time.time()
    with pytest.raises(JobTimeoutError):
        fut.result()
    sigterm = _sigterm_at(term_path)
    # Between SIGTERM and the SIGKILL a grace period later, short jobs kept being
    # dispatched and recorded: the kill ran beside the loop, not in it.
    assert any(sigterm < end < failed for end in ended), (sigterm, failed, ended[-5:])
    assert not _wait_dead(procs, 1.0), _describe(procs)
    assert [(a, o) for _, a, o in _attempts(db, fut.job_id)] == [(1, "timeout")]


def test_two_timed_out_trees_are_killed_together(db, tmp_path):
    ex = _executor(db, 3, **LONG_LEASE)
    _warm_up(ex, 3)
    first, procs_1, term_1 = _stubborn(ex, tmp_path, "first")
    second, procs_2, term_2 = _stubborn(ex, tmp_path, "second")
    for fut in (first, second):
        with pytest.raises(JobTimeoutError):
            fut.result(timeout=30)
    # One after the other, the second SIGTERM would come a whole grace period after the first.
    assert abs(_sigterm_at(term_1) - _sigterm_at(term_2)) < 0.5
    assert not _wait_dead(procs_1 + procs_2, 1.0), _describe(procs_1 + procs_2)
    assert ex.submit(jobs.add, 1, 2).result(timeout=T) == 3


# -- 4. a frozen child loses its lease ---------------------------------------------------------------


@pytest.mark.parametrize("rerun_by", ["same executor", "other executor"])
def test_frozen_child_loses_its_lease_and_its_late_result(db, tmp_path, rerun_by):
    # "other executor": A's only child is frozen, so A has no free slot and B
    # (another executor on the same tables) reclaims and reruns the job; A's
    # future must still resolve from the row while its stale child is frozen.
    ex = _executor(db, 2 if rerun_by == "same executor" else 1)
    _warm_up(ex, 2 if rerun_by == "same executor" else 1)
    marker, pid_path = str(tmp_path / "first-run"), str(tmp_path / "pid")
    fut = ex.submit(jobs.fault_frozen_first, marker, pid_path, 4.0)
    (pid,) = _read_pids(pid_path)
    os.kill(pid, signal.SIGSTOP)  # its heartbeat stops with it
    try:
        stopped = time.monotonic()
        if rerun_by == "other executor":
            _warm_up(_executor(db, 1), 1)  # B, before the lease expires
        # Reclaimed once the lease expires, run again by the other child or executor.
        try:
            value = fut.result(timeout=15)
        except cf.TimeoutError:
            row = db.row(fut.job_id)
            raise AssertionError(
                f"the future did not resolve within 15 s of the child freezing; the row is {row.state!r} "
                f"at attempt {row.attempt}, attempts {_attempts(db, fut.job_id)}"
            ) from None
        assert value == "second"
        assert time.monotonic() - stopped >= 1.0
        row = db.row(fut.job_id)
        assert (row.state, row.attempt) == ("done", 2)
    finally:
        os.kill(pid, signal.SIGCONT)
    # The frozen child wakes up and reports "first" for attempt 1: discarded.
    end = time.monotonic() + 20
    while not any(a == 1 and o.startswith("lease lost") for _, a, o in _attempts(db, fut.job_id)):
        assert time.monotonic() < end, f"the late result was never recorded: {_attempts(db, fut.job_id)}"
        time.sleep(0.1)
    time.sleep(0.5)  # a late heartbeat, if any, has had its chance to touch the row
    row = db.row(fut.job_id)
    assert (row.state, row.attempt) == ("done", 2)
    assert serialization.loads(row.result) == "second"
    assert row.lease_owner is None and row.lease_expires is None
    outcomes = [(a, o) for _, a, o in _attempts(db, fut.job_id)]
    assert (2, "ok") in outcomes and (1, "ok") not in outcomes, outcomes
    assert (1, "lease expired") in outcomes or any(a == 1 and o.startswith("lease lost") for a, o in outcomes)
    assert fut.result() == "second"
    # The woken child is a working member of the pool again.
    assert [f.result(timeout=T) for f in [ex.submit(jobs.square, i) for i in range(4)]] == [0, 1, 4, 9]


# -- 5. the executor dies while a child runs a long job ---------------------------------------------


def test_children_exit_when_the_executor_is_killed(db, tmp_path):
    db.store().close()  # create the tables before the driver
    pid_path = str(tmp_path / "pids")
    proc, log = _start_driver(tmp_path, "sleeper", "sleeper", db.url, json.dumps(_driver_options(db)), pid_path)
    try:
        pids = _read_pids(pid_path, timeout=60)
        assert len(pids) == 2  # the child and the job's own subprocess
        procs = {p.pid: p for p in psutil.Process(proc.pid).children(recursive=True)}
        procs.update({p: psutil.Process(p) for p in pids})
        assert all(_alive(p) for p in procs.values()), _describe(list(procs.values()))
        assert proc.poll() is None, _tail(log)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        _kill(proc)
    left = _wait_dead(list(procs.values()), ORPHAN_GRACE)
    assert not left, f"still alive {ORPHAN_GRACE} s after the executor was killed: {_describe(left)}"
    assert "Traceback" not in _tail(log), _tail(log)  # the orphaned child exits quietly
    (row,) = db.jobs()
    assert row.state in ("leased", "running")  # nobody finalized it: it waits for a reclaim


# -- 6. keyed jobs after a crash -----------------------------------------------------------------------


def test_keyed_jobs_resume_after_a_crash_without_redoing_finished_work(db, tmp_path):
    db.store().close()
    record = str(tmp_path / "record.txt")
    options = json.dumps(_driver_options(db, lease_ttl=4.0, heartbeat_interval=0.5))
    proc, log = _start_driver(tmp_path, "keys", "keys", db.url, options, record, 10)
    try:
        assert proc.wait(90) == 17, _tail(log)
    finally:
        _kill(proc)
    rows = db.jobs()
    finished_before = {r.job_key for r in rows if r.state == "done"}
    assert 10 <= len(finished_before) < fault_driver.KEYS, collections.Counter(r.state for r in rows)

    proc, log = _start_driver(tmp_path, "keys-rerun", "keys", db.url, options, record, 0)
    try:
        assert proc.wait(90) == 0, _tail(log)
    finally:
        _kill(proc)

    keys = [f"k{i}" for i in range(fault_driver.KEYS)]
    rows = db.jobs()
    assert sorted(r.job_key for r in rows) == sorted(keys), "a keyed job was lost or inserted twice"
    assert all(r.state == "done" and serialization.loads(r.result) == r.job_key for r in rows), [
        (r.job_key, r.state) for r in rows
    ]
    with open(record) as f:
        runs = collections.Counter(f.read().split())
    assert set(runs) == set(keys)
    assert all(runs[k] == 1 for k in finished_before), {k: runs[k] for k in finished_before if runs[k] != 1}
    assert max(runs.values()) <= 2, runs


# -- 7. the database server restarts mid-run -------------------------------------------------------------


_PG_CTL = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | head -n1) main"
_MARIADB_START = ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/mariadbd"]
_READY = {
    "postgresql": ["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"],
    "mariadb": ["mysqladmin", "-h", "127.0.0.1", "-P", "3306", "-uroot", "ping", "--silent"],
}


def _server_up(kind: str) -> bool:
    return subprocess.run(_READY[kind], capture_output=True).returncode == 0


def _wait_server_up(kind: str, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while not _server_up(kind):
        if time.monotonic() > end:
            return False
        time.sleep(0.3)
    return True


def _mariadbd_running() -> bool:
    for p in psutil.process_iter(["name"]):
        if p.info["name"] == "mariadbd":
            return True
    return False


def _server_started_at(db) -> float:
    """When the server (re)started, as the server tells it."""
    store = db.store()
    try:
        with store.engine.connect() as conn:
            if db.kind == "postgresql":
                return float(conn.exec_driver_sql("SELECT extract(epoch FROM pg_postmaster_start_time())").scalar())
            uptime = conn.exec_driver_sql("SHOW GLOBAL STATUS LIKE 'Uptime'").one()[1]
            return time.time() - float(uptime)
    finally:
        store.close()


def _restart_server(kind: str) -> None:
    if kind == "postgresql":
        subprocess.run(f"{_PG_CTL} restart", shell=True, check=True, timeout=120)
    else:
        subprocess.run(["mysqladmin", "-h", "127.0.0.1", "-P", "3306", "-uroot", "shutdown"], check=True, timeout=120)
        # start-stop-daemon --oknodo does nothing while the old server is still exiting.
        end = time.monotonic() + 60
        while _mariadbd_running() and time.monotonic() < end:
            time.sleep(0.1)
        subprocess.run(_MARIADB_START, check=True, timeout=60)
    assert _wait_server_up(kind), f"{kind} did not come back after the restart"


def _ensure_server_up(kind: str) -> None:
    """Whatever happened in the test, leave the shared server running."""
    if _server_up(kind) or _wait_server_up(kind, 10.0):
        return
    if kind == "postgresql":
        subprocess.run(f"{_PG_CTL} start", shell=True, timeout=120)
    else:
        subprocess.run(_MARIADB_START, timeout=60)
    _wait_server_up(kind)


@pytest.mark.databases("postgresql", "mariadb")
def test_server_restart_mid_run(db):
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if not (in_ci or os.environ.get("DBEXECUTOR_TEST_RESTART_SERVERS") == "1"):
        pytest.skip("restarts the shared server: runs under CI=true or DBEXECUTOR_TEST_RESTART_SERVERS=1")
    tool = "pg_ctlcluster" if db.kind == "postgresql" else "start-stop-daemon"
    host = db.url.split("@")[-1].split("/")[0]
    path = os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin"]
    if not host.startswith(("127.0.0.1", "localhost")) or not any(os.access(os.path.join(d, tool), os.X_OK) for d in path):
        pytest.skip(f"the {db.kind} server is not a local one this test can restart")
    ex = _executor(db, 2, lease_ttl=5.0, heartbeat_interval=0.5)
    futs = [ex.submit(jobs.sleep, 0.02, i) for i in range(200)]
    end = time.monotonic() + T
    while sum(f.done() for f in futs) < 30:
        assert time.monotonic() < end, "jobs did not start"
        time.sleep(0.01)
    assert sum(f.done() for f in futs) < 200, "every job ended before the restart; the test proved nothing"
    started = _server_started_at(db)
    try:
        _restart_server(db.kind)
    finally:
        _ensure_server_up(db.kind)
    assert _server_started_at(db) > started + 1, "the server was not restarted"
    later = [ex.submit(jobs.square, i) for i in range(10)]  # submit works again once the server is back
    assert [f.result(timeout=90) for f in futs] == list(range(200))
    assert [f.result(timeout=T) for f in later] == [i * i for i in range(10)]
    rows = db.jobs()
    assert len(rows) == 210 and collections.Counter(r.state for r in rows) == {"done": 210}


# -- 8. a stopped executor writes into no file ------------------------------------------------------------


def test_shutdown_executor_writes_into_no_reused_file_descriptor(tmp_path):
    """A second ``shutdown()`` or the executor's garbage collection must not write to reused descriptors.

    The scheduler closes its wake-up pipe when its loop ends; a later wake-up
    must not write into whatever file or socket the process opened since
    (a SQLite file, a PostgreSQL connection) under the same descriptor number.
    """
    ex = DBExecutor(f"sqlite:///{tmp_path / 'jobs.db'}", 1, **FAULT)
    assert ex.submit(jobs.add, 1, 2).result(timeout=T) == 3
    ex.shutdown()
    victims = [open(tmp_path / f"victim{i}", "wb") for i in range(64)]  # take every freed descriptor number
    try:
        ex.shutdown()  # e.g. a ``with`` block after an explicit shutdown, or the test fixture's
        del ex  # weakref.finalize(executor, request_shutdown)
        gc.collect()
    finally:
        for f in victims:
            f.close()
    written = {i: (tmp_path / f"victim{i}").read_bytes() for i in range(64)}
    leaked = {f"victim{i}": data for i, data in written.items() if data}
    assert not leaked, f"the stopped executor wrote into files that reuse its old descriptors: {leaked}"
