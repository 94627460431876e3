"""Jobs go only where they can run: queues, functions of ``__main__``, refusals, and submitting then exiting.

The programs here are real scripts run as subprocesses, so that their job
functions live in their own ``__main__`` as a user's would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import jobs
from clitools import cli, cli_env, start_worker
from dbexecutor import NotRunnable
from dbexecutor.records import NewJob, Report
from dbexecutor.store.sql import Scope

T = 90

# A script with its own job function, like the ones users write. Run as
# ``python NAME.py URL OPTIONS_JSON N``: submits N calls of its function and
# prints the results as JSON.
SCRIPT = """
import json, sys
from dbexecutor import DBExecutor

def {fn}(x):
    return ("{fn}", x * {factor})

if __name__ == "__main__":
    url, options, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    with DBExecutor(url, 2, **options) as ex:
        futures = [ex.submit({fn}, i) for i in range(n)]
        print(json.dumps([f.result(timeout=120) for f in futures]), flush=True)
"""


def _script(tmp_path: Path, name: str, fn: str, factor: int) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(SCRIPT.format(fn=fn, factor=factor))
    return path


def _run(*args: Any, cwd: Path, timeout: float = T) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=cli_env(), cwd=cwd, timeout=timeout)


def test_two_scripts_with_main_functions_share_a_database_and_each_gets_its_own_results(db, tmp_path):
    a = _script(tmp_path, "scriptA", "fa", 2)
    b = _script(tmp_path, "scriptB", "fb", 3)
    opts = json.dumps(db.options)
    procs = [
        subprocess.Popen([sys.executable, str(path), db.url, opts, "15"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=cli_env(), cwd=tmp_path)
        for path in (a, b)
    ]
    outs = [p.communicate(timeout=T) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert json.loads(outs[0][0]) == [["fa", 2 * i] for i in range(15)]
    assert json.loads(outs[1][0]) == [["fb", 3 * i] for i in range(15)]
    by_queue: dict[str, set[str]] = {}
    for row in db.jobs():
        by_queue.setdefault(row.queue, set()).add(row.fn_name)
    assert by_queue == {"scriptA": {"__main__.fa"}, "scriptB": {"__main__.fb"}}
    # Each script's jobs were run by its own executor, never by the other's.
    owners = {a.worker for a in db.attempts()}
    assert len(owners) >= 2


def test_attach_from_another_script_runs_what_a_submit_only_script_left(db, tmp_path):
    submit_only = tmp_path / "enqueue.py"
    submit_only.write_text(textwrap.dedent("""
        import json, sys
        from dbexecutor import DBExecutor

        def shout(word):
            return word.upper() + "!"

        if __name__ == "__main__":
            ex = DBExecutor(sys.argv[1], 1, run_jobs=False, **json.loads(sys.argv[2]))
            futures = [ex.submit(shout, w) for w in ("one", "two", "three")]
            ex.flush()
            print(json.dumps([f.job_id for f in futures]), flush=True)
    """))
    done = _run(submit_only, db.url, json.dumps(db.options), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ids = json.loads(done.stdout)
    assert len(ids) == 3 and {r.state for r in db.jobs()} == {"ready"}
    resume = tmp_path / "resume.py"
    # The jobs are taken by id: ex.futures() lists the jobs unfinished when it
    # reads them, and the attached executor's own workers may have run one by then.
    resume.write_text(textwrap.dedent("""
        import json, sys
        from dbexecutor import DBExecutor

        if __name__ == "__main__":
            ex = DBExecutor.attach(sys.argv[1], max_workers=1, **json.loads(sys.argv[2]))
            print(json.dumps(sorted(ex.future(i).result(timeout=60) for i in json.loads(sys.argv[3]))), flush=True)
            ex.shutdown()
    """))
    got = _run(resume, db.url, json.dumps(db.options), json.dumps(ids), cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    # shout lived in the other script's __main__: it travelled by value.
    assert json.loads(got.stdout) == ["ONE!", "THREE!", "TWO!"]


def test_a_function_defined_in_python_c_runs(db, tmp_path):
    code = textwrap.dedent(f"""
        from dbexecutor import DBExecutor
        def cube(x):
            return x ** 3
        ex = DBExecutor({db.url!r}, 1, **{db.options!r})
        print(ex.submit(cube, 3).result(timeout=60), ex.submit(lambda y: y + 1, 41).result(timeout=60), flush=True)
        ex.shutdown()
    """)
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=tmp_path, timeout=T)
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.split() == ["27", "42"]
    assert {r.queue for r in db.jobs()} == {"default"}  # a program without a name of its own


def test_a_submit_only_process_exits_at_once_and_a_worker_runs_its_jobs_later(db, tmp_path):
    code = textwrap.dedent(f"""
        import time, jobs
        from dbexecutor import DBExecutor
        ex = DBExecutor({db.url!r}, 1, run_jobs=False, queues="work", **{db.options!r})
        start = time.monotonic()
        for i in range(100):
            ex.submit(jobs.square, i)
        print("submitted", flush=True)
    """)
    started = time.monotonic()
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=tmp_path, timeout=T)
    assert got.returncode == 0 and "submitted" in got.stdout, got.stderr[-3000:]
    # No shutdown, no flush: leaving the interpreter wrote the rows and did not wait for the jobs.
    assert time.monotonic() - started < 2 + _python_start(tmp_path)
    rows = db.jobs()
    assert len(rows) == 100 and {r.state for r in rows} == {"ready"} and {r.queue for r in rows} == {"work"}
    worker = start_worker(db, str(tmp_path / "worker.log"), "--queue", "work")
    try:
        deadline = time.monotonic() + T
        while db.counts().get("done", 0) < 100:
            assert time.monotonic() < deadline, db.counts()
            time.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait(30)
    assert sorted(r.result is not None for r in db.jobs()) == [True] * 100


def _python_start(cwd: Path) -> float:
    """How long starting Python and importing dbexecutor takes here (the machine's share of the budget)."""
    t = time.monotonic()
    subprocess.run([sys.executable, "-c", "import dbexecutor.executor"], env=cli_env(), cwd=cwd, timeout=T, check=True)
    return time.monotonic() - t


def test_shutdown_wait_on_a_submit_only_executor_waits_for_its_jobs(db):
    submitter = db.executor(1, run_jobs=False, queues="later")
    fut = submitter.submit(jobs.identity, 5)
    runner = db.executor(1, queues="later")
    submitter.shutdown(wait=True)
    assert fut.done() and fut.result() == 5
    runner.shutdown()


def test_queues_keep_executors_to_their_own_work_and_groups_limit_across_queues(db):
    store = db.store()
    try:
        now = store.now()
        store.configure_group("g", limit=1)
        store.insert_jobs(
            [NewJob("tests.fa", b"a", (), queue="a", group="g"), NewJob("tests.fb", b"b", (), queue="b", group="g"),
             NewJob("tests.fc", b"c", (), queue="c")],
            now,
        )
        only_a = store.claim("ex-a", 5, 30, now, scope=Scope(("a",)))
        assert [c.fn_name for c in only_a] == ["tests.fa"]
        # b's job is in the same group, whose limit of 1 is reached: not even an executor of b takes it.
        assert store.claim("ex-b", 5, 30, now, scope=Scope(("b",))) == []
        everything = store.claim("ex-all", 5, 30, now, scope=Scope(None))
        assert [c.fn_name for c in everything] == ["tests.fc"]
        skipping = store.claim("ex-c", 5, 30, now, scope=Scope(None, frozenset({"tests.fb"})))
        assert skipping == []
    finally:
        store.close()


def test_after_enough_refusals_a_job_fails_naming_its_function_and_the_hosts(db):
    store = db.store()
    try:
        (row,) = store.insert_jobs([NewJob("missing_module.work", b"x", ())], store.now())
        for n in range(1, 6):
            (claimed,) = store.claim("ex", 1, 30, store.now())
            refusal = Report(
                claimed.job_id, claimed.attempt, False, b"", "refused",
                f"ModuleNotFoundError: No module named 'missing_module' (on host{n})", f"host{n}:1{n}", None,
                store.now(), 1.0, "missing_module.work", True,
            )
            _, done, _ = store.finish_and_claim([refusal], "ex", 0, 30, store.now())
            if n < 5:
                assert done.refused == [row.job_id] and db.row(row.job_id).state == "ready"
        (final,) = done.finals
        assert final.state == "failed"
        job = db.row(row.job_id)
        assert job.retries == 4, "refusals do not use up the job's retries"
        assert "missing_module.work" in job.error and "host1" in job.error and "host5" in job.error
        assert [a.outcome for a in db.attempts(row.job_id)] == ["refused"] * 5
    finally:
        store.close()
    from dbexecutor import serialization

    error = serialization.load_exception(final.result)
    assert isinstance(error, NotRunnable)


def test_a_worker_missing_a_module_leaves_the_job_to_one_that_has_it(db, tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "only_here.py").write_text("def work(x):\n    return x * 10\n")
    sys.path.insert(0, str(lib))
    try:
        import only_here  # noqa: F401 - the submitter can pickle it by name

        submitter = db.executor(1, run_jobs=False, queues="deploy")
        fut = submitter.submit(only_here.work, 4)
        fut.job_id  # noqa: B018 - stored before any worker starts
    finally:
        sys.path.remove(str(lib))
    without = start_worker(db, str(tmp_path / "without.log"), "--queue", "deploy")
    with_it = None
    try:
        deadline = time.monotonic() + T
        while not [a for a in db.attempts(fut.job_id) if a.outcome == "refused"]:
            assert time.monotonic() < deadline, (tmp_path / "without.log").read_text()[-3000:]
            time.sleep(0.1)
        assert db.row(fut.job_id).state in ("ready", "leased")  # not failed: put back
        with_it = start_worker(db, str(tmp_path / "with.log"), "--queue", "deploy", "--path", str(lib))
        assert fut.result(timeout=T) == 40
    finally:
        for proc in (without, with_it):
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    refused = [a for a in db.attempts(fut.job_id) if a.outcome == "refused"]
    assert refused and "only_here" in refused[0].detail
    shown = cli(db, "show", str(fut.job_id))
    assert "refused" in shown.stdout and "only_here" in shown.stdout
    assert " ERROR dbexecutor.jobs" in (tmp_path / "without.log").read_text()
    assert "could not be loaded here" in (tmp_path / "without.log").read_text()


def test_queues_in_status_list_and_the_worker_filter(db, tmp_path):
    ex = db.executor(1, queues=["q1", "q2"])
    assert ex.submit(jobs.identity, 1).result(timeout=T) == 1  # to q1, its first queue
    assert ex.options(queue="q2").submit(jobs.identity, 2).result(timeout=T) == 2
    parked = ex.options(queue="nobody").submit(jobs.identity, 3)
    ex.flush()
    status = json.loads(cli(db, "status", "--json").stdout)
    assert status["queues"]["q1"]["done"] == 1 and status["queues"]["q2"]["done"] == 1
    assert status["queues"]["nobody"]["ready"] == 1
    listed = json.loads(cli(db, "list", "--queue", "nobody", "--json").stdout)
    assert [r["id"] for r in listed] == [parked.job_id] and listed[0]["queue"] == "nobody"
    assert "nobody" in cli(db, "status").stdout
    bad = subprocess.run(
        [sys.executable, "-m", "dbexecutor", "worker", db.url, "--prefix", db.prefix, "--queue", "a,b"],
        capture_output=True, text=True, env=cli_env(), timeout=T,
    )
    assert bad.returncode == 2 and "queue" in bad.stderr
    worker = start_worker(db, str(tmp_path / "nobody.log"), "--queue", "nobody")
    try:
        assert parked.result(timeout=T) == 3
    finally:
        worker.terminate()
        worker.wait(30)


@pytest.mark.parametrize("bad", ["", " x", "a,b", "*x", 3])
def test_queue_names_are_checked(bad):
    from dbexecutor import JobOptions

    with pytest.raises(ValueError):
        JobOptions(queue=bad)

