"""Standalone workers (``dbexecutor worker``) run what a submit-only process submits; SIGTERM gives jobs back."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

import psutil
import pytest
from sqlalchemy import select, update

import jobs
from clitools import cli_env, read, running_on_worker, start_worker, stop, wait_for_log

T = 60
N = 150


def test_workers_share_jobs_submitted_elsewhere(db, tmp_path):
    path = str(tmp_path / "record.txt")
    logs = [str(tmp_path / f"worker{i}.log") for i in range(2)]
    workers = [start_worker(db, log, "--max-workers", "2", "--grace", "10") for log in logs]
    try:
        for proc, log in zip(workers, logs):
            wait_for_log(log, "serving", proc)
        # This process only submits: its executor never claims a job.
        ex = db.executor(2, run_jobs=False)
        ex.configure_group("api", limit=1)  # one at a time across both workers
        api = [ex.options(group="api").submit(jobs.sleep, 0.1, i) for i in range(6)]
        futs = [ex.submit(jobs.record_ppid, path, i) for i in range(N)]
        total = ex.submit(jobs.sum_list, [ex.submit(jobs.square, i) for i in range(5)])
        results = [f.result(timeout=T) for f in futs]
        assert [f.result(timeout=T) for f in api] == list(range(6))
        assert total.result(timeout=T) == sum(i * i for i in range(5))
        codes = [stop(p) for p in workers]
    finally:
        for p in workers:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0], [read(log)[-2000:] for log in logs]

    # Every job done, each exactly once, and nothing ran in this process or its children.
    assert [r[0] for r in results] == list(range(N))
    rows = db.jobs()
    assert {r.state for r in rows} == {"done"} and len(rows) == N + 6 + 6
    spans = sorted((r.started_at, r.finished_at) for r in rows if r.group_key == "api")
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), spans  # never two at once
    attempts = db.attempts()
    per_job = collections.Counter(a.job_id for a in attempts)
    assert set(per_job) == {r.id for r in rows} and max(per_job.values()) == 1
    assert {a.outcome for a in attempts} == {"ok"}
    with open(path) as f:
        assert sorted(int(x) for x in f.read().split()) == list(range(N))
    parents = collections.Counter(r[1] for r in results)
    children = {r[2] for r in results}
    me = psutil.Process()
    assert os.getpid() not in parents and not children & {c.pid for c in me.children(recursive=True)}
    # Both workers took part (a worker's children share its forkserver as parent).
    assert len(parents) >= 2, parents
    # The log names jobs and attempts.
    assert any("attempt" in read(log) and "job " in read(log) for log in logs)


def test_sigterm_gives_a_running_job_back(db, tmp_path):
    marker, pid_path = str(tmp_path / "marker"), str(tmp_path / "pid")
    log_a, log_b = str(tmp_path / "a.log"), str(tmp_path / "b.log")
    a = start_worker(db, log_a, "--max-workers", "1", "--grace", "0.5")
    b = None
    try:
        wait_for_log(log_a, "serving", a)
        ex = db.executor(1, run_jobs=False)
        fut = ex.submit(jobs.fault_frozen_first, marker, pid_path, 60)
        end = time.monotonic() + T
        while not os.path.exists(pid_path):
            assert time.monotonic() < end and a.poll() is None, read(log_a)
            time.sleep(0.05)
        child_pid = int(read(pid_path))
        started = time.monotonic()
        assert stop(a) == 0, read(log_a)
        assert time.monotonic() - started < 15
        assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE
        row = db.row(fut.job_id)
        assert (row.state, row.attempt, row.lease_owner) == ("ready", 1, None)
        assert [x.outcome for x in db.attempts(fut.job_id)] == ["released"]
        assert "released 1 job(s)" in read(log_a)

        b = start_worker(db, log_b, "--max-workers", "1")
        assert fut.result(timeout=T) == "second"
        assert stop(b) == 0
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
    assert [(x.attempt, x.outcome) for x in db.attempts(fut.job_id)] == [(1, "released"), (2, "ok")]
    assert db.row(fut.job_id).state == "done"


def test_sigterm_waits_for_running_jobs_within_grace(db, tmp_path):
    log = str(tmp_path / "w.log")
    w = start_worker(db, log, "--max-workers", "1", "--grace", "30")
    try:
        fut = running_on_worker(db, log, w, jobs.sleep, 1.5, "finished", states=("leased", "running"))
        assert stop(w) == 0, read(log)
    finally:
        if w.poll() is None:
            w.kill()
    # The job finished in the grace period: done once, never released.
    assert fut.result(timeout=5) == "finished"
    assert [x.outcome for x in db.attempts(fut.job_id)] == ["ok"]


def test_a_second_sigterm_cuts_the_grace_period_short(db, tmp_path):
    """SIGTERM twice: the worker stops at once, its running job put back, without waiting out a 60 s grace.

    Both signals are seen by the worker's main loop (the handler only records
    them: see worker.run_worker), and both show in the log.
    """
    log = str(tmp_path / "w.log")
    w = start_worker(db, log, "--max-workers", "1", "--grace", "60")
    try:
        fut = running_on_worker(db, log, w, jobs.sleep, 60, "never")
        started = time.monotonic()
        w.terminate()
        wait_for_log(log, "running jobs get 60 s", w)
        w.terminate()
        assert w.wait(30) == 0, read(log)
        assert time.monotonic() - started < 30
    finally:
        if w.poll() is None:
            w.kill()
    text = read(log)
    assert "received SIGTERM again" in text and "grace period over" in text, text
    row = db.row(fut.job_id)
    assert (row.state, row.lease_owner) == ("ready", None)


def test_a_lost_lease_is_not_released(db, tmp_path):
    """release_running is guarded by the attempt token: a job reclaimed meanwhile stays as it is."""
    store = db.store()
    try:
        ex = db.executor(1, run_jobs=False)
        # Read before the transaction below: job_id may have to store the row
        # first, which on SQLite would wait for that transaction's write lock.
        job_id = ex.submit(jobs.add, 1, 2).job_id
        j = store.tables.jobs
        with store.engine.begin() as conn:  # as if claimed twice: attempt 2 holds it now
            conn.execute(update(j).where(j.c.id == job_id).values(state="running", attempt=2, lease_expires=time.time() + 60))
        assert store.release_running([(job_id, 1, None)], "w:1", time.time(), "test") == []
        with store.engine.connect() as conn:
            assert conn.execute(select(j.c.state, j.c.attempt).where(j.c.id == job_id)).one() == ("running", 2)
        assert store.release_running([(job_id, 2, None)], "w:1", time.time(), "test") == [job_id]
        assert db.row(job_id).state == "ready"
    finally:
        store.close()


def test_a_worker_starts_its_children_before_any_job(db, tmp_path):
    """A worker exists to run jobs: its children start with it, while it connects and claims, not at the first job."""
    log = str(tmp_path / "worker.log")
    proc = start_worker(db, log, "--max-workers", "2", "--grace", "5")
    try:
        wait_for_log(log, "serving", proc)
        end = time.monotonic() + 30
        while read(log).count("started child") < 2:
            assert time.monotonic() < end, read(log)[-3000:]
            time.sleep(0.02)
        pids = [int(line.rsplit(" ", 1)[1]) for line in read(log).splitlines() if "started child" in line]
        assert len(pids) == 2 and all(psutil.pid_exists(pid) for pid in pids), pids
        assert db.jobs() == []  # nothing was submitted: the children wait for their first jobs
        ex = db.executor(1, run_jobs=False)
        assert ex.submit(jobs.add, 2, 3).result(timeout=T) == 5
        assert read(log).count("started child") == 2  # the job ran in one of them
        assert stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("entry", ["dbexecutor.__main__:main", "dbexecutor.cli:main_exit"])
def test_children_of_a_worker_started_by_its_console_script_have_no_database_code(db, tmp_path, entry):
    # The installed `dbexecutor` command is a script whose top level imports its
    # entry point (dbexecutor.cli:main_exit in scripts installed by earlier
    # builds: the command line, and SQLAlchemy with it). The fork server must
    # not preload that __main__: its children would inherit the database
    # stack, and the first child would wait for it to import.
    module, function = entry.split(":")
    script = tmp_path / "dbexecutor_command.py"
    script.write_text(f"import sys\nfrom {module} import {function}\nif __name__ == '__main__':\n    sys.exit({function}())\n")
    log = str(tmp_path / "worker.log")
    db.store().close()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(script), "worker", db.url, "--prefix", db.prefix, "--max-workers", "1",
             "--poll-interval", "0.05", "--grace", "5"],
            stdout=out, stderr=subprocess.STDOUT, env=cli_env(),
        )
    try:
        wait_for_log(log, "serving", proc)
        ex = db.executor(1, run_jobs=False)
        sqlalchemy_here, modules = ex.submit(jobs.modules_seen).result(timeout=60)
        assert not sqlalchemy_here, modules
        assert "dbexecutor.cli" not in modules
    finally:
        assert stop(proc) == 0, read(log)[-3000:]


def test_the_worker_command_starts_its_fork_server_before_the_database_stack_is_imported(tmp_path):
    # The fork server imports the children's code while the command line imports
    # SQLAlchemy and the driver, on another core, instead of after them.
    code = (
        "import sys\n"
        "from dbexecutor import pool\n"
        "real = pool.warm_up\n"
        "def spy(ctx):\n"
        "    print('warm_up', 'sqlalchemy' in sys.modules, ctx.get_start_method(), flush=True)\n"
        "    real(ctx)\n"
        "pool.warm_up = spy\n"
        "sys.argv = ['dbexecutor', *sys.argv[1:]]\n"
        "from dbexecutor.__main__ import main\n"
        "main()\n"
    )
    worker = subprocess.run([sys.executable, "-c", code, "worker", "--help"], capture_output=True, text=True,
                            env=cli_env(), timeout=60)
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.splitlines()[0] == "warm_up False forkserver", worker.stdout[:500]
    status = subprocess.run([sys.executable, "-c", code, "status", "--help"], capture_output=True, text=True,
                            env=cli_env(), timeout=60)
    assert status.returncode == 0 and "warm_up" not in status.stdout, "only a worker has children"
