"""Two executors in two OS processes share one database's work, without running a job twice."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

from sqlalchemy import select

import jobs

N = 3000  # "a few thousand" jobs, submitted one by one
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _read(f) -> str:
    f.flush()
    f.seek(0)
    return f.read()


def test_two_processes_share_the_work(db, tmp_path):
    path = str(tmp_path / "record.txt")
    errlog = open(tmp_path / "worker.stderr", "w+")  # a file: a full pipe would block B
    # Process B first: it waits for the jobs A is about to submit.
    worker = subprocess.Popen(
        [sys.executable, os.path.join(TESTS_DIR, "share_worker.py"), db.url, db.prefix, "2", str(N), "100"],
        stdout=subprocess.PIPE,
        stderr=errlog,
        text=True,
    )
    try:
        # Wait until B's executor is up (it creates the tables too, concurrently with A).
        line = worker.stdout.readline()
        assert line.startswith("STARTED"), line + _read(errlog)
        worker_pid = int(line.split()[1])

        ex = db.executor(2)
        start = time.monotonic()
        futs = [ex.submit(jobs.record_ppid, path, i) for i in range(N)]
        results = [f.result(timeout=90) for f in futs]
        elapsed = time.monotonic() - start
        out, _ = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        err = _read(errlog)
        errlog.close()
    assert worker.returncode == 0, out + err
    assert "DONE" in out

    # Every result is right.
    assert [r[0] for r in results] == list(range(N))

    # Each job ran exactly once.
    with open(path) as f:
        lines = f.read().split()
    counts = collections.Counter(lines)
    assert len(lines) == N, f"{len(lines)} runs recorded for {N} jobs"
    assert set(counts) == {str(i) for i in range(N)}
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1][:20]

    store = db.store()
    try:
        j, a = store.tables.jobs, store.tables.attempts
        with store.engine.connect() as conn:
            states = conn.execute(select(j.c.state)).scalars().all()
            attempts = conn.execute(select(a.c.job_id, a.c.outcome, a.c.worker)).all()
    finally:
        store.close()
    assert len(states) == N and set(states) == {"done"}
    assert len(attempts) == N, f"{len(attempts)} attempts for {N} jobs"
    assert len({r.job_id for r in attempts}) == N
    assert {r.outcome for r in attempts} == {"ok"}

    # The work was really shared.
    child_pids = {int(r.worker.rsplit(":", 1)[1]) for r in attempts}
    assert len(child_pids) >= 3, child_pids
    assert child_pids == {r[2] for r in results}
    # A child's parent is its executor process (spawn) or that process's
    # forkserver: either way one per executor process.
    parents = collections.Counter(r[1] for r in results)
    assert len(parents) >= 2, f"only one executor process ran jobs: {parents}"
    assert os.getpid() not in child_pids and worker_pid not in child_pids
    print(f"{db.kind}: {N} jobs in {elapsed:.1f} s, per parent {dict(parents)}")
